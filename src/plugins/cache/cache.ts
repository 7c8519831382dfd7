import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger } from 'fastify'
import { runScript } from '../../lua/index.ts'
import { optionChecker, optionKeys } from '../common/options.ts'
import { randomToken } from '../common/random-token.ts'
import { describeValue, isCluster, type RedisClient } from '../common/redis.ts'
import { withTimeout } from '../common/timeout.ts'
import {
  CacheKeyInvalidError,
  CacheLoadTimeoutError,
  CacheTagInvalidError,
  CacheUnavailableError,
  CacheValueNotJsonError,
  tagListError,
  whyNotJson,
} from './errors.ts'
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

/** Tags: a namespace (`products`) or a key-like `<namespace>:<id>` (`user:42`); same alphabet, no braces. */
export const CACHE_TAG = /^[a-z][a-z0-9-]{0,31}(:[A-Za-z0-9_.-]{1,64})?$/

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
  redis: RedisClient
  settings: CacheSettings
  metrics: CacheMetrics
  limiter: ConcurrencyLimiter
  log: FastifyBaseLogger
  l1?: L1Cache
  /** Tells the other instances to drop these keys (or every key of these tags) from their L1. */
  broadcast?: (message: InvalidationMessage) => Promise<unknown>
}

type GetState = 'fresh' | 'early' | 'refresh' | 'stale' | 'load' | 'wait'
/** cache-get.lua's reply; the 4th element, once checked, is what a fill records for the entry's tags. */
type GetReply = [GetState, string, string, string?]
type Arg = string | number
/** A peek: empty when there is nothing fresh to serve, else the payload (and a tagged entry's tags). */
type PeekReply = [payload?: string, recorded?: string]

const NOTHING_FRESH: PeekReply = []

/**
 * A peek's decision on an entry as stored (the format of cache-get.lua), with a plain GET and no
 * script: Redis would run a script's commands through Lua, about 1 µs each, on every cached read.
 * So freshness is judged on this process's clock, not Redis's. An entry judged stale falls back to
 * cache-get.lua, which decides on the Redis clock; one judged fresh is at most the clocks' skew past
 * its soft TTL, and still within its hard TTL. `beta` > 0 applies XFetch's early refresh with `draw`,
 * as cache-get.lua does, so the read that follows chooses the same.
 */
export function peekEntry(raw: string | null, beta: number, draw: number): PeekReply {
  if (raw === null) return NOTHING_FRESH
  let start = 0
  let recorded: string | undefined
  if (raw.charCodeAt(0) === 35 /* # */) {
    const end = raw.indexOf('|', 1)
    recorded = raw.slice(1, end)
    start = end + 1
  }
  const a = raw.indexOf('|', start)
  const b = raw.indexOf('|', a + 1)
  const softAt = a < 0 || b < 0 ? Number.NaN : Number(raw.slice(start, a))
  const now = Date.now()
  // Written so that an unreadable entry (NaN) counts as stale too.
  if (!(now < softAt)) return NOTHING_FRESH
  if (beta > 0 && now - Number(raw.slice(a + 1, b)) * beta * Math.log(draw) >= softAt) return NOTHING_FRESH
  const payload = raw.slice(b + 1)
  return recorded === undefined ? [payload] : [payload, recorded]
}

/**
 * A read-only peek at a key, sent before a route's checks ran (its `config.cache.prefetch`): it
 * takes no lease, creates no generation and counts nothing; `getOrLoad` of the same key, called
 * from that request's handler, takes its answer as its first read.
 */
export interface Prefetch {
  readonly key: string
  /** The peek's answer, or the error its GET failed with (it never rejects). */
  readonly reply: Promise<PeekReply | Error>
  /** The XFetch draw the peek used: the read that follows it uses the same one. */
  readonly draw: number
  /** The L1 epoch when it was sent: a drop since then keeps its answer out of the L1. */
  readonly epoch: number
}

const token = () => randomToken(12)
/** Entries per invalidation script call: a long list must not hold Redis in one script. */
const INVALIDATE_CHUNK = 100

