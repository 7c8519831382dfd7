import { describeValue } from '../../redis/client.ts'
import { scriptReloads } from '../../redis/scripts.ts'
import { encodeValue, lifetimes } from './entry.ts'
import { checkSet, type EntryOptions, NO_OPTIONS, resolveSetOptions } from './entry-options.ts'
import { CacheKeyInvalidError } from './errors.ts'
import { checkKey, checkTags, namespaceOf } from './key.ts'
import { LoaderRunner } from './loader.ts'
import { type Prefetch, TwoTierRead } from './read.ts'
import { InvalidationRetry } from './retry.ts'
import { EntryStore } from './store.ts'
import { CacheTags } from './tags.ts'
import type { CacheApi, CacheParts, CacheSetOptions, GetOrLoadOptions } from './types.ts'

// The cache's modules, by responsibility: types.ts (the API and settings), key.ts (keys and tags
// as written), entry-options.ts (a call's options, checked and resolved), entry.ts (an entry as
// stored), store.ts (the entries in Redis), tags.ts (tag generations), read.ts (the two-tier read),
// loader.ts (running loaders and filling). This module puts them together; it is what index.ts
// and the tests import.
export { peekEntry } from './entry.ts'
export { CACHE_OPTION_HINTS, checkRead } from './entry-options.ts'
export { CACHE_KEY, CACHE_TAG, checkKey, checkTags } from './key.ts'
export { withDeadline } from './loader.ts'
export type { Prefetch } from './read.ts'
export type {
  CacheApi,
  CacheLoadErrorMode,
  CacheParts,
  CacheSetOptions,
  CacheSettings,
  GetOrLoadOptions,
  InvalidationMessage,
  LoadTimeouts,
} from './types.ts'

/** Redis cache-aside with a fence against stale fills, a cross-instance lease and an optional L1. */
export class RedisCache implements CacheApi {
  readonly enabled = true
  /** The parts given, shared by the modules. */
  private readonly parts: CacheParts
  private readonly store: EntryStore
  private readonly tags: CacheTags
  private readonly reads: TwoTierRead
  private readonly retries: InvalidationRetry
  private readonly tagRetries: InvalidationRetry

  constructor(parts: CacheParts) {
    this.parts = parts
    const { ttlMs, jitter, staleWhileRevalidateMs, leaseTtlMs } = parts.settings
    const longestLifetimeMs = Math.ceil(ttlMs * (1 + jitter)) + staleWhileRevalidateMs
    // Outlives any value and any load; its expiry only costs a refused fill, never a stale one.
    this.store = new EntryStore(parts.redis, parts.settings, 2 * longestLifetimeMs + leaseTtlMs)
    this.tags = new CacheTags(this.store, parts.settings)
    const loads = new LoaderRunner(this.parts, this.store, this.tags)
    this.reads = new TwoTierRead(this.parts, this.store, this.tags, loads)
    this.retries = new InvalidationRetry((keys) => this.invalidateInRedis(keys), longestLifetimeMs, parts.log)
    this.tagRetries = new InvalidationRetry(
      (tags) => this.invalidateTagsInRedis(tags),
      longestLifetimeMs,
      parts.log,
      'tags',
    )
  }

  getOrLoad<T>(key: string, loader: () => Promise<T | null>, options?: GetOrLoadOptions): Promise<T | null> {
    return this.reads.getOrLoad(key, loader, options)
  }

  /**
   * Starts a read-only peek at `key` for a request that will read it (or shares the one in flight):
   * undefined when the key is malformed, the L1 holds it or the cache Redis is down.
   */
  prefetch(key: string): Prefetch | undefined {
    return this.reads.prefetch(key)
  }

  /** Runs a route handler with its request's prefetch (see `TwoTierRead.whilePrefetched`). */
  whilePrefetched<T>(prefetch: Prefetch, run: () => T): T {
    return this.reads.whilePrefetched(prefetch, run)
  }

  get<T>(key: string): Promise<T | null | undefined> {
    return this.reads.get<T>(key)
  }

  has(key: string): Promise<boolean> {
    return this.reads.has(key)
  }

