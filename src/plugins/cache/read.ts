import { setTimeout as sleep } from 'node:timers/promises'
import { type CacheChannelContext, channels } from '../common/diagnostics.ts'
import { type GetReply, type PeekReply, peekEntry } from './entry.ts'
import { checkReadOptions, NO_OPTIONS, resolveReadOptions } from './entry-options.ts'
import { CacheLoadTimeoutError } from './errors.ts'
import { CACHE_KEY, checkKey, namespaceOf } from './key.ts'
import type { FillTicket, LoaderRunner, Read } from './loader.ts'
import { type EntryStore, type GetAttempt, token } from './store.ts'
import { type CacheTags, tagsOf } from './tags.ts'
import type { CacheParts, GetOrLoadOptions } from './types.ts'

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

/**
 * The two-tier read: the in-process L1 first, then one flight per key in this process, then Redis
 * (cache-get.lua and its lease), the loader running only where Redis says to load.
 */
export class TwoTierRead {
  private readonly flights = new Map<string, Promise<unknown>>()
  /** Peeks in flight by key: a request prefetching the same key meanwhile shares the one sent. */
  private readonly peeks = new Map<string, Prefetch>()
  /** The prefetch of the request whose handler is running right now, synchronously (`whilePrefetched`). */
  private prefetched: Prefetch | undefined
  /** The tags of flights that have tags (known at the call, or learned from the entry read). */
  private readonly flightTags = new Map<string, readonly string[]>()

  constructor(
    private readonly parts: CacheParts,
    private readonly store: EntryStore,
    private readonly tags: CacheTags,
    private readonly loads: LoaderRunner,
  ) {}

  /** The L1's entry for `key`, counted as an L1 hit. */
  private fromL1(key: string): { value: unknown } | undefined {
    const local = this.parts.l1?.get(key)
    if (local) this.parts.metrics.l1Hits.inc({ name: local.name })
    return local
  }

  getOrLoad<T>(
    key: string,
    loader: () => Promise<T | null>,
    options: GetOrLoadOptions = NO_OPTIONS,
  ): Promise<T | null> {
    if (!channels.cache.hasSubscribers) return this.read(key, loader, options, undefined)
    const trace: CacheChannelContext = { name: '', key, usage: null, loaded: false, leaseWait: false }
    return channels.cache.tracePromise(() => this.read(key, loader, options, trace), trace)
  }

