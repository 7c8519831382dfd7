import { randomBytes } from 'node:crypto'
import { hostname } from 'node:os'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { closeWith, type RedisClient, type StreamConsumer } from 'fastify-redis-gateway'
import { Gauge, type Registry } from 'prom-client'
import type { EventWorkers } from '../config.ts'
import { createPgDatabase, type Database } from '../db/database.ts'
import { createNotifier, NOTIFIER_GROUP } from './notifier.ts'
import { createOutboxRelay, type OutboxRelay } from './outbox-relay.ts'
import { SseHub } from './sse-hub.ts'

export interface EventsPluginOptions {
  /** Prepended to every key and channel (the gateway's key prefix). */
  prefix: string
  /** The database identity the keys are under, and the prefix before it: the relay checks it on each pass. */
  database?: { basePrefix: string; identity: string }
  /** Which of the relay and the notifier run in this process. */
  workers: Pick<EventWorkers, 'relay' | 'notifier'>
  relayIntervalMs: number
  streamRetention: number
  /** Approximate dead letters kept on `events:transfers:dead`. */
  deadLetterRetention: number
  notificationsRetention: number
  /** How long a customer's notification stream lives after its latest notification. */
  notificationsTtlMs: number
  /** How long the notifier remembers an event id per customer. */
  notificationsDedupMs: number
  sseHeartbeatMs: number
  sseMaxStreamsPerCustomer: number
  /**
   * Postgres URL for a connection of the relay's own. Without it the relay borrows from the
   * request path's pool: under load its transactions, each held across a Redis round trip, then
   * break up the batching of the transfers around them (measured at about half their throughput).
   */
  relayDatabaseUrl?: string
  /** Consumer tuning (tests shorten the visibility timeout). */
  visibilityTimeoutMs?: number
  maxDeliveries?: number
}

export interface EventsApi {
  /** The stream every transfer event goes to. */
  stream: string
  deadLetterStream: string
  relay: OutboxRelay
  /** Null when the notifier runs elsewhere (EVENT_WORKERS, or tests that did not ask for it). */
  notifier: StreamConsumer | null
  hub: SseHub
  maxStreamsPerCustomer: number
  /**
   * Adds a consumer group of the transfer events to those whose pending entries and lag are
   * reported (`events_group_entries`): each module that consumes the events registers its own.
   */
  reportGroup(group: string): void
  /**
   * A transfer with its outbox event committed in this process: the relay runs a pass soon (wake-ups
   * close together share one). Relays elsewhere find the event at their next timed pass.
   */
  transferCommitted(): void
  /**
   * A session ended in this process (logout): its notification streams here end at once. Other
   * instances end theirs at their next heartbeat.
   */
  sessionEnded(sessionId: string): void
}

declare module 'fastify' {
  interface FastifyInstance {
    events: EventsApi
  }
}

function observeEvents(
  registry: Registry,
  db: Database,
  redis: RedisClient,
  api: EventsApi,
  reportedGroups: ReadonlySet<string>,
): void {
  const registers = [registry]
  new Gauge({
    name: 'outbox_backlog',
    help: 'Outbox events committed and not yet relayed to the stream',
    registers,
    async collect() {
      const [row] = await db.query<{ n: string }>('SELECT count(*)::text AS n FROM outbox_events')
      this.set(Number(row?.n ?? 0))
    },
  })
  new Gauge({
    name: 'outbox_oldest_unrelayed_age_seconds',
    help: 'Age of the oldest outbox event not yet relayed (0: none)',
    registers,
    async collect() {
      const [row] = await db.query<{ age: number | null }>(
        `SELECT extract(epoch FROM now() - min(occurred_at))::float8 AS age
         FROM outbox_events`,
      )
      this.set(Math.max(0, Number(row?.age ?? 0)))
    },
  })
  new Gauge({
    name: 'events_stream_length',
    help: 'Entries in the transfer events stream (stream) and its dead-letter stream (dead_letter)',
    labelNames: ['stream'] as const,
    registers,
    async collect() {
      this.set({ stream: 'stream' }, await redis.xlen(api.stream).catch(() => 0))
      this.set({ stream: 'dead_letter' }, await redis.xlen(api.deadLetterStream).catch(() => 0))
    },
  })
  new Gauge({
    name: 'events_group_entries',
    help: 'Per consumer group: entries delivered and not acknowledged (pending), entries not yet delivered (lag)',
    labelNames: ['group', 'state'] as const,
    registers,
    async collect() {
      this.reset()
      // XINFO on a stream that does not exist yet is an error reply (counted as a Redis error): ask first.
      if (!(await redis.exists(api.stream).catch(() => 0))) return
      const groups = (await redis.xinfo('GROUPS', api.stream).catch(() => [])) as unknown[][]
      for (const info of groups) {
        const fields = new Map<string, unknown>()
        for (let i = 0; i + 1 < info.length; i += 2) fields.set(String(info[i]), info[i + 1])
        const group = String(fields.get('name'))
        if (!reportedGroups.has(group)) continue
        this.set({ group, state: 'pending' }, Number(fields.get('pending') ?? 0))
        const lag = fields.get('lag')
        if (lag !== null && lag !== undefined) this.set({ group, state: 'lag' }, Number(lag))
      }
    },
  })
  new Gauge({
    name: 'sse_clients',
    help: 'Open notification streams (GET /notifications) on this instance',
    registers,
    collect() {
      this.set(api.hub.size)
    },
  })
}

