import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger } from 'fastify'
import { type RedisClient, runScript } from '../../lua/index.ts'
import type { L1Cache } from './l1.ts'
import type { ConcurrencyLimiter } from './limiter.ts'
import type { CacheMetrics } from './metrics.ts'
import { InvalidationRetry } from './retry.ts'

/**
 * Logical keys are `<namespace>:<id>` with a short, fixed alphabet: they are built by the code
 * from ids it has parsed and bounded, never copied from a request, and they cannot carry a
 * hash-tag brace.
 */
export const CACHE_KEY = /^[a-z][a-z0-9-]{0,31}:[A-Za-z0-9_.-]{1,64}$/

export interface GetOrLoadOptions {
  /** Fresh lifetime for this call (default: the plugin's `ttlMs`). */
  ttlMs?: number
}

/** What routes use; the disabled cache implements it by calling the loader. */
export interface CacheApi {
  /** false when the plugin was registered with `enabled: false` (every read goes to the loader). */
  readonly enabled: boolean
  /** The cached value, else the loader's (stored); a loader's `null` is cached as "not found". */
  getOrLoad<T>(key: string, loader: () => Promise<T | null>, options?: GetOrLoadOptions): Promise<T | null>
  /** Call after the source of truth committed; never throws: false means logged and counted. */
  invalidate(keys: readonly string[]): Promise<boolean>
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
}

export interface CacheParts {
  redis: RedisClient
  settings: CacheSettings
  metrics: CacheMetrics
  limiter: ConcurrencyLimiter
  log: FastifyBaseLogger
  l1?: L1Cache
  /** Tells the other instances to drop these keys from their L1. */
  broadcast?: (keys: readonly string[]) => Promise<unknown>
}

type GetState = 'fresh' | 'early' | 'refresh' | 'stale' | 'load' | 'wait'

const token = () => randomBytes(12).toString('base64url')
const namespace = (key: string) => key.slice(0, key.indexOf(':'))

export function checkKey(key: string): void {
  if (!CACHE_KEY.test(key)) throw new TypeError(`Invalid cache key '${key.slice(0, 80)}'`)
}

/** Redis cache-aside with a fence against stale fills, a cross-instance lease and an optional L1. */
export class RedisCache implements CacheApi {
  readonly enabled = true
  private readonly flights = new Map<string, Promise<unknown>>()
  private readonly redis: RedisClient
  private readonly settings: CacheSettings
  /** Replaced by the metrics plugin's adopted counters once the app is ready. */
  metrics: CacheMetrics
  private readonly generationTtlMs: number
  private readonly retries: InvalidationRetry

  constructor(private readonly parts: CacheParts) {
    this.redis = parts.redis
    this.settings = parts.settings
    this.metrics = parts.metrics
    const { ttlMs, jitter, staleWhileRevalidateMs, leaseTtlMs } = parts.settings
    const longestLifetimeMs = Math.ceil(ttlMs * (1 + jitter)) + staleWhileRevalidateMs
    // Outlives any value and any load; its expiry only costs a refused fill, never a stale one.
    this.generationTtlMs = 2 * longestLifetimeMs + leaseTtlMs
    this.retries = new InvalidationRetry((keys) => this.invalidateInRedis(keys), longestLifetimeMs, parts.log)
  }

  private keys(key: string): string[] {
    const base = `${this.settings.keyPrefix}{${key}}`
    return [`${base}:v`, `${base}:g`, `${base}:l`]
  }

  /** Commands fail at once while disconnected (no offline queue); skipping them saves the error. */
  private redisUp(): boolean {
    return this.redis.status === 'ready'
  }

  getOrLoad<T>(
    key: string,
    loader: () => Promise<T | null>,
    options: GetOrLoadOptions = {},
  ): Promise<T | null> {
    checkKey(key)
    const { l1 } = this.parts
    const local = l1?.get(key)
    if (local) {
      this.metrics.l1Hits.inc({ name: namespace(key) })
      return Promise.resolve(local.value as T | null)
    }
    const existing = this.flights.get(key)
    if (existing) return existing as Promise<T | null>
    const flight = this.fetch(key, loader, options).finally(() => {
      if (this.flights.get(key) === flight) this.flights.delete(key)
    })
    this.flights.set(key, flight)
    return flight
  }

