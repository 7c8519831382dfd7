import type { FastifyInstance, FastifyReply, FastifyRequest, FastifySchema } from 'fastify'
import fp from 'fastify-plugin'
import type { Command } from 'ioredis'
import { Counter, collectDefaultMetrics, Registry } from 'prom-client'
import { type RedisClient, rawClient, SENT_BY } from '../../redis/client.ts'
import { beforeEachCommand } from '../../redis/command-bounds.ts'
import { scriptNameOf } from '../../redis/scripts.ts'
import { adoptMetric, appInstruments, type MetricsApi } from '../common/metrics.ts'
import { bridgeOpenTelemetry, exemplarOf } from '../common/otel.ts'
import { type HistogramSeries, TalliedHistogram } from '../common/tallied-histogram.ts'
import { acceptsOpenMetrics, OPENMETRICS_CONTENT_TYPE, openMetrics } from './openmetrics.ts'
import { METRICS_OPTIONS, type MetricsNames, type MetricsPluginOptions } from './options.ts'

export type { MetricsApi, MetricsPluginOptions }

const FAST_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]

/** A script by its name, so latency is per script, not one lump. */
function commandLabel(command: Command): string {
  if (command.name !== 'evalsha' && command.name !== 'eval') return command.name
  return `script:${scriptNameOf(command.name, command.args) ?? 'unknown'}`
}

/** A NOSCRIPT reply: the server did not have the script yet, and its caller sends it with EVAL. */
const isNoScript = (err: unknown) => ((err as Error)?.message ?? '').startsWith('NOSCRIPT')

function errorReason(err: unknown): string {
  const message = (err as Error)?.message ?? ''
  if (/timed out/i.test(message)) return 'timeout'
  if (/writeable|Connection is closed|ECONN|EPIPE|ETIMEDOUT|MaxRetries|unreachable/i.test(message)) {
    return 'connection'
  }
  return 'reply'
}

/** A command's label, its latency, its error if any, the plugin that sent it if one did, and the command. */
type CommandSink = (
  label: string,
  seconds: number,
  error: unknown,
  sender: string | undefined,
  command: TimedCommand,
) => void
const SINKS = Symbol('metricsSinks')
/** Set on a command when it is first sent: a cluster redirect sends it again, timed once. */
const SENT_AT = Symbol('sentAt')
/** The trace the command was sent in, when OpenTelemetry traces it: the latency's exemplar. */
const EXEMPLAR = Symbol('exemplar')
type Observed = RedisClient & { [SINKS]?: Set<CommandSink> }
type TimedCommand = Command & {
  [SENT_AT]?: number
  [SENT_BY]?: string
  [EXEMPLAR]?: Record<string, string> | undefined
}

/**
 * Hooks into the client's commands once (every command, script and pipelined command); each app
 * observing the client adds a sink, so two apps sharing a client count separately.
 */
function addCommandSink(client: Observed, sink: CommandSink): () => void {
  let sinks = client[SINKS]
  if (!sinks) {
    const own = new Set<CommandSink>()
    sinks = own
    client[SINKS] = own
    const report = (command: TimedCommand, error: unknown) => {
      const seconds = (performance.now() - command[SENT_AT]!) / 1000
      const label = commandLabel(command)
      for (const s of own) s(label, seconds, error, command[SENT_BY], command)
    }
    beforeEachCommand(client, (command: TimedCommand) => {
      if (command[SENT_AT] !== undefined) return
      command[SENT_AT] = performance.now()
      command[EXEMPLAR] = exemplarOf()
      // A second listener on the command's promise; the caller's own handling is unaffected.
      command.promise?.then(
        () => report(command, undefined),
        (error: unknown) => report(command, error ?? new Error('rejected')),
      )
    })
  }
  sinks.add(sink)
  return () => void sinks.delete(sink)
}

/** The OpenTelemetry semantic conventions' buckets (advised for `http.server.request.duration`). */
const HTTP_SERVER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]
/** ... and for `db.client.operation.duration`. */
const DB_CLIENT_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10]

/**
 * The registry's own instruments: HTTP and Redis command latency under the names `names` asks for
 * (null: not kept), command errors, script reloads.
 */