  set<T>(key: string, value: T | null, options: CacheSetOptions = NO_OPTIONS): Promise<boolean> {
    const tags = checkSet(key, options)
    const { settings } = this.parts
    return this.write(
      key,
      encodeValue(settings, key, value),
      value === null,
      resolveSetOptions(settings, options, tags),
    )
  }

  private async write(
    key: string,
    payload: string,
    notFound: boolean,
    entry: EntryOptions,
  ): Promise<boolean> {
    this.dropLocal([key])
    try {
      this.store.requireUp()
      const [softMs, hardMs] = lifetimes(this.parts.settings, entry, notFound)
      const recorded = entry.tags ? await this.tags.generations(entry.tags, this.tags.ttlFor(hardMs)) : ''
      await this.store.set(key, { softMs, hardMs, payload, recorded })
      await this.parts.broadcast?.([key])
      // A read that joined or started a flight before the write reached Redis must not be shared.
      this.dropLocal([key])
      return true
    } catch (err) {
      this.parts.metrics.invalidationFailures.inc({ name: namespaceOf(key) })
      this.parts.log.error(
        { err, key },
        "cache set failed; the key is invalidated in the background, bounded by the entries' TTL",
      )
      this.retries.add([key])
      return false
    }
  }

  delete(key: string): Promise<boolean> {
    checkKey(key)
    return this.invalidate([key])
  }

  /** Local effects of an invalidation made anywhere: later reads here must not see the old value. */
  dropLocal(keys: readonly string[]): void {
    this.reads.dropLocal(keys)
  }

  /** The same for tags: every flight and L1 entry carrying one of them. */
  dropLocalTags(tags: readonly string[]): void {
    this.reads.dropLocalTags(tags)
  }

  async invalidate(keys: readonly string[]): Promise<boolean> {
    // A lone key string would otherwise be checked character by character.
    if (!Array.isArray(keys))
      throw new CacheKeyInvalidError(
        keys,
        `cache: \`invalidate\` takes an array of keys, got ${describeValue(keys)}; for one key: \`delete(key)\``,
      )
    for (const key of keys) checkKey(key)
    this.dropLocal(keys)
    try {
      await this.invalidateInRedis(keys)
      // A read that began after the first drop but reached Redis before the invalidation (a peek
      // sent while a script Redis had lost is sent again) may have put the old value in the L1.
      this.dropLocal(keys)
      return true
    } catch (err) {
      for (const key of keys) this.parts.metrics.invalidationFailures.inc({ name: namespaceOf(key) })
      this.parts.log.error(
        { err, keys },
        "cache invalidation failed; retried in the background, bounded by the entries' TTL",
      )
      this.retries.add(keys)
      return false
    }
  }

  private async invalidateInRedis(keys: readonly string[]): Promise<void> {
    this.store.requireUp()
    const { broadcast, broadcastInOrder } = this.parts
    if (!broadcast || !broadcastInOrder) {
      await this.store.invalidate(keys)
      await broadcast?.(keys)
      return
    }
    // Sent behind the invalidation on one connection: run after it, in the same round trip. But a
    // script Redis no longer had (after a restart) is sent again, after the PUBLISH ran: then a
    // second one reaches an instance that refilled its L1 from the old entry in between.
    const reloaded = scriptReloads()
    await Promise.all([this.store.invalidate(keys), broadcast(keys)])
    if (scriptReloads() !== reloaded) await broadcast(keys)
  }

  async invalidateTags(tags: readonly string[]): Promise<boolean> {
    const checked = checkTags(tags)
    if (!checked) return true
    this.dropLocalTags(checked)
    try {
      await this.invalidateTagsInRedis(checked)
      // Flights started between the first drop and the new generations may have read the old ones.
      this.dropLocalTags(checked)
      return true
    } catch (err) {
      for (const tag of checked) this.parts.metrics.tagInvalidationFailures.inc({ name: namespaceOf(tag) })
      this.parts.log.error(
        { err, tags: checked },
        "cache tag invalidation failed; retried in the background, bounded by the entries' TTL",
      )
      this.tagRetries.add(checked)
      return false
    }
  }

  private async invalidateTagsInRedis(tags: readonly string[]): Promise<void> {
    this.store.requireUp()
    await this.tags.invalidate(tags)
    await this.parts.broadcast?.({ tags })
  }

  close(): void {
    this.retries.close()
    this.tagRetries.close()
  }
}