/**
 * Transfer events (docs/demo/events.md): the outbox relay and the notifier consumer (as `workers` says),
 * and the SSE hub behind GET /notifications. Decorates `app.events`.
 */
async function eventsPlugin(app: FastifyInstance, options: EventsPluginOptions): Promise<void> {
  const { prefix } = options
  const stream = `${prefix}events:transfers`
  const deadLetterStream = `${stream}:dead`
  const redis = app.redis
  const onError = (err: unknown) => app.log.warn({ err }, 'transfer events')
  const relayDb =
    options.workers.relay && options.relayDatabaseUrl
      ? createPgDatabase({ connectionString: options.relayDatabaseUrl, max: 1 })
      : null
  const relay = createOutboxRelay({
    db: relayDb ?? app.db,
    redis,
    stream,
    retention: options.streamRetention,
    intervalMs: options.relayIntervalMs,
    database: options.database,
    onError,
  })
  const notifier = options.workers.notifier
    ? createNotifier({
        db: app.db,
        refillReach: options.streamRetention,
        redis,
        prefix,
        stream,
        consumer: `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`,
        retention: options.notificationsRetention,
        dedupTtlMs: options.notificationsDedupMs,
        streamTtlMs: options.notificationsTtlMs,
        visibilityTimeoutMs: options.visibilityTimeoutMs,
        maxDeliveries: options.maxDeliveries,
        deadLetterMaxLen: options.deadLetterRetention,
        onError,
      })
    : null
  const hub = new SseHub({
    redis,
    prefix,
    heartbeatMs: options.sseHeartbeatMs,
    // EXISTS does not touch the session: an open stream does not keep it alive. One command per
    // session, not one pipeline: on a Redis Cluster their keys sit in different slots, and a
    // pipeline across slots fails whole. A session Redis cannot answer for counts as alive.
    sessionAlive: (ids) =>
      Promise.all(
        ids.map((id) =>
          redis.exists(app.sessions.sessionKey(id)).then(
            (n) => n === 1,
            () => true,
          ),
        ),
      ),
    onError,
  })
  const reportedGroups = new Set([NOTIFIER_GROUP])
  const api: EventsApi = {
    stream,
    deadLetterStream,
    relay,
    notifier,
    hub,
    maxStreamsPerCustomer: options.sseMaxStreamsPerCustomer,
    reportGroup: (group) => void reportedGroups.add(group),
    transferCommitted: () => relay.wake(),
    sessionEnded: (sessionId) => hub.closeSession(sessionId),
  }
  app.decorate('events', api)

  app.addHook('onReady', async () => {
    if (app.hasDecorator('metrics')) observeEvents(app.metrics.registry, app.db, redis, api, reportedGroups)
  })
  // Closed in reverse order: the relay's connection after the relay.
  if (relayDb) app.addHook('onClose', async () => await relayDb.close())
  closeWith(app, relay, { name: 'outbox relay', start: options.workers.relay })
  if (notifier) closeWith(app, notifier, { name: 'notifier', start: true })
  // Before the server closes: open streams would hold it up.
  closeWith(app, hub, { name: 'notification streams', hook: 'preClose' })
}

export default fp(eventsPlugin, { name: 'transfer-events' })