function chunks<T>(list: readonly T[], size: number): T[][] {
  const out: T[][] = []
  for (let i = 0; i < list.length; i += size) out.push(list.slice(i, i + size))
  return out
}
const namespace = (key: string) => {
  const colon = key.indexOf(':')
  return colon < 0 ? key : key.slice(0, colon)
}
const NO_OPTIONS: GetOrLoadOptions = Object.freeze({})
const MAX_TAGS = 16

export function checkKey(key: string): void {
  if (typeof key !== 'string' || !CACHE_KEY.test(key)) throw new CacheKeyInvalidError(key)
}

/** Validated, deduplicated and sorted (a canonical order for the recorded generations); none: undefined. */
export function checkTags(tags: readonly string[]): string[] | undefined {
  if (!Array.isArray(tags) || tags.length > MAX_TAGS) throw tagListError(tags, MAX_TAGS)
  for (const tag of tags)
    if (typeof tag !== 'string' || !CACHE_TAG.test(tag)) throw new CacheTagInvalidError(tag)
  return tags.length ? [...new Set(tags)].sort() : undefined
}

/**
 * Other cache libraries' names for our options (bentocache's mostly), each with ours: a `ttl:`
 * passed here would otherwise leave every entry on the default lifetime without a word.
 */
export const CACHE_OPTION_HINTS = {
  ttl: "bentocache's `ttl` is `ttlMs` here (milliseconds)",
  timeout: "bentocache's `timeout` is `softTimeoutMs` here (milliseconds)",
  hardTimeout: "bentocache's `hardTimeout` is `hardTimeoutMs` here (milliseconds)",
  grace: "bentocache's `grace` is the plugin option `staleWhileRevalidateMs` here (milliseconds)",
  lockTimeout: "bentocache's `lockTimeout` is the plugin option `leaseWaitMs` here (milliseconds)",
  prefix: "bentocache's `prefix` is the plugin option `keyPrefix` here",
}

const callCheck = optionChecker('cache', CACHE_OPTION_HINTS)
const GET_OR_LOAD_OPTIONS = optionKeys<GetOrLoadOptions>({
  ttlMs: true,
  tags: true,
  softTimeoutMs: true,
  hardTimeoutMs: true,
  onLoadError: true,
  admit: true,
})
const SET_OPTIONS = optionKeys<CacheSetOptions>({ ttlMs: true, tags: true })

/** A value for a message: a number as written, anything else described. */
export const shown = (value: unknown) => (typeof value === 'number' ? String(value) : describeValue(value))

function checkInt(name: string, value: number | undefined, min: number): void {
  if (value !== undefined && !(Number.isSafeInteger(value) && value >= min))
    callCheck.fail(`\`${name}\` must be an integer of at least ${min}, got ${shown(value)}`)
}

/** Per-call options, checked only when given. */
function checkCallOptions(options: GetOrLoadOptions, known: readonly string[], method: string): void {
  if (typeof options !== 'object' || options === null || Array.isArray(options))
    callCheck.fail(`${method} options must be an object, got ${describeValue(options)}`)
  callCheck.known(options, known, `${method} options`)
  checkInt('ttlMs', options.ttlMs, 1)
  checkInt('softTimeoutMs', options.softTimeoutMs, 0)
  checkInt('hardTimeoutMs', options.hardTimeoutMs, 0)
  const { onLoadError } = options
  if (onLoadError !== undefined && onLoadError !== 'serve-stale' && onLoadError !== 'fail')
    callCheck.fail(`\`onLoadError\` must be 'serve-stale' or 'fail', got ${describeValue(onLoadError)}`)
  if (options.admit !== undefined && typeof options.admit !== 'function')
    callCheck.fail(`\`admit\` must be a function, got ${describeValue(options.admit)}`)
}

/**
 * A `getOrLoad`'s key and options, checked (the disabled cache checks them too, so a mistake shows
 * with the cache off as with it on); its tags, validated and sorted.
 */
export function checkRead(key: string, options: GetOrLoadOptions = NO_OPTIONS): string[] | undefined {
  checkKey(key)
  if (options === NO_OPTIONS) return undefined
  checkCallOptions(options, GET_OR_LOAD_OPTIONS, 'getOrLoad')
  return options.tags === undefined ? undefined : checkTags(options.tags)
}

/** The tags of "tag=generation,..." (tags and generations never contain ',' or '='). */
const tagsOf = (recorded: string) => recorded.split(',').map((pair) => pair.slice(0, pair.indexOf('=')))

