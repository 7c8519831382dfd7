import type { Writable } from 'node:stream'
import { type Lifecycle, LifecycleStatus, type RedisClient, type StopOptions } from 'fastify-redis-gateway'
import type { Redis } from 'ioredis'
import { notificationKeys } from './notifier.ts'

/** A notification as published and as replayed from the customer's stream. */
export interface Notification {
  id: string
  event: string
  /** The transfer event it tells of ('' on entries written without one). */
  eventId: string
  data: string
}

/** `a` is after `b` in stream order (`<ms>-<seq>`). */
export function streamIdAfter(a: string, b: string): boolean {
  const [am, as] = a.split('-').map(BigInt) as [bigint, bigint]
  const [bm, bs] = b.split('-').map(BigInt) as [bigint, bigint]
  return am > bm || (am === bm && as > bs)
}

const MAX_ID_PART = 2n ** 64n - 1n

/**
 * A stream id a replay can start after: `<milliseconds>-<sequence>`, each part below 2^64, and not
 * the largest id (nothing comes after it; Redis refuses it as an exclusive start).
 */
export const isStreamId = (id: string) =>
  /^[0-9]{1,20}-[0-9]{1,20}$/.test(id) &&
  id.split('-').every((part) => BigInt(part) <= MAX_ID_PART) &&
  id !== `${MAX_ID_PART}-${MAX_ID_PART}`

type StreamEntries = Array<[string, string[]]>

const toNotifications = (entries: StreamEntries): Notification[] =>
  entries.map(([id, fields]) => {
    const f: Record<string, string> = {}
    for (let i = 0; i + 1 < fields.length; i += 2) f[fields[i]!] = fields[i + 1]!
    return { id, event: f.event ?? '', eventId: f.eventId ?? '', data: f.data ?? '' }
  })

export interface SseClient {
  customerId: number
  sessionId: string
  out: Writable
  /** Live messages that came while the replay ran; null once live. */
  buffer: Notification[] | null
  /** The newest id written, so a buffered or repeated message is never sent twice. */
  lastId: string | null
  /**
   * The notifications written lately, by event and event id (set by the hub): a notification
   * appended again under a new stream id (Redis lost the stream and it was refilled) is not shown twice.
   */
  shown?: Set<string>
  /**
   * Where its stream stood once it was subscribed (set by `open`): what a resync after a Pub/Sub
   * reconnect replays from while nothing was written yet.
   */
  from?: string
  /** Buffering because the Pub/Sub connection dropped: the resync after the reconnect flushes it. */
  resyncing?: boolean
  /** Bytes still queued for the client when it last went live (its replay, bounded by the retention). */
  queuedAtLive?: number
}

/**
 * How many notifications per open stream the repeat check remembers. It is the last line of
 * defence (the notifier's record in Postgres keeps a refill from appending repeats at all), and it
 * is held per open stream: 200 keys are about 16 KB, so 10,000 open streams hold about 160 MB.
 */
const SHOWN_REMEMBERED = 200

/**
 * Records that `client` is shown `n`; false when it already was (same event and event id). The
 * oldest is forgotten beyond SHOWN_REMEMBERED.
 */
function firstShowing(client: SseClient, n: Notification): boolean {
  if (!n.eventId) return true
  const key = `${n.event} ${n.eventId}`
  client.shown ??= new Set()
  if (client.shown.has(key)) return false
  client.shown.add(key)
  if (client.shown.size > SHOWN_REMEMBERED) client.shown.delete(client.shown.values().next().value!)
  return true
}

/**
 * A repeat's place in the stream without its data: a browser shows nothing and takes the id as its
 * Last-Event-ID, so a reconnect does not replay the repeat either.
 */
const position = (n: Notification) => `id: ${n.id}\n\n`

const frame = (n: Notification) => `id: ${n.id}\nevent: ${n.event}\ndata: ${n.data}\n\n`