  private read<T>(
    key: string,
    loader: () => Promise<T | null>,
    options: GetOrLoadOptions,
    trace: CacheChannelContext | undefined,
  ): Promise<T | null> {
    // Only a checked key is ever stored in the L1: a key it holds is not checked again. The hit
    // is counted once the options passed, so a call that throws counts nothing.
    const local = this.parts.l1?.get(key)
    if (!local) checkKey(key)
    const tags = checkReadOptions(options)
    if (trace) trace.name = namespaceOf(key)
    if (local) {
      this.parts.metrics.l1Hits.inc({ name: local.name })
      if (trace) trace.usage = 'l1'
      return Promise.resolve(local.value as T | null)
    }
    const existing = this.flights.get(key)
    if (existing) {
      if (trace) trace.usage = 'shared'
      return existing as Promise<T | null>
    }
    // A tagged call checks its tags' generations with its first read: it reads the usual way.
    const prefetched = !tags && this.prefetched?.key === key ? this.prefetched : undefined
    const read: Read<T> = {
      key,
      name: namespaceOf(key),
      loader,
      options: resolveReadOptions(this.parts.settings, options, tags),
      epoch: this.parts.l1?.epoch ?? 0,
      hardAt: 0,
      trace,
    }
    const flight = this.fetch(read, prefetched).finally(() => {
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
    if (typeof key !== 'string' || this.parts.l1?.get(key) || !CACHE_KEY.test(key) || !this.store.up())
      return undefined
    const pending = this.peeks.get(key)
    if (pending) return pending
    const draw = 1 - Math.random()
    const beta = this.parts.settings.earlyRefreshBeta
    const prefetch: Prefetch = {
      key,
      draw,
      epoch: this.parts.l1?.epoch ?? 0,
      reply: this.store
        .raw(key)
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

  private async fetch<T>(read: Read<T>, prefetched: Prefetch | undefined): Promise<T | null> {
    const { key, name, options } = read
    const { settings } = this.parts
    const deadline = Date.now() + settings.leaseWaitMs
    let generation = ''
    // The entry's tags with their current generations, once read: what a fill records.
    let recorded: string | undefined
    let pause = 5
    if (prefetched) {
      const peeked = await prefetched.reply
      if (peeked instanceof Error) return this.loads.afterReadFailed(read, peeked)
      const [payload, tagged] = peeked
      if (payload !== undefined && tagged === undefined) {
        this.parts.metrics.hits.inc({ name })
        if (read.trace) read.trace.usage ??= 'hit'
        const value = settings.deserialize(payload) as T | null
        this.parts.l1?.set(key, value, prefetched.epoch)
        return value
      }
      // Absent, past its soft TTL, due for an early refresh or tagged: cache-get.lua tells which
      // and takes the lease if there is one to take. Only this read, past the route's checks, may.
      if (options.admit && payload === undefined && !(await options.admit())) return null
    } else if (options.admit) {
      const payload = await this.peek(key)
      if (payload !== undefined) return settings.deserialize(payload) as T | null
      if (!(await options.admit())) return null
    }
    for (let first = true; ; first = false) {
      const attempt: GetAttempt = {
        owner: token(),
        draw: first && prefetched ? prefetched.draw : 1 - Math.random(),
        newGeneration: token(),
      }
      let reply: GetReply
      try {
        this.store.requireUp()
        reply = await this.readEntry(key, attempt, recorded, options.tags)
      } catch (err) {
        // A script may have taken the lease before a later command of this read failed.
        if (this.store.up()) void this.store.release(key, attempt.owner)
        return this.loads.afterReadFailed(read, err)
      }
      const [state, payload] = reply
      generation = reply[2]
      if (reply[3] !== undefined) recorded = reply[3]
      const ticket: FillTicket = { generation, owner: attempt.owner, recorded }
      if (state === 'fresh' || state === 'early') {
        this.parts.metrics.hits.inc({ name })
        if (read.trace) read.trace.usage ??= 'hit'
        const value = (await this.decode(key, payload, state === 'early' ? attempt.owner : '')) as T | null
        this.parts.l1?.set(key, value, read.epoch, recorded === undefined ? undefined : tagsOf(recorded))
        if (state === 'early') this.loads.refreshInBackground(read, ticket)
        return value
      }
      if (state === 'stale' || state === 'refresh') {
        const stale = (await this.decode(key, payload, state === 'refresh' ? attempt.owner : '')) as T | null
        if (state === 'refresh') {
          // A read with a stale copy never fails on a timeout: whichever comes first serves it.
          if (options.softTimeoutMs > 0)
            return this.loads.refreshWithin(read, this.loads.fill(read, ticket), stale)
          this.loads.refreshInBackground(read, ticket)
        }
        this.parts.metrics.staleServed.inc({ name })
        if (read.trace) read.trace.usage ??= 'stale'
        return stale
      }
      if (first) this.parts.metrics.misses.inc({ name })
      if (read.trace) read.trace.usage ??= 'miss'
      if (options.hardTimeoutMs > 0 && !read.hardAt) read.hardAt = Date.now() + options.hardTimeoutMs
      if (state === 'load') return this.loads.bounded(this.loads.fill(read, ticket), read)
      if (first) this.parts.metrics.leaseWaits.inc({ name })
      if (read.trace) read.trace.leaseWait = true
      const now = Date.now()
      if (read.hardAt && now >= read.hardAt) {
        this.parts.metrics.hardTimeouts.inc({ name })
        throw new CacheLoadTimeoutError(key, options.hardTimeoutMs)
      }
      if (now + pause > deadline) break
      await sleep(read.hardAt ? Math.min(pause, read.hardAt - now) : pause)
      pause = Math.min(pause * 2, 50)
    }
    // The lease holder is slow or gone and there is no stale value to serve: load here, under the
    // cap, and fill without the lease (the generation still fences it).
    return this.loads.bounded(this.loads.fill(read, { generation, owner: '', recorded }), read)
  }

  /**
   * One cache-get.lua read of the entry, its tags' generations checked: against those a previous
   * attempt recorded, against the call's own tags, or (for an entry found tagged) against its own.
   */
  private async readEntry(
    key: string,
    attempt: GetAttempt,
    recorded: string | undefined,
    tags: readonly string[] | undefined,
  ): Promise<GetReply> {
    if (recorded !== undefined) {
      const reply = await this.store.get(key, attempt, recorded)
      reply[3] = recorded
      return reply
    }
    if (tags) return this.tags.readTagged(key, attempt, tags)
    const reply = await this.store.get(key, attempt)
    // Only an entry with tags answers a 4th element: check its tags' generations.
    if (reply[3] === undefined) return reply
    const entryTags = tagsOf(reply[3])
    // A tag invalidation from now on drops this flight, as it would a tagged call's.
    if (this.flights.has(key)) this.flightTags.set(key, entryTags)
    return this.tags.checkRecorded(key, attempt, reply, entryTags)
  }

  /** A stored payload as a value; a read that took the lease (`owner`) gives it up if that fails. */
  private async decode(key: string, payload: string, owner: string): Promise<unknown> {
    try {
      return this.parts.settings.deserialize(payload)
    } catch (err) {
      if (owner) await this.store.release(key, owner)
      throw err
    }
  }

  get<T>(key: string): Promise<T | null | undefined> {
    checkKey(key)
    const local = this.fromL1(key)
    if (local) return Promise.resolve(local.value as T | null)
    return this.peek(key).then((payload) =>
      payload === undefined ? undefined : (this.parts.settings.deserialize(payload) as T),
    )
  }

  has(key: string): Promise<boolean> {
    checkKey(key)
    if (this.fromL1(key)) return Promise.resolve(true)
    return this.peek(key).then((payload) => payload !== undefined)
  }

  /** The payload of a fresh entry whose tags (if any) still have the generations it recorded. */
  private async peek(key: string): Promise<string | undefined> {
    const name = namespaceOf(key)
    try {
      this.store.requireUp()
      const [payload, recorded] = peekEntry(await this.store.raw(key), 0, 1)
      if (
        payload === undefined ||
        (recorded !== undefined && !(await this.tags.stillRecorded(recorded, 0)))
      ) {
        this.parts.metrics.misses.inc({ name })
        return undefined
      }
      this.parts.metrics.hits.inc({ name })
      return payload
    } catch (err) {
      this.parts.metrics.redisErrors.inc({ name })
      this.parts.log.warn({ err, key }, 'cache read failed; answered as absent')
      return undefined
    }
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
}