/**
 * `work`, or CacheLoadTimeoutError once `deadline` (epoch ms) has passed; `work` goes on either way,
 * and a failure after the deadline is handed to `late`.
 */
export function withDeadline<T>(
  work: Promise<T>,
  deadline: number,
  key: string,
  timeoutMs: number,
  late: (err: unknown) => void,
  onTimeout?: () => void,
): Promise<T> {
  return withTimeout(
    work,
    Math.max(0, deadline - Date.now()),
    () => {
      onTimeout?.()
      throw new CacheLoadTimeoutError(key, timeoutMs)
    },
    late,
  )
}

/** Redis cache-aside with a fence against stale fills, a cross-instance lease and an optional L1. */
export class RedisCache implements CacheApi {
  readonly enabled = true
  private readonly flights = new Map<string, Promise<unknown>>()
  /** Peeks in flight by key: a request prefetching the same key meanwhile shares the one sent. */
  private readonly peeks = new Map<string, Prefetch>()
  /** The prefetch of the request whose handler is running right now, synchronously (`whilePrefetched`). */
  private prefetched: Prefetch | undefined
  /** The tags of flights that have tags (known at the call, or learned from the entry read). */
  private readonly flightTags = new Map<string, readonly string[]>()
  private readonly redis: RedisClient
  private readonly settings: CacheSettings
  /** Replaced by the metrics plugin's adopted counters once the app is ready. */
  metrics: CacheMetrics
  private readonly generationTtlMs: number
  private readonly retries: InvalidationRetry
  private readonly tagRetries: InvalidationRetry

  constructor(private readonly parts: CacheParts) {
    this.redis = parts.redis
    this.settings = parts.settings
    this.metrics = parts.metrics
    const { ttlMs, jitter, staleWhileRevalidateMs, leaseTtlMs } = parts.settings
    const longestLifetimeMs = Math.ceil(ttlMs * (1 + jitter)) + staleWhileRevalidateMs
    // Outlives any value and any load; its expiry only costs a refused fill, never a stale one.
    this.generationTtlMs = 2 * longestLifetimeMs + leaseTtlMs
    this.retries = new InvalidationRetry((keys) => this.invalidateInRedis(keys), longestLifetimeMs, parts.log)
    this.tagRetries = new InvalidationRetry(
      (tags) => this.invalidateTagsInRedis(tags),
      longestLifetimeMs,
      parts.log,
      'tags',
    )
  }

  private keys(key: string): string[] {
    const base = `${this.settings.keyPrefix}{${key}}`
    return [`${base}:v`, `${base}:g`, `${base}:l`]
  }

  /** A tag's generation, in a slot of its own (the tag is its hash tag). */
  private tagKey(tag: string): string {
    return `${this.settings.keyPrefix}{${tag}}:t`
  }

  /** Commands fail at once while disconnected (no offline queue); skipping them saves the error. */
  private redisUp(): boolean {
    return this.redis.status === 'ready'
  }

  getOrLoad<T>(
    key: string,
    loader: () => Promise<T | null>,
    options: GetOrLoadOptions = NO_OPTIONS,
  ): Promise<T | null> {
    const tags = checkRead(key, options)
    const { l1 } = this.parts
    const local = l1?.get(key)
    if (local) {
      this.metrics.l1Hits.inc({ name: namespace(key) })
      return Promise.resolve(local.value as T | null)
    }
    const existing = this.flights.get(key)
    if (existing) return existing as Promise<T | null>
    // A tagged call checks its tags' generations with its first read: it reads the usual way.
    const prefetched = !tags && this.prefetched?.key === key ? this.prefetched : undefined
    const flight = this.fetch(key, loader, options, tags, prefetched).finally(() => {
      if (this.flights.get(key) === flight) {
        this.flights.delete(key)
        if (this.flightTags.size) this.flightTags.delete(key)
      }
    })
    this.flights.set(key, flight)
    if (tags) this.flightTags.set(key, tags)
    return flight
  }