export interface SseHubOptions {
  redis: RedisClient
  prefix: string
  heartbeatMs: number
  /** True while the session behind a stream is alive (checked every heartbeat). */
  sessionAlive: (sessionIds: string[]) => Promise<boolean[]>
  onError?: (err: unknown) => void
  /** How long opening a stream waits for the subscription (Redis unreachable: it fails). Default 2 s. */
  subscribeTimeoutMs?: number
}

/**
 * Bytes that may wait for a live client that is not reading (beyond what its socket holds and its
 * replay) before its stream is closed: it reconnects with Last-Event-ID and misses nothing.
 */
const MAX_BUFFERED_BYTES = 1024 * 1024

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error('Redis subscription timed out')), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/**
 * The instance's SSE clients and its one Pub/Sub connection: a customer's channel is subscribed
 * while at least one of their streams is open here, and each message goes to all of them. It serves
 * from its creation (the connection opens with the first stream); `stop()` ends every stream.
 */
export class SseHub implements Lifecycle {
  readonly clients = new Map<number, Set<SseClient>>()
  #subscriber: Redis | null = null
  #subscribed = new Map<number, Promise<unknown>>()
  #timer: NodeJS.Timeout | null = null
  /** How many times the Pub/Sub connection dropped: an open that saw one cannot vouch for its live messages. */
  #drops = 0
  readonly #options: SseHubOptions
  readonly #status = new LifecycleStatus()

  constructor(options: SseHubOptions) {
    this.#options = options
    this.#status.state = 'running'
  }

