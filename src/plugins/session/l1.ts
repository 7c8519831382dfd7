import { randomBytes } from 'node:crypto'
import type { Redis } from 'ioredis'
import { isCluster, type RedisClient, rawClient } from '../../redis/client.ts'
import { SubscriberHeartbeat } from '../common/heartbeat.ts'
import type { Touch } from './touches.ts'

// The per-instance L1 of loaded sessions, and the Pub/Sub channel that keeps it honest. Every store
// (with an L1 or not) publishes the ids of the sessions it changes or ends on `<keyPrefix>invalidate`
// before its caller answers; every L1 drops those ids when the message arrives. An L1 serves only
// while its subscription is live: from a drop of the connection until it is subscribed again (when
// it is cleared, since messages were lost meanwhile) every load goes to Redis.
//
// A message is `<origin> <id> <id> ...`: the publishing store's origin, then the session ids (ids
// are base64url, never a space). A store skips its own messages: it dropped the ids itself, before
// and after its write, so its own echo would only drop what it loaded since, which is current.

/** The L1's bounds: how many sessions it holds, and how long one is served from it after its load. */
export interface L1Settings {
  readonly maxEntries: number
  readonly ttlMs: number
}

/** What the L1 counts (the plugin's instruments; a store of its own counts nothing). */
export interface L1Counters {
  hit(): void
  miss(): void
  invalidated(count: number): void
}

/** A session's hash as HGETALL answered it. */
export type SessionFields = Readonly<Record<string, string>>

/** A session as HGETALL answered it, and when (on the store's clock) it was read. */
interface Entry {
  readonly fields: SessionFields
  readonly loadedAt: number
}

/** A load in flight: an invalidation of its id (or a clear) while it waits makes its answer unfit to keep. */
export interface PendingLoad {
  readonly id: string
  stale: boolean
}

/** The channel every store of a key prefix publishes invalidations on. */
export const invalidationChannel = (keyPrefix: string) => `${keyPrefix}invalidate`

const NO_COUNTERS: L1Counters = { hit() {}, miss() {}, invalidated() {} }

export class SessionL1 {
  readonly settings: L1Settings
  readonly #channel: string
  readonly #counters: L1Counters
  /** Oldest load first: the first key is the one to evict. */
  readonly #entries = new Map<string, Entry>()
  readonly #pending = new Map<string, Set<PendingLoad>>()
  #subscriber: Redis | null = null
  /** This L1's store's origin in the messages it publishes. */
  readonly origin: string
  /** Subscribed on the current connection. */
  #live = false
  readonly #heartbeat: SubscriberHeartbeat
  /** Bumped at every drop of the connection: a SUBSCRIBE answered on an older one says nothing now. */
  #connection = 0
  #closed = false
  #waiters: Array<() => void> = []