  /**
   * Starts a read-only peek at `key` for a request that will read it (or shares the one in flight):
   * undefined when the key is malformed, the L1 holds it or the cache Redis is down, and the read
   * then goes its usual way.
   */
  prefetch(key: string): Prefetch | undefined {
    if (typeof key !== 'string' || !CACHE_KEY.test(key) || !this.redisUp() || this.parts.l1?.get(key))
      return undefined
    const pending = this.peeks.get(key)
    if (pending) return pending
    const draw = 1 - Math.random()
    const beta = this.settings.earlyRefreshBeta
    const prefetch: Prefetch = {
      key,
      draw,
      epoch: this.parts.l1?.epoch ?? 0,
      reply: this.redis
        .get(this.keys(key)[0]!)
        .then((raw) => peekEntry(raw, beta, draw))
        .catch((err: unknown) => (err instanceof Error ? err : new Error(String(err))))
        .finally(() => {
          if (this.peeks.get(key) === prefetch) this.peeks.delete(key)
        }),
    }
    this.peeks.set(key, prefetch)
    return prefetch
  }

  /**
   * Runs a route handler with its request's prefetch: a `getOrLoad` of that key made before the
   * handler's first await takes the peek's answer. Synchronous on purpose: no other request's code
   * can run in between, so a prefetch is only ever taken by the request that sent it.
   */
  whilePrefetched<T>(prefetch: Prefetch, run: () => T): T {
    const outer = this.prefetched
    this.prefetched = prefetch
    try {
      return run()
    } finally {
      this.prefetched = outer
    }
  }

  private async fetch<T>(
    key: string,
    loader: () => Promise<T | null>,
    options: GetOrLoadOptions,
    tags: readonly string[] | undefined,
    prefetched: Prefetch | undefined,
  ) {
    const name = namespace(key)
    const keys = this.keys(key)
    const epoch = this.parts.l1?.epoch ?? 0
    const deadline = Date.now() + this.settings.leaseWaitMs
    const hardMs = options.hardTimeoutMs ?? this.settings.hardTimeoutMs
    // Set at the first miss when a hard timeout applies: how long this read may wait for a load.
    let hardAt = 0
    let generation = ''
    // The entry's tags with their current generations, once read: what a fill records.
    let recorded: string | undefined
    let pause = 5
    if (prefetched) {
      const peeked = await prefetched.reply
      if (peeked instanceof Error) return this.readFailed(key, loader, peeked, hardAt, hardMs)
      const [payload, tagged] = peeked
      if (payload !== undefined && tagged === undefined) {
        this.metrics.hits.inc({ name })
        const value = this.settings.deserialize(payload) as T | null
        this.parts.l1?.set(key, value, prefetched.epoch)
        return value
      }
      // Absent, past its soft TTL, due for an early refresh or tagged: cache-get.lua tells which
      // and takes the lease if there is one to take. Only this read, past the route's checks, may.
      if (options.admit && payload === undefined && !(await options.admit())) return null
    } else if (options.admit) {
      const payload = await this.peek(key)
      if (payload !== undefined) return this.settings.deserialize(payload) as T | null
      if (!(await options.admit())) return null
    }
    for (let first = true; ; first = false) {
      const owner = token()
      let reply: GetReply
      try {
        if (!this.redisUp()) throw new CacheUnavailableError(this.redis.status)
        const args: Arg[] = [
          owner,
          this.settings.leaseTtlMs,
          this.settings.earlyRefreshBeta,
          first && prefetched ? prefetched.draw : 1 - Math.random(),
          this.generationTtlMs,
          token(),
        ]
        if (recorded !== undefined) {
          args.push(recorded)
          reply = await runScript<GetReply>(this.redis, 'cacheGet', keys, args)
          reply[3] = recorded
        } else if (tags) {
          reply = await this.readTagged(keys, args, tags)
        } else {
          reply = await runScript<GetReply>(this.redis, 'cacheGet', keys, args)
          // Only an entry with tags answers a 4th element: check its tags' generations.
          if (reply[3] !== undefined) reply = await this.checkRecordedTags(key, keys, args, reply)
        }
      } catch (err) {
        // A script may have taken the lease before a later command of this read failed.
        if (this.redisUp()) void this.release(key, owner)
        return this.readFailed(key, loader, err, hardAt, hardMs)
      }
      const [state, payload] = reply
      generation = reply[2]
      if (reply[3] !== undefined) recorded = reply[3]
      if (state === 'fresh' || state === 'early') {
        this.metrics.hits.inc({ name })
        const value = (await this.decode(key, payload, state === 'early' ? owner : '')) as T | null
        this.parts.l1?.set(key, value, epoch, recorded === undefined ? undefined : tagsOf(recorded))
        if (state === 'early') this.refreshInBackground(key, loader, generation, owner, options, recorded)
        return value
      }
      if (state === 'stale' || state === 'refresh') {
        const stale = (await this.decode(key, payload, state === 'refresh' ? owner : '')) as T | null
        if (state === 'refresh') {
          const softMs = options.softTimeoutMs ?? this.settings.softTimeoutMs
          if (softMs > 0) {
            const refresh = this.fill(key, loader, generation, owner, options, epoch, recorded)
            // A read with a stale copy never fails on a timeout: whichever comes first serves it.
            return this.refreshWithin(
              key,
              refresh,
              stale,
              hardMs > 0 ? Math.min(softMs, hardMs) : softMs,
              options,
            )
          }
          this.refreshInBackground(key, loader, generation, owner, options, recorded)
        }
        this.metrics.staleServed.inc({ name })
        return stale
      }
      if (first) this.metrics.misses.inc({ name })
      if (hardMs > 0 && !hardAt) hardAt = Date.now() + hardMs
      if (state === 'load')
        return this.bounded(
          this.fill(key, loader, generation, owner, options, epoch, recorded),
          key,
          hardAt,
          hardMs,
        )
      if (first) this.metrics.leaseWaits.inc({ name })
      const now = Date.now()
      if (hardAt && now >= hardAt) {
        this.metrics.hardTimeouts.inc({ name })
        throw new CacheLoadTimeoutError(key, hardMs)
      }
      if (now + pause > deadline) break
      await sleep(hardAt ? Math.min(pause, hardAt - now) : pause)
      pause = Math.min(pause * 2, 50)
    }
    // The lease holder is slow or gone and there is no stale value to serve: load here, under the
    // cap, and fill without the lease (the generation still fences it).
    return this.bounded(this.fill(key, loader, generation, '', options, epoch, recorded), key, hardAt, hardMs)
  }