  private async fetch<T>(key: string, loader: () => Promise<T | null>, options: GetOrLoadOptions) {
    const name = namespace(key)
    const keys = this.keys(key)
    const epoch = this.parts.l1?.epoch ?? 0
    const deadline = Date.now() + this.settings.leaseWaitMs
    let generation = ''
    let pause = 5
    for (let first = true; ; first = false) {
      const owner = token()
      let reply: [GetState, string, string]
      try {
        if (!this.redisUp()) throw new Error('cache Redis is not connected')
        reply = await runScript(this.redis, 'cacheGet', keys, [
          owner,
          this.settings.leaseTtlMs,
          this.settings.earlyRefreshBeta,
          1 - Math.random(),
          this.generationTtlMs,
          token(),
        ])
      } catch (err) {
        this.metrics.redisErrors.inc({ name })
        this.parts.log.warn({ err, key }, 'cache read failed; loading from the source')
        return this.load(name, loader)
      }
      const [state, payload] = reply
      generation = reply[2]
      if (state === 'fresh' || state === 'early') {
        this.metrics.hits.inc({ name })
        const value = JSON.parse(payload) as T | null
        this.parts.l1?.set(key, value, epoch)
        if (state === 'early') this.refreshInBackground(key, loader, generation, owner, options)
        return value
      }
      if (state === 'stale' || state === 'refresh') {
        this.metrics.staleServed.inc({ name })
        if (state === 'refresh') this.refreshInBackground(key, loader, generation, owner, options)
        return JSON.parse(payload) as T | null
      }
      if (first) this.metrics.misses.inc({ name })
      if (state === 'load') return this.fill(key, loader, generation, owner, options, epoch)
      if (first) this.metrics.leaseWaits.inc({ name })
      if (Date.now() + pause > deadline) break
      await sleep(pause)
      pause = Math.min(pause * 2, 50)
    }
    // The lease holder is slow or gone and there is no stale value to serve: load here, under the
    // cap, and fill without the lease (the generation still fences it).
    return this.fill(key, loader, generation, '', options, epoch)
  }

  private async load<T>(name: string, loader: () => Promise<T | null>): Promise<T | null> {
    return this.parts.limiter.run(() => {
      this.metrics.loads.inc({ name })
      return loader()
    })
  }

  private async fill<T>(
    key: string,
    loader: () => Promise<T | null>,
    generation: string,
    owner: string,
    options: GetOrLoadOptions,
    epoch: number,
  ): Promise<T | null> {
    const name = namespace(key)
    const started = performance.now()
    let value: T | null
    try {
      value = await this.load(name, loader)
    } catch (err) {
      if (owner) runScript(this.redis, 'cacheRelease', [this.keys(key)[2]!], [owner]).catch(() => {})
      throw err
    }
    const loadMs = Math.max(1, Math.round(performance.now() - started))
    if (await this.store(key, value, generation, owner, loadMs, options))
      this.parts.l1?.set(key, value, epoch)
    return value
  }

  private async store(
    key: string,
    value: unknown,
    generation: string,
    owner: string,
    loadMs: number,
    options: GetOrLoadOptions,
  ): Promise<boolean> {
    const { settings } = this
    const base = value === null ? settings.negativeTtlMs : (options.ttlMs ?? settings.ttlMs)
    // Jitter spreads expiries of keys filled together, so they do not all miss at the same moment.
    const soft = Math.round(base * (1 + settings.jitter * Math.random()))
    const hard = value === null ? soft : soft + settings.staleWhileRevalidateMs
    try {
      const stored = await runScript<number>(this.redis, 'cacheFill', this.keys(key), [
        settings.fence ? generation : '',
        owner,
        soft,
        hard,
        loadMs,
        JSON.stringify(value),
        this.generationTtlMs,
      ])
      if (stored === 0) this.metrics.fenceRejections.inc({ name: namespace(key) })
      return stored === 1
    } catch (err) {
      this.metrics.redisErrors.inc({ name: namespace(key) })
      this.parts.log.warn({ err, key }, 'cache fill failed')
      return false
    }
  }

  private refreshInBackground<T>(
    key: string,
    loader: () => Promise<T | null>,
    generation: string,
    owner: string,
    options: GetOrLoadOptions,
  ): void {
    const epoch = this.parts.l1?.epoch ?? 0
    this.fill(key, loader, generation, owner, options, epoch).catch((err) =>
      this.parts.log.warn({ err, key }, 'cache refresh failed; the entry stays until its hard TTL'),
    )
  }

  /** Local effects of an invalidation made anywhere: later reads here must not see the old value. */
  dropLocal(keys: readonly string[]): void {
    for (const key of keys) this.flights.delete(key)
    this.parts.l1?.drop(keys)
  }

  async invalidate(keys: readonly string[]): Promise<boolean> {
    for (const key of keys) checkKey(key)
    this.dropLocal(keys)
    try {
      await this.invalidateInRedis(keys)
      return true
    } catch (err) {
      for (const key of keys) this.metrics.invalidationFailures.inc({ name: namespace(key) })
      this.parts.log.error(
        { err, keys },
        "cache invalidation failed; retried in the background, bounded by the entries' TTL",
      )
      this.retries.add(keys)
      return false
    }
  }

  private async invalidateInRedis(keys: readonly string[]): Promise<void> {
    if (!this.redisUp()) throw new Error('cache Redis is not connected')
    await Promise.all(
      keys.map((key) =>
        runScript(this.redis, 'cacheInvalidate', this.keys(key), [token(), this.generationTtlMs]),
      ),
    )
    await this.parts.broadcast?.(keys)
  }

  close(): void {
    this.retries.close()
  }
}
