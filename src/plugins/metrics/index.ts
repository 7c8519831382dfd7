import { createHash } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Command } from 'ioredis'
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client'
import type { Database } from '../db/database.ts'
import { type RedisClient, scriptSources } from '../lua/index.ts'
import { type HistogramSeries, TalliedHistogram } from './tallied-histogram.ts'

export interface MetricsPluginOptions {
  /** Serve the registry at this path (default `/metrics`); false to serve nothing. */
  path?: string | false
  /** Include prom-client's process metrics (default true). */
  processMetrics?: boolean
}

export interface GatewayMetrics {
  /** One registry per app, so several apps in one process (tests, benchmarks) never share counters. */
  registry: Registry
  /**
   * Times every command `client` sends, labelled `client=<name>`. The `redis` decorator is observed
   * as `main` when the app starts; plugins with a client of their own (the cache) pass it here.
   */
  observeRedis(client: RedisClient, name: string): void
  /** Statement and transaction latency and pool usage; the `db` decorator is observed at start. */
  observeDatabase(db: Database): void
}

declare module 'fastify' {
  interface FastifyInstance {
    metrics: GatewayMetrics
  }
}

const FAST_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]

/** EVALSHA carries only a digest: name the script it runs, so latency is per script, not one lump. */
const scriptBySha = new Map(
  Object.entries(scriptSources).map(([name, lua]) => [createHash('sha1').update(lua).digest('hex'), name]),
)
const scriptByLua = new Map(Object.entries(scriptSources).map(([name, lua]) => [lua, name]))

function commandLabel(command: Command): string {
  if (command.name === 'evalsha') return `script:${scriptBySha.get(String(command.args[0])) ?? 'unknown'}`
  if (command.name === 'eval') return `script:${scriptByLua.get(String(command.args[0])) ?? 'unknown'}`
  return command.name
}

function errorReason(err: unknown): string {
  const message = (err as Error)?.message ?? ''
  if (/timed out/i.test(message)) return 'timeout'
  if (message.startsWith('NOSCRIPT')) return 'noscript'
  if (/writeable|Connection is closed|ECONN|EPIPE|ETIMEDOUT|MaxRetries|unreachable/i.test(message)) {
    return 'connection'
  }
  return 'reply'
}

type CommandSink = (label: string, seconds: number, error: unknown) => void
const SINKS = Symbol('metricsSinks')
/** Set on a command when it is first sent: a cluster redirect sends it again, timed once. */
const SENT_AT = Symbol('sentAt')
type Observed = RedisClient & { [SINKS]?: Set<CommandSink> }
type TimedCommand = Command & { [SENT_AT]?: number }

/**
 * Wraps the client's sendCommand once (every command, script and pipelined command goes through
 * it); each app observing the client adds a sink, so two apps sharing a client count separately.
 */
function addCommandSink(client: Observed, sink: CommandSink): () => void {
  let sinks = client[SINKS]
  if (!sinks) {
    const own = new Set<CommandSink>()
    sinks = own
    client[SINKS] = own
    const send = client.sendCommand
    const report = (command: TimedCommand, error: unknown) => {
      const seconds = (performance.now() - command[SENT_AT]!) / 1000
      const label = commandLabel(command)
      for (const s of own) s(label, seconds, error)
    }
    client.sendCommand = function (this: RedisClient, command: TimedCommand, ...rest: unknown[]) {
      const result = (send as (...args: unknown[]) => unknown).call(this, command, ...rest)
      if (command[SENT_AT] !== undefined) return result
      command[SENT_AT] = performance.now()
      // A second listener on the command's promise; the caller's own handling is unaffected.
      command.promise?.then(
        () => report(command, undefined),
        (error: unknown) => report(command, error ?? new Error('rejected')),
      )
      return result
    } as typeof client.sendCommand
  }
  sinks.add(sink)
  return () => void sinks.delete(sink)
}