  /** The cache Redis failed a read: the loader answers it, under the cap and the read's hard timeout. */
  private readFailed<T>(
    key: string,
    loader: () => Promise<T | null>,
    err: unknown,
    hardAt: number,
    hardMs: number,
  ): Promise<T | null> {
    const name = namespace(key)
    this.metrics.redisErrors.inc({ name })
    this.parts.log.warn({ err, key }, 'cache read failed; loading from the source')
    const at = hardAt || (hardMs > 0 ? Date.now() + hardMs : 0)
    // Refused as when Redis is up: whether a value can be cached must not depend on an outage.
    const loaded = this.load(name, loader).then((value) => {
      this.encode(key, value)
      return value
    })
    return this.bounded(loaded, key, at, hardMs)
  }

  /**
   * The first read of a tagged call: the entry and its tags' generations at once (one call per tag,
   * each in its own slot, concurrently with cache-get.lua), then reconciled.
   */
  private async readTagged(keys: string[], args: Arg[], tags: readonly string[]): Promise<GetReply> {
    const [reply, current] = await Promise.all([
      runScript<GetReply>(this.redis, 'cacheGet', keys, args),
      this.tagGenerations(tags, 0),
    ])
    return this.reconcile(keys, args, reply, current)
  }

  /** An untagged call met a tagged entry: read its tags' generations (one more round trip) and check them. */
  private async checkRecordedTags(key: string, keys: string[], args: Arg[], reply: GetReply) {
    const tags = tagsOf(reply[3]!)
    // A tag invalidation from now on drops this flight, as it would a tagged call's.
    if (this.flights.has(key)) this.flightTags.set(key, tags)
    return this.reconcile(keys, args, reply, await this.tagGenerations(tags, 0))
  }