  #onError(err: unknown): void {
    this.#status.failed(err)
    this.#options.onError?.(err)
  }

  async start(): Promise<void> {
    this.#status.state = 'running'
  }

  /** Ends every stream (each client reconnects, to another instance) and closes the connection. */
  stop(options?: StopOptions) {
    return this.#status.stopWithin(this.#shutdown(), options)
  }

  health() {
    return this.#status.health()
  }

  get size(): number {
    let n = 0
    for (const set of this.clients.values()) n += set.size
    return n
  }

  count(customerId: number): number {
    return this.clients.get(customerId)?.size ?? 0
  }

  #connection(): Redis {
    if (this.#subscriber) return this.#subscriber
    const source = this.#options.redis as Redis
    // Subscribe mode holds the connection: one of its own, queueing while (re)connecting; ioredis
    // subscribes the channels again after a reconnect.
    const sub =
      'nodes' in source && typeof (source as { nodes?: unknown }).nodes === 'function'
        ? (source.duplicate as unknown as (...a: unknown[]) => Redis)(undefined, { enableOfflineQueue: true })
        : source.duplicate({
            enableOfflineQueue: true,
            commandTimeout: undefined,
            maxRetriesPerRequest: null,
            // Named, so that CLIENT LIST shows which connection is the instance's SSE subscriber.
            connectionName: `${this.#options.prefix}sse-subscriber`.replace(/\s/g, '_'),
          })
    sub.on('error', (err) => this.#onError(err))
    sub.on('message', (channel: string, message: string) => this.#deliver(channel, message))
    // What is published while the connection is down reaches no one: live clients buffer from the
    // drop until the resync after the reconnect has replayed their streams.
    sub.on('close', () => {
      this.#drops++
      for (const set of this.clients.values())
        for (const client of set)
          if (!client.buffer) {
            client.buffer = []
            client.resyncing = true
          }
    })
    let connectedBefore = false
    sub.on('ready', () => {
      if (connectedBefore) void this.#resync(sub)
      connectedBefore = true
    })
    this.#subscriber = sub
    if (!this.#timer) {
      this.#timer = setInterval(() => void this.#heartbeat(), this.#options.heartbeatMs)
      this.#timer.unref()
    }
    return sub
  }

  #deliver(channel: string, message: string): void {
    const match = /\{([0-9]+)\}$/.exec(channel)
    if (!match) return
    let n: Notification
    try {
      n = JSON.parse(message) as Notification
    } catch {
      return
    }
    for (const client of this.clients.get(Number(match[1])) ?? []) this.send(client, n)
  }

  /** Writes a notification unless the client already has it (or buffers it during the replay). */
  send(client: SseClient, n: Notification): void {
    if (client.buffer) {
      client.buffer.push(n)
      return
    }
    if (client.lastId && !streamIdAfter(n.id, client.lastId)) return
    client.lastId = n.id
    this.#write(client, firstShowing(client, n) ? frame(n) : position(n))
  }

  /**
   * Opens a client: subscribe first (messages buffered), replay the stream after `lastEventId`,
   * then flush the buffer without what the replay already sent: no gap, no duplicate.
   */
  async open(client: SseClient, lastEventId: string | null): Promise<void> {
    const drops = this.#drops
    let set = this.clients.get(client.customerId)
    if (!set) {
      set = new Set()
      this.clients.set(client.customerId, set)
    }
    set.add(client)
    const channel = notificationKeys(this.#options.prefix, client.customerId).channel
    let subscribing = this.#subscribed.get(client.customerId)
    if (!subscribing) {
      subscribing = this.#connection().subscribe(channel)
      this.#subscribed.set(client.customerId, subscribing)
      subscribing.catch(() => this.#subscribed.delete(client.customerId))
    }
    await withTimeout(subscribing, this.#options.subscribeTimeoutMs ?? 2000)
    this.#write(client, ': connected\n\n')
    const { missed, newest } = await this.#replay(client.customerId, lastEventId)
    client.from = newest ?? '0-0'
    if (lastEventId) {
      // An id beyond the stream's newest (made up, or kept from before Redis lost the stream)
      // would hold back every live message until one is newer: such a client starts as a new one,
      // with what arrived since it subscribed (nothing was replayed, so nothing comes twice).
      client.lastId = newest === null || streamIdAfter(lastEventId, newest) ? null : lastEventId
      this.#writeReplay(client, missed)
    }
    // The Pub/Sub connection dropped while this stream opened: what was published meanwhile may
    // have reached neither its buffer nor its replay, and the resync after the reconnect covers
    // only streams already live. It ends, and the client reconnects from its position.
    if (this.#drops !== drops) this.#endForReconnect(client)
    else this.#flush(client)
  }

  /**
   * Ends a stream the hub cannot bring up to date. Its position goes first as an `id:` line without
   * data (a browser takes it as its Last-Event-ID without showing anything), so the reconnect
   * replays from there even when nothing was sent on this stream yet.
   */
  #endForReconnect(client: SseClient): void {
    const position = client.lastId ?? client.from
    if (position) this.#write(client, `id: ${position}\n\n`)
    this.close(client)
  }

  #writeReplay(client: SseClient, missed: Notification[]): void {
    for (const n of missed) {
      this.#write(client, firstShowing(client, n) ? frame(n) : position(n))
      client.lastId = n.id
    }
  }

  /** Ends a client's buffering: what came meanwhile goes out, without what it already has. */
  #flush(client: SseClient): void {
    const buffered = client.buffer ?? []
    client.buffer = null
    client.queuedAtLive = client.out.writableLength
    client.resyncing = false
    for (const n of buffered) this.send(client, n)
  }

  /**
   * After the Pub/Sub connection came back: subscribes the channels again and waits for the reply
   * (ioredis sends its own SUBSCRIBE after 'ready', so this one's reply says they are active),
   * then sends each client that buffered since the drop what its stream got after the last id it
   * has (or after where it stood when it opened), then what it buffered. A client that cannot be
   * resynced is closed: it reconnects with Last-Event-ID.
   */
  async #resync(sub: Redis): Promise<void> {
    const customers = [...this.clients.keys()]
    const resyncing = () =>
      [...this.clients.values()].flatMap((set) => [...set]).filter((client) => client.resyncing)
    try {
      if (customers.length > 0)
        await sub.subscribe(...customers.map((id) => notificationKeys(this.#options.prefix, id).channel))
    } catch (err) {
      this.#onError(err)
      for (const client of resyncing()) this.#endForReconnect(client)
      return
    }
    for (const client of resyncing()) {
      try {
        this.#writeReplay(client, await this.#after(client.customerId, client.lastId ?? client.from ?? '0-0'))
        this.#flush(client)
      } catch (err) {
        this.#onError(err)
        this.#endForReconnect(client)
      }
    }
  }

  /** The notifications on a customer's stream after `id` (XRANGE with an exclusive start). */
  async #after(customerId: number, id: string): Promise<Notification[]> {
    const key = notificationKeys(this.#options.prefix, customerId).stream
    return toNotifications((await this.#options.redis.xrange(key, `(${id}`, '+')) as StreamEntries)
  }

  /**
   * The notifications after `id` and the stream's newest id (null: empty), read together (MULTI),
   * so that the newest id is the one the replay saw.
   */
  async #replay(
    customerId: number,
    id: string | null,
  ): Promise<{ missed: Notification[]; newest: string | null }> {
    const key = notificationKeys(this.#options.prefix, customerId).stream
    // Without an id there is nothing to replay: an empty range (from after the newest possible id).
    const replies = (await this.#options.redis
      .multi()
      .xrange(key, id ? `(${id}` : '+', '+')
      .xrevrange(key, '+', '-', 'COUNT', 1)
      .exec()) as [[Error | null, StreamEntries], [Error | null, StreamEntries]] | null
    if (!replies) throw new Error('the replay transaction was aborted')
    const [[afterErr, after], [newestErr, newest]] = replies
    if (afterErr || newestErr) throw afterErr ?? newestErr
    return { missed: id ? toNotifications(after) : [], newest: newest[0]?.[0] ?? null }
  }

  /**
   * Writes unless the client is gone (a disconnect can land while a replay is being read). A live
   * client that stops reading would hold every notification and heartbeat in memory: once
   * MAX_BUFFERED_BYTES more than its replay wait for it, its stream is dropped (destroyed, not
   * ended after the backlog) and it reconnects with Last-Event-ID. A replay (bounded by the
   * stream's retention) is written whole, before the stream is handed to the response.
   */
  #write(client: SseClient, text: string): void {
    const { out } = client
    if (out.writableEnded || out.destroyed) return
    out.write(text)
    if (client.buffer !== null) return
    if (out.writableLength <= (client.queuedAtLive ?? 0) + MAX_BUFFERED_BYTES) return
    this.#onError(
      new Error(`notification stream of customer ${client.customerId} closed: its client is not reading`),
    )
    out.destroy()
    this.close(client)
  }

  close(client: SseClient): void {
    const set = this.clients.get(client.customerId)
    if (!set?.delete(client)) return
    if (!client.out.writableEnded && !client.out.destroyed) client.out.end()
    if (set.size > 0) return
    this.clients.delete(client.customerId)
    this.#subscribed.delete(client.customerId)
    const channel = notificationKeys(this.#options.prefix, client.customerId).channel
    this.#subscriber?.unsubscribe(channel).catch(() => {})
  }

  /** Ends every stream of these sessions (logout in this process). */
  closeSession(sessionId: string): void {
    for (const set of [...this.clients.values()])
      for (const client of [...set]) if (client.sessionId === sessionId) this.close(client)
  }

  async #heartbeat(): Promise<void> {
    const all = [...this.clients.values()].flatMap((set) => [...set])
    if (all.length === 0) return
    // Not into a stream being opened (its replay comes first); on through a Pub/Sub outage.
    for (const client of all) if (!client.buffer || client.resyncing) this.#write(client, ': heartbeat\n\n')
    try {
      const alive = await this.#options.sessionAlive(all.map((c) => c.sessionId))
      all.forEach((client, i) => {
        if (alive[i] === false) this.close(client)
      })
    } catch (err) {
      this.#onError(err)
    }
  }

  async #shutdown(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer)
    this.#timer = null
    // The instance is going away: the client reconnects (to another instance) with Last-Event-ID.
    for (const set of [...this.clients.values()])
      for (const client of [...set]) {
        this.#write(client, ': shutting down, reconnect\n\n')
        this.close(client)
      }
    const sub = this.#subscriber
    this.#subscriber = null
    if (sub) await sub.quit().catch(() => sub.disconnect())
  }
}