  constructor(redis: RedisClient, keyPrefix: string, settings: L1Settings, counters = NO_COUNTERS) {
    this.settings = settings
    this.#channel = invalidationChannel(keyPrefix)
    this.#counters = counters
    this.origin = newOrigin()
    // A channel that answers late delivers late: the L1 serves only while a PING on it is answered
    // within an interval, which also finds a connection that died in silence.
    this.#heartbeat = new SubscriberHeartbeat(settings.ttlMs, {
      live: () => this.#subscriber !== null && this.#live,
      ping: () => this.#subscriber!.ping(),
      late: () => this.clear(),
      onTime: () => {
        this.clear()
        this.#wake()
      },
    })
    const source = rawClient(redis)
    if (!isCluster(source)) this.#attach(source, keyPrefix)
    else {
      // On a Cluster, a plain connection to one of its masters: a PUBLISH reaches every node's
      // subscribers, and a drop of this one connection is what takes the L1 down (a Cluster
      // client's own subscriber moves between nodes without saying so). Until the Cluster knows
      // its nodes, the L1 is bypassed.
      const attach = () => {
        const node = source.nodes('master')[0]
        if (node && !this.#subscriber && !this.#closed) this.#attach(node, keyPrefix)
      }
      attach()
      if (!this.#subscriber) source.once('ready', attach)
    }
  }

  /** Opens the subscriber on `node`'s address: a connection of its own (subscribe mode holds it). */
  #attach(node: Redis, keyPrefix: string): void {
    // Retrying for ever: while it is down the L1 is only bypassed. Named, so that CLIENT LIST
    // shows which connection it is.
    const sub = node.duplicate({
      lazyConnect: false,
      enableOfflineQueue: true,
      commandTimeout: undefined,
      maxRetriesPerRequest: null,
      connectionName: `${keyPrefix}session-l1`.replace(/[^\x21-\x7e]/g, '_'),
    })
    sub.on('error', () => {}) // The 'close' that follows takes the L1 down; the command client reports the outage.
    sub.on('message', (_channel: string, message: string) => this.#receive(message))
    sub.on('close', () => this.#down())
    sub.on('end', () => this.#down())
    sub.on('ready', () => void this.#subscribe(sub))
    this.#subscriber = sub
  }

  async #subscribe(sub: Redis): Promise<void> {
    const connection = this.#connection
    try {
      await sub.subscribe(this.#channel)
    } catch {
      return // The connection dropped meanwhile: its next 'ready' subscribes again.
    }
    if (connection !== this.#connection || this.#closed) return
    // What was published while the connection was down reached nobody here.
    this.clear()
    this.#live = true
    this.#wake()
  }

  #wake(): void {
    if (this.subscribed) for (const wake of this.#waiters.splice(0)) wake()
  }

  #down(): void {
    this.#connection++
    this.#live = false
    this.#heartbeat.dropped()
    this.clear()
  }

  #receive(message: string): void {
    const [origin, ...ids] = message.split(' ')
    if (origin === this.origin) return
    for (const id of ids) this.drop(id)
    this.#counters.invalidated(ids.length)
  }

  /** True while invalidations reach this L1: only then does it serve or keep anything. */
  get subscribed(): boolean {
    return this.#live && !this.#heartbeat.late
  }

  get size(): number {
    return this.#entries.size
  }

  /** True when the L1 holds the session (fresh or not). */
  holds(id: string): boolean {
    return this.#entries.has(id)
  }

  /** The fields loaded less than `ttlMs` ago, while subscribed; undefined otherwise (a miss, counted). */
  get(id: string, now: number): SessionFields | undefined {
    const entry = this.subscribed ? this.#entries.get(id) : undefined
    if (entry === undefined || now - entry.loadedAt >= this.settings.ttlMs) {
      if (entry) this.#entries.delete(id)
      this.#counters.miss()
      return undefined
    }
    this.#counters.hit()
    return entry.fields
  }

  /**
   * The fields to answer a presented session with at `now`, given this process's last slide of it:
   * undefined (and dropped) past that slide's idle expiry or the session's absolute end.
   */
  answerable(id: string, now: number, last: Touch | undefined): SessionFields | undefined {
    if (last === undefined || now >= last.at + last.idle) this.drop(id)
    const fields = this.get(id, now)
    if (fields === undefined || now < Number(fields._absoluteExpiresAt)) return fields
    this.drop(id)
    return undefined
  }

  /** Called before reading a session from Redis: what `keep` needs to know whether the answer is still current. */
  begin(id: string): PendingLoad {
    const load = { id, stale: !this.subscribed }
    let loads = this.#pending.get(id)
    if (!loads) {
      loads = new Set()
      this.#pending.set(id, loads)
    }
    loads.add(load)
    return load
  }

  /** Ends a load; keeps its answer unless its id was invalidated (or the L1 went down) while it was read. */
  end(load: PendingLoad, fields: Record<string, string> | null, loadedAt: number): void {
    const loads = this.#pending.get(load.id)
    loads?.delete(load)
    if (loads?.size === 0) this.#pending.delete(load.id)
    if (fields === null || load.stale || !this.subscribed) return
    this.#entries.delete(load.id)
    if (this.#entries.size >= this.settings.maxEntries)
      this.#entries.delete(this.#entries.keys().next().value!)
    this.#entries.set(load.id, { fields, loadedAt })
  }

  /** Forgets a session here (and marks its loads in flight stale). */
  drop(id: string): void {
    this.#entries.delete(id)
    for (const load of this.#pending.get(id) ?? []) load.stale = true
  }

  /** Forgets every session here. */
  clear(): void {
    this.#entries.clear()
    for (const loads of this.#pending.values()) for (const load of loads) load.stale = true
  }

  /** Resolves once subscribed (at once when it is). */
  whenSubscribed(): Promise<void> {
    if (this.subscribed) return Promise.resolve()
    return new Promise((resolve) => this.#waiters.push(resolve))
  }

  /**
   * Resolves once every invalidation published before the call has been applied here: a PING on the
   * subscriber's connection is answered after the messages Redis queued on it before.
   */
  async settled(): Promise<void> {
    await this.#subscriber?.ping()
  }

  /** @internal The subscriber's connection, for tests that take it down. */
  get connection(): Redis {
    if (!this.#subscriber) throw new Error('the L1 has no subscriber connection yet')
    return this.#subscriber
  }

  /** Closes the subscriber; the L1 serves nothing after. */
  close(): void {
    this.#closed = true
    this.#heartbeat.stop()
    this.#down()
    this.#subscriber?.disconnect()
    for (const wake of this.#waiters.splice(0)) wake()
  }
}

/** A store's origin in its messages: 64 random bits (base64url), never a session id's length. */
export const newOrigin = () => randomBytes(8).toString('base64url')

/** Publishes that these sessions changed or ended: every L1 of the key prefix but the origin's drops them. */
export function publishInvalidation(
  redis: RedisClient,
  keyPrefix: string,
  origin: string,
  ids: readonly string[],
) {
  return redis.publish(invalidationChannel(keyPrefix), `${origin} ${ids.join(' ')}`)
}