  /**
   * An entry counts only if it recorded exactly the current generations of the caller's tags;
   * otherwise it is a miss. The reply's 4th element becomes the generations a fill records.
   */
  private async reconcile(keys: string[], args: Arg[], reply: GetReply, current: string): Promise<GetReply> {
    const [state] = reply
    if (reply[3] === current || state === 'load' || state === 'wait') {
      reply[3] = current
      return reply
    }
    // This caller took the lease to refresh it: it loads the entry anew.
    if (state === 'refresh' || state === 'early') return ['load', '', reply[2], current]
    // Again, telling the script the current generations: it treats the entry as absent, takes the
    // lease or reports it held.
    args.push(current)
    const again = await runScript<GetReply>(this.redis, 'cacheGet', keys, args)
    again[3] = current
    return again
  }

  /**
   * "tag=generation,..." for these tags (sorted), each read (or created) by cache-tags.lua in its
   * own slot. `extendToMs` > 0 also extends each generation's TTL to at least that (before a fill).
   */
  private async tagGenerations(tags: readonly string[], extendToMs: number): Promise<string> {
    const fresh = token()
    const ttl = extendToMs || this.generationTtlMs
    const generations = await Promise.all(
      tags.map((tag) =>
        runScript<string>(this.redis, 'cacheTags', [this.tagKey(tag)], [fresh, ttl, extendToMs ? '1' : '0']),
      ),
    )
    return tags.map((tag, i) => `${tag}=${generations[i]}`).join(',')
  }

  /** `work` bounded by the read's hard deadline (none: `work` itself). */
  private bounded<T>(work: Promise<T>, key: string, hardAt: number, hardMs: number): Promise<T> {
    if (!hardAt) return work
    return withDeadline(
      work,
      hardAt,
      key,
      hardMs,
      (err) => this.parts.log.warn({ err, key }, 'cache load failed after its read timed out'),
      () => this.metrics.hardTimeouts.inc({ name: namespace(key) }),
    )
  }

  /** Waits up to `waitMs` for this read's own refresh, else (or when it throws) serves the stale copy. */
  private refreshWithin<T>(
    key: string,
    refresh: Promise<T | null>,
    stale: T | null,
    waitMs: number,
    options: GetOrLoadOptions,
  ): Promise<T | null> {
    const name = namespace(key)
    const onLoadError = options.onLoadError ?? this.settings.onLoadError
    const withinWait = withTimeout(
      refresh,
      waitMs,
      () => {
        this.metrics.softTimeouts.inc({ name })
        this.metrics.staleServed.inc({ name })
        return stale
      },
      (err) => this.parts.log.warn({ err, key }, 'cache refresh failed; the entry stays until its hard TTL'),
    )
    return withinWait.catch((err: unknown) => {
      if (onLoadError === 'fail') throw err
      this.parts.log.warn({ err, key }, 'cache refresh failed; serving the stale copy')
      this.metrics.staleOnError.inc({ name })
      this.metrics.staleServed.inc({ name })
      return stale
    })
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
    recorded: string | undefined,
  ): Promise<T | null> {
    const name = namespace(key)
    const started = performance.now()
    let value: T | null
    let payload: string
    try {
      value = await this.load(name, loader)
      payload = this.encode(key, value)
    } catch (err) {
      // Released before the caller hears of it, so the next read of the key loads at once.
      if (owner) await this.release(key, owner)
      throw err
    }
    const loadMs = Math.max(1, Math.round(performance.now() - started))
    if (await this.store(key, value, payload, generation, owner, loadMs, options, recorded))
      this.parts.l1?.set(key, value, epoch, recorded === undefined ? undefined : tagsOf(recorded))
    return value
  }

  /** Gives up this caller's lease, if it still holds it; never rejects (an expired lease is gone anyway). */
  private release(key: string, owner: string): Promise<void> {
    return runScript(this.redis, 'cacheRelease', [this.keys(key)[2]!], [owner]).then(
      () => {},
      () => {},
    )
  }

  /**
   * The payload stored for `value`. A value the serializer cannot hold (a BigInt, a cycle,
   * undefined) is refused here, before any fill, rather than logged as a Redis failure and
   * returned uncached: the caller learns at once that this key never caches.
   */
  private encode(key: string, value: unknown): string {
    let payload: unknown
    try {
      payload = this.settings.serialize(value)
    } catch (err) {
      const custom = this.settings.serialize !== JSON.stringify
      throw new CacheValueNotJsonError(
        key,
        custom ? `serialize threw: ${(err as Error)?.message ?? String(err)}` : whyNotJson(value, err),
        { cause: err },
      )
    }
    if (typeof payload === 'string') return payload
    throw new CacheValueNotJsonError(
      key,
      this.settings.serialize === JSON.stringify
        ? whyNotJson(value, undefined)
        : `serialize returned ${describeValue(payload)}, expected a string`,
    )
  }

