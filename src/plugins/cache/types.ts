import type { FastifyBaseLogger } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'
import type { L1Cache } from './l1.ts'
import type { ConcurrencyLimiter } from './limiter.ts'
import type { CacheMetrics } from './metrics.ts'

/** What a read does when its loader throws while a stale copy exists: serve it, or fail. */
export type CacheLoadErrorMode = 'serve-stale' | 'fail'

/** Loader timeouts and error handling; per call, each overrides the plugin-wide option. */
export interface LoadTimeouts {
  /**
   * With a stale copy (past the soft TTL, within `staleWhileRevalidateMs`) and this read refreshing
   * it: wait this long for the refresh, then serve the stale copy while the load goes on and fills.
   * 0 serves the stale copy at once (default).
   */
  softTimeoutMs?: number
  /**
   * With no stale copy: a read that has waited this long for a load (its own or another
   * instance's) rejects with `CacheLoadTimeoutError`; the load goes on and still fills. 0: none (default).
   */
  hardTimeoutMs?: number
  /** A refresh this read waits for throws: serve the stale copy (default) or reject with the error. */
  onLoadError?: CacheLoadErrorMode
}

export interface GetOrLoadOptions extends LoadTimeouts {
  /** Fresh lifetime for this call (default: the plugin's `ttlMs`). */
  ttlMs?: number
  /**
   * Asked when nothing fresh is cached, before anything is written for the key: false answers
   * `null` without a lease, a generation, an entry or a load. For a filter of the keys that can
   * exist (a Bloom filter of ids), so that reads of ids that do not exist leave no key per id. A
   * call that has no prefetch peeks first (one more round trip on a hit).
   */
  admit?: () => Promise<boolean>
  /** Tags of the entry this call fills: `invalidateTags` with any of them drops it, on every instance. */
  tags?: readonly string[]
}

export interface CacheSetOptions {
  /** Fresh lifetime (default: the plugin's `ttlMs`; `negativeTtlMs` for `null`). */
  ttlMs?: number
  tags?: readonly string[]
}

/** What routes use; the disabled cache implements it by calling the loader. */
export interface CacheApi {
  /** false when the plugin was registered with `enabled: false` (every read goes to the loader). */
  readonly enabled: boolean
  /** The cached value, else the loader's (stored); a loader's `null` is cached as "not found". */
  getOrLoad<T>(key: string, loader: () => Promise<T | null>, options?: GetOrLoadOptions): Promise<T | null>
  /** The fresh cached value; `null` is a cached "not found", `undefined` no fresh entry. Never loads. */
  get<T>(key: string): Promise<T | null | undefined>
  /** Whether a fresh entry exists (a cached "not found" included). */
  has(key: string): Promise<boolean>
  /**
   * Stores a value (after the source of truth committed it): like an invalidation it fences off
   * fills loaded before, then writes. Never throws: false means logged, counted and invalidated
   * in the background instead.
   */
  set<T>(key: string, value: T | null, options?: CacheSetOptions): Promise<boolean>
  /** Invalidates one key: `invalidate([key])`. */
  delete(key: string): Promise<boolean>
  /** Call after the source of truth committed; never throws: false means logged and counted. */
  invalidate(keys: readonly string[]): Promise<boolean>
  /** Invalidates every entry carrying any of these tags, on every instance; never throws like `invalidate`. */
  invalidateTags(tags: readonly string[]): Promise<boolean>
}

export interface CacheSettings {
  keyPrefix: string
  ttlMs: number
  jitter: number
  staleWhileRevalidateMs: number
  earlyRefreshBeta: number
  negativeTtlMs: number
  leaseTtlMs: number
  leaseWaitMs: number
  fence: boolean
  softTimeoutMs: number
  hardTimeoutMs: number
  onLoadError: CacheLoadErrorMode
  /** A value as stored in Redis (default JSON.stringify); called before a fill takes its path. */
  serialize: (value: unknown) => string
  /** A stored payload back to a value (default JSON.parse), on every read from Redis. */
  deserialize: (payload: string) => unknown
}

/** Told to the other instances: keys, or tags, to drop from their L1 and flights. */
export type InvalidationMessage = readonly string[] | { readonly tags: readonly string[] }

export interface CacheParts {
  readonly redis: RedisClient
  readonly settings: CacheSettings
  readonly metrics: CacheMetrics
  readonly limiter: ConcurrencyLimiter
  readonly log: FastifyBaseLogger
  readonly l1?: L1Cache
  /** Tells the other instances to drop these keys (or every key of these tags) from their L1. */
  readonly broadcast?: (message: InvalidationMessage) => Promise<unknown>
  /**
   * The broadcast travels on the connection of the invalidation (one Redis, not a Cluster): Redis
   * runs it after the invalidation sent before it, so both go in one round trip.
   */
  readonly broadcastInOrder?: boolean
}