function createInstruments(registry: Registry, names: MetricsNames) {
  const prometheus = names !== 'opentelemetry'
  const opentelemetry = names !== 'prometheus'
  const histogram = (keep: boolean, name: string, help: string, buckets: number[]) =>
    keep ? adoptMetric(registry, new TalliedHistogram(name, help, buckets)) : null
  return {
    httpDuration: histogram(
      prometheus,
      'http_request_duration_seconds',
      'HTTP request duration by method, route and status',
      [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    ),
    httpServerDuration: histogram(
      opentelemetry,
      'http_server_request_duration_seconds',
      'http.server.request.duration: duration of HTTP server requests (OpenTelemetry semantic conventions)',
      HTTP_SERVER_BUCKETS,
    ),
    redisDuration: histogram(
      prometheus,
      'redis_command_duration_seconds',
      'Redis command latency seen by the client (send to reply), by client and command; scripts as script:<name>',
      FAST_BUCKETS,
    ),
    dbClientDuration: histogram(
      opentelemetry,
      'db_client_operation_duration_seconds',
      'db.client.operation.duration: duration of Redis commands, send to reply (OpenTelemetry semantic conventions)',
      DB_CLIENT_BUCKETS,
    ),
    redisErrors: adoptMetric(
      registry,
      new Counter({
        name: 'redis_command_errors_total',
        help: 'Redis commands that failed, by client, command and reason (timeout, connection, reply)',
        labelNames: ['client', 'command', 'reason'] as const,
        registers: [],
      }),
    ),
    scriptReloads: adoptMetric(
      registry,
      new Counter({
        name: 'redis_script_reloads_total',
        help: 'EVALSHA answered NOSCRIPT (first use on a server, a restart, SCRIPT FLUSH, a failover) and sent again as EVAL, by client and script',
        labelNames: ['client', 'command'] as const,
        registers: [],
      }),
    ),
  }
}

type Instruments = ReturnType<typeof createInstruments>

/**
 * `observeRedis`: times every command of a client, once per client, labelled by the plugin that
 * sent it (else `name`). `cleanups` removes every sink when the app closes.
 */
function redisObserver(instruments: Instruments, cleanups: Array<() => void>): MetricsApi['observeRedis'] {
  const { redisDuration, dbClientDuration, redisErrors, scriptReloads } = instruments
  const observedClients = new WeakSet<RedisClient>()
  return (observed, name) => {
    const client = rawClient(observed)
    if (observedClients.has(client)) return
    observedClients.add(client)
    // Per sender, then per command: the series looked up once each.
    const timers = new Map<string, Map<string, HistogramSeries>>()
    const dbTimers = new Map<string, HistogramSeries>()
    cleanups.push(
      addCommandSink(client, (command, seconds, error, sender = name, sent) => {
        if (redisDuration) {
          let bySender = timers.get(sender)
          if (!bySender) {
            bySender = new Map()
            timers.set(sender, bySender)
          }
          let timer = bySender.get(command)
          if (!timer) {
            timer = redisDuration.series({ client: sender, command })
            bySender.set(command, timer)
          }
          observe(timer, seconds, sent[EXEMPLAR])
        }
        if (dbClientDuration) {
          const errorType = error ? (isNoScript(error) ? 'noscript' : errorReason(error)) : ''
          const id = `${sent.name} ${command} ${errorType}`
          let timer = dbTimers.get(id)
          if (!timer) {
            timer = dbClientDuration.series(dbClientLabels(sent.name, command, errorType))
            dbTimers.set(id, timer)
          }
          observe(timer, seconds, sent[EXEMPLAR])
        }
        if (!error) return
        // Not a failure: the caller sends the script again with EVAL, which is timed on its own.
        if (isNoScript(error)) scriptReloads.inc({ client: sender, command })
        else redisErrors.inc({ client: sender, command, reason: errorReason(error) })
      }),
    )
  }
}

/** `db.client.operation.duration`'s attributes for a Redis command (scripts by their file's name). */
function dbClientLabels(command: string, label: string, errorType: string): Record<string, string> {
  return {
    db_system_name: 'redis',
    db_operation_name: command.toUpperCase(),
    ...(label.startsWith('script:') ? { db_stored_procedure_name: label.slice('script:'.length) } : {}),
    ...(errorType ? { error_type: errorType } : {}),
  }
}

/** An observation, with its trace as the bucket's exemplar when OpenTelemetry traces the request. */
function observe(series: HistogramSeries, seconds: number, exemplar: Record<string, string> | undefined) {
  if (exemplar) series.observeWithExemplar(seconds, exemplar)
  else series.observe(seconds)
}

/** `outer`'s map for `key`, empty the first time. */
function inner<K, IK, V>(outer: Map<K, Map<IK, V>>, key: K): Map<IK, V> {
  let found = outer.get(key)
  if (!found) {
    found = new Map()
    outer.set(key, found)
  }
  return found
}

/** A response's two histograms' series, for one route, status, method and scheme. */
interface ResponseSeries {
  http: HistogramSeries | undefined
  server: HistogramSeries | undefined
}

/** Times every response by its route pattern, never the raw URL: client-chosen paths must not create label values. */
function timeResponses(app: FastifyInstance, instruments: Instruments): void {
  const { httpDuration, httpServerDuration } = instruments
  // Found by route, status, method and scheme in turn: each is a string Fastify or Node keeps (its
  // hash already known) or a number, so a response builds no id string and hashes nothing new.
  const byRoute = new Map<string, Map<number, Map<string, Map<string, ResponseSeries>>>>()
  const seriesOf = (request: FastifyRequest, reply: FastifyReply, url: string | undefined) => {
    const route = url ?? 'unmatched'
    const { statusCode } = reply
    const { method, protocol: scheme } = request
    const byStatus = inner(byRoute, route)
    const byMethod = inner(byStatus, statusCode)
    const byScheme = inner(byMethod, method)
    const found = byScheme.get(scheme)
    if (found) return found
    const status = String(statusCode)
    const series: ResponseSeries = {
      http: httpDuration?.series({ method, route, status }),
      server: httpServerDuration?.series({
        http_request_method: method,
        // A 404 matched no route: the attribute is left off, as the conventions ask.
        ...(url ? { http_route: route } : {}),
        http_response_status_code: status,
        url_scheme: scheme,
        ...(statusCode >= 500 ? { error_type: status } : {}),
      }),
    }
    byScheme.set(scheme, series)
    return series
  }
  app.addHook('onResponse', function metrics(request, reply, done) {
    // Read once: Fastify builds the whole routeOptions object at each read.
    const { http, server } = seriesOf(request, reply, request.routeOptions.url)
    const seconds = reply.elapsedTime / 1000
    const exemplar = exemplarOf(request)
    if (http) observe(http, seconds, exemplar)
    if (server) observe(server, seconds, exemplar)
    done()
  })
}

/** Serves the registry at `path`, outside any rate limit and any OpenAPI document. */
function serveRegistry(app: FastifyInstance, path: string, registry: Registry): void {
  // `hide` keeps the route out of an OpenAPI document (@fastify/swagger); Fastify itself ignores it.
  const schema = { hide: true } as FastifySchema
  // Never limited by the rate-limit plugin's global policies, whichever is registered first: a
  // scraper behind a shared address must not be refused (config is untyped here: the metrics
  // plugin does not depend on the rate-limit plugin).
  const config = { rateLimits: false } as object
  app.get(path, { schema, config }, async (request, reply) =>
    // Prometheus asks for OpenMetrics first: the only format that carries exemplars.
    acceptsOpenMetrics(request.headers.accept)
      ? reply.type(OPENMETRICS_CONTENT_TYPE).send(await openMetrics(registry))
      : reply.type(registry.contentType).send(await registry.metrics()),
  )
}

async function metricsPlugin(app: FastifyInstance, options: MetricsPluginOptions) {
  const settings = METRICS_OPTIONS.read(options)
  const registry = new Registry()
  if (settings.processMetrics) collectDefaultMetrics({ register: registry })
  const instruments = createInstruments(registry, settings.names)
  const cleanups: Array<() => void> = []
  const metrics: MetricsApi = { registry, observeRedis: redisObserver(instruments, cleanups) }
  app.decorate('metrics', metrics)

  // The other plugins may register after this one: their instruments and clients, and the redis
  // plugin's decorator, are all known once the app is ready.
  app.addHook('onReady', async () => {
    // Exemplars name the trace of each observation when an OpenTelemetry SDK is registered.
    await bridgeOpenTelemetry()
    const { metrics: adopted, clients } = appInstruments(app)
    for (const instrument of adopted) adoptMetric(registry, instrument)
    for (const { client, name } of clients) metrics.observeRedis(client, name)
    if (app.hasDecorator('redis') && app.redis) metrics.observeRedis(app.redis, 'main')
  })
  app.addHook('onClose', async () => {
    for (const cleanup of cleanups.splice(0)) cleanup()
  })
  timeResponses(app, instruments)
  if (settings.path) serveRegistry(app, settings.path, registry)
}

export default fp(metricsPlugin, { name: 'fastify-redis-gateway/metrics', fastify: '5.x' })