  /** A stored payload as a value; a read that took the lease (`owner`) gives it up if that fails. */
  private async decode(key: string, payload: string, owner: string): Promise<unknown> {
    try {
      return this.settings.deserialize(payload)
    } catch (err) {
      if (owner) await this.release(key, owner)
      throw err
    }
  }

  /** Soft and hard TTL of a new entry: jittered, and with the stale window unless it is a "not found". */
  private lifetimes(value: unknown, ttlMs: number | undefined): [soft: number, hard: number] {
    const { settings } = this
    const base = value === null ? (ttlMs ?? settings.negativeTtlMs) : (ttlMs ?? settings.ttlMs)
    // Jitter spreads expiries of keys filled together, so they do not all miss at the same moment.
    const soft = Math.round(base * (1 + settings.jitter * Math.random()))
    return [soft, value === null ? soft : soft + settings.staleWhileRevalidateMs]
  }

  /** How long a tag's generation must live once an entry records it: well past that entry. */
  private tagTtl(hard: number): number {
    return Math.max(this.generationTtlMs, 2 * hard + this.settings.leaseTtlMs)
  }

  private async store(
    key: string,
    value: unknown,
    payload: string,
    generation: string,
    owner: string,
    loadMs: number,
    options: GetOrLoadOptions,
    recorded: string | undefined,
  ): Promise<boolean> {
    const { settings } = this
    const [soft, hard] = this.lifetimes(value, value === null ? undefined : options.ttlMs)
    try {
      const args: Arg[] = [
        settings.fence ? generation : '',
        owner,
        soft,
        hard,
        loadMs,
        payload,
        this.generationTtlMs,
      ]
      if (recorded) {
        // The tag fence. The tags' generations live in other slots than the entry, so no script can
        // check them with the fill: read them again now. Changed since the read: refused. An
        // invalidation landing between this check and the fill still wins, because the entry
        // records the generations read before the load and every read compares them.
        if (settings.fence && (await this.tagGenerations(tagsOf(recorded), this.tagTtl(hard))) !== recorded) {
          this.metrics.fenceRejections.inc({ name: namespace(key) })
          if (owner) await this.release(key, owner)
          return false
        }
        args.push(recorded)
      }
      const stored = await runScript<number>(this.redis, 'cacheFill', this.keys(key), args)
      if (stored === 0) this.metrics.fenceRejections.inc({ name: namespace(key) })
      return stored === 1
    } catch (err) {
      this.metrics.redisErrors.inc({ name: namespace(key) })
      this.parts.log.warn({ err, key }, 'cache fill failed')
      if (owner) void this.release(key, owner)
      return false
    }
  }

  private refreshInBackground<T>(
    key: string,
    loader: () => Promise<T | null>,
    generation: string,
    owner: string,
    options: GetOrLoadOptions,
    recorded: string | undefined,
  ): void {
    const epoch = this.parts.l1?.epoch ?? 0
    this.fill(key, loader, generation, owner, options, epoch, recorded).catch((err) =>
      this.parts.log.warn({ err, key }, 'cache refresh failed; the entry stays until its hard TTL'),
    )
  }

  get<T>(key: string): Promise<T | null | undefined> {
    checkKey(key)
    const local = this.parts.l1?.get(key)
    if (local) {
      this.metrics.l1Hits.inc({ name: namespace(key) })
      return Promise.resolve(local.value as T | null)
    }
    return this.peek(key).then((payload) =>
      payload === undefined ? undefined : (this.settings.deserialize(payload) as T),
    )
  }

  has(key: string): Promise<boolean> {
    checkKey(key)
    if (this.parts.l1?.get(key)) {
      this.metrics.l1Hits.inc({ name: namespace(key) })
      return Promise.resolve(true)
    }
    return this.peek(key).then((payload) => payload !== undefined)
  }