/** First keyword of a statement the code wrote: a small fixed set of label values. */
function statementLabel(sql: string): string {
  const word = /^\s*([A-Za-z]+)/.exec(sql)?.[1]?.toUpperCase() ?? ''
  return ['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'WITH', 'BEGIN', 'COMMIT', 'ROLLBACK'].includes(word)
    ? word
    : 'OTHER'
}

async function metricsPlugin(app: FastifyInstance, options: MetricsPluginOptions) {
  const registry = new Registry()
  const registers = [registry]
  if (options.processMetrics !== false) collectDefaultMetrics({ register: registry })
  const httpDuration = new TalliedHistogram(
    'http_request_duration_seconds',
    'HTTP request duration by method, route and status',
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registry,
  )
  const redisDuration = new TalliedHistogram(
    'redis_command_duration_seconds',
    'Redis command latency seen by the client (send to reply), by client and command; scripts as script:<name>',
    FAST_BUCKETS,
    registry,
  )
  const redisErrors = new Counter({
    name: 'redis_command_errors_total',
    help: 'Redis commands that failed, by client, command and reason (timeout, connection, noscript, reply)',
    labelNames: ['client', 'command', 'reason'] as const,
    registers,
  })
  const dbDuration = new Histogram({
    name: 'db_query_duration_seconds',
    help: 'Postgres statement latency by statement keyword and outcome (ok, error)',
    labelNames: ['statement', 'outcome'] as const,
    buckets: FAST_BUCKETS,
    registers,
  })
  const dbTransactions = new Histogram({
    name: 'db_transaction_duration_seconds',
    help: 'Postgres transaction latency (BEGIN to COMMIT or ROLLBACK) by outcome',
    labelNames: ['outcome'] as const,
    buckets: FAST_BUCKETS,
    registers,
  })
  const observedDatabases = new Set<Database>()
  new Gauge({
    name: 'db_pool_connections',
    help: 'Postgres pool connections by state (active, idle) and the pool maximum (max)',
    labelNames: ['state'] as const,
    registers,
    collect() {
      this.reset()
      for (const db of observedDatabases) {
        const stats = db.poolStats?.()
        if (!stats) continue
        this.inc({ state: 'active' }, stats.total - stats.idle)
        this.inc({ state: 'idle' }, stats.idle)
        this.inc({ state: 'max' }, stats.max)
      }
    },
  })
  new Gauge({
    name: 'db_pool_waiting_requests',
    help: 'Queries waiting for a free Postgres pool connection',
    registers,
    collect() {
      this.set([...observedDatabases].reduce((n, db) => n + (db.poolStats?.().waiting ?? 0), 0))
    },
  })

  const cleanups: Array<() => void> = []
  const observedClients = new WeakSet<RedisClient>()
  const metrics: GatewayMetrics = {
    registry,
    observeRedis(client, name) {
      if (observedClients.has(client)) return
      observedClients.add(client)
      const timers = new Map<string, HistogramSeries>()
      cleanups.push(
        addCommandSink(client, (command, seconds, error) => {
          let timer = timers.get(command)
          if (!timer) {
            timer = redisDuration.series({ client: name, command })
            timers.set(command, timer)
          }
          timer.observe(seconds)
          if (error) redisErrors.inc({ client: name, command, reason: errorReason(error) })
        }),
      )
    },
    observeDatabase(db) {
      if (observedDatabases.has(db)) return
      observedDatabases.add(db)
      cleanups.push(() => observedDatabases.delete(db))
      const remove = db.observe?.({
        query: ({ sql, seconds, error }) =>
          dbDuration.observe({ statement: statementLabel(sql), outcome: error ? 'error' : 'ok' }, seconds),
        transaction: ({ seconds, outcome }) => dbTransactions.observe({ outcome }, seconds),
      })
      if (remove) cleanups.push(remove)
    },
  }
  app.decorate('metrics', metrics)

  // The storage plugins register after this one; their decorators exist once the app is ready.
  app.addHook('onReady', async () => {
    if (app.hasDecorator('redis') && app.redis) metrics.observeRedis(app.redis, 'main')
    if (app.hasDecorator('db') && app.db) metrics.observeDatabase(app.db)
  })
  app.addHook('onClose', async () => {
    for (const cleanup of cleanups.splice(0)) cleanup()
  })

  const httpSeries = new Map<string, HistogramSeries>()
  app.addHook('onResponse', (request, reply, done) => {
    // The route pattern, never the raw URL: client-chosen paths must not create label values.
    const route = request.routeOptions.url ?? 'unmatched'
    const status = String(reply.statusCode)
    const id = `${request.method} ${status} ${route}`
    let series = httpSeries.get(id)
    if (!series) {
      series = httpDuration.series({ method: request.method, route, status })
      httpSeries.set(id, series)
    }
    series.observe(reply.elapsedTime / 1000)
    done()
  })

  const path = options.path ?? '/metrics'
  if (path) {
    app.get(path, { schema: { hide: true } }, async (_request, reply) =>
      reply.type(registry.contentType).send(await registry.metrics()),
    )
  }
}

export default fp(metricsPlugin, { name: 'metrics', fastify: '5.x' })