  /** The payload of a fresh entry whose tags (if any) still have the generations it recorded. */
  private async peek(key: string): Promise<string | undefined> {
    const name = namespace(key)
    try {
      if (!this.redisUp()) throw new CacheUnavailableError(this.redis.status)
      const [payload, recorded] = peekEntry(await this.redis.get(this.keys(key)[0]!), 0, 1)
      if (
        payload === undefined ||
        (recorded !== undefined && (await this.tagGenerations(tagsOf(recorded), 0)) !== recorded)
      ) {
        this.metrics.misses.inc({ name })
        return undefined
      }
      this.metrics.hits.inc({ name })
      return payload
    } catch (err) {
      this.metrics.redisErrors.inc({ name })
      this.parts.log.warn({ err, key }, 'cache read failed; answered as absent')
      return undefined
    }
  }

  set<T>(key: string, value: T | null, options: CacheSetOptions = NO_OPTIONS): Promise<boolean> {
    checkKey(key)
    if (options !== NO_OPTIONS) checkCallOptions(options, SET_OPTIONS, 'set')
    const tags = options.tags === undefined ? undefined : checkTags(options.tags)
    return this.write(key, this.encode(key, value), value === null, options.ttlMs, tags)
  }

  private async write(
    key: string,
    payload: string,
    notFound: boolean,
    ttlMs: number | undefined,
    tags: readonly string[] | undefined,
  ): Promise<boolean> {
    this.dropLocal([key])
    try {
      if (!this.redisUp()) throw new CacheUnavailableError(this.redis.status)
      const [soft, hard] = this.lifetimes(notFound ? null : payload, ttlMs)
      const recorded = tags ? await this.tagGenerations(tags, this.tagTtl(hard)) : ''
      await runScript(this.redis, 'cacheSet', this.keys(key), [
        token(),
        this.generationTtlMs,
        soft,
        hard,
        payload,
        recorded,
      ])
      await this.parts.broadcast?.([key])
      // A read that joined or started a flight before the write reached Redis must not be shared.
      this.dropLocal([key])
      return true
    } catch (err) {
      this.metrics.invalidationFailures.inc({ name: namespace(key) })
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
    for (const key of keys) {
      this.flights.delete(key)
      // A request arriving from now on sends a peek of its own (one already sent is a read in flight).
      if (this.peeks.size) this.peeks.delete(key)
      if (this.flightTags.size) this.flightTags.delete(key)
    }
    this.parts.l1?.drop(keys)
  }

  /** The same for tags: every flight and L1 entry carrying one of them. */
  dropLocalTags(tags: readonly string[]): void {
    for (const [key, own] of this.flightTags) {
      if (own.some((tag) => tags.includes(tag))) {
        this.flights.delete(key)
        this.flightTags.delete(key)
      }
    }
    this.parts.l1?.dropTags(tags)
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
    if (!this.redisUp()) throw new CacheUnavailableError(this.redis.status)
    // Each entry is a slot of its own on a Cluster; one Redis takes them all in one script call.
    const calls = isCluster(this.redis) ? keys.map((key) => [key]) : chunks(keys, INVALIDATE_CHUNK)
    const generation = token()
    await Promise.all(
      calls.map((entries) =>
        runScript(
          this.redis,
          'cacheInvalidate',
          entries.flatMap((key) => this.keys(key)),
          [generation, this.generationTtlMs],
        ),
      ),
    )
    await this.parts.broadcast?.(keys)
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
      for (const tag of checked) this.metrics.tagInvalidationFailures.inc({ name: namespace(tag) })
      this.parts.log.error(
        { err, tags: checked },
        "cache tag invalidation failed; retried in the background, bounded by the entries' TTL",
      )
      this.tagRetries.add(checked)
      return false
    }
  }

  /** A new random generation per tag: every entry that recorded an older one now reads as a miss. */
  private async invalidateTagsInRedis(tags: readonly string[]): Promise<void> {
    if (!this.redisUp()) throw new CacheUnavailableError(this.redis.status)
    const generation = token()
    await Promise.all(
      tags.map((tag) => this.redis.set(this.tagKey(tag), generation, 'PX', this.generationTtlMs)),
    )
    await this.parts.broadcast?.({ tags })
  }

  close(): void {
    this.retries.close()
    this.tagRetries.close()
  }
}
