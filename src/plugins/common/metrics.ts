import type { FastifyInstance } from 'fastify'
import type { Registry } from 'prom-client'
import { type RedisClient, rawClient } from '../../redis/client.ts'

/** What the metrics plugin decorates `app.metrics` with. */
export interface MetricsApi {
  /** One registry per app, so several apps in one process (tests, benchmarks) never share counters. */
  registry: Registry
  /**
   * Times every command `client` sends, labelled `client=<plugin>` when a plugin sent it (through
   * its view, `sentBy`), else `client=<name>` (the first name given wins).
   */
  observeRedis(client: RedisClient, name: string): void
}

declare module 'fastify' {
  interface FastifyInstance {
    metrics: MetricsApi
  }
}

// One shape for every plugin's metrics: a plugin creates its instruments at registration
// (prom-client metrics with `registers: []`, or TalliedHistograms: in no registry yet) through
// `pluginMetrics`, and counts in them from its first request on; its Redis client is recorded by
// `pluginUsesRedis` (the plugin context does both). When the app becomes ready, the metrics plugin,
// if registered, adopts every instrument of the app into its registry and times every recorded
// client (`appInstruments`). Nothing is swapped after ready: without the metrics plugin the same
// instruments count, and nothing exports them.

/** A metric a registry can hold: prom-client's, or a TalliedHistogram. */
export interface Instrument {
  readonly name: string
}

interface AppInstruments {
  /** Per plugin name, the instruments its first instance created; a second instance shares them. */
  readonly byPlugin: Map<string, Record<string, unknown>>
  readonly clients: Array<{ client: RedisClient; plugin: string }>
}

/** Keyed by the app's server: one per app, whichever encapsulated context a plugin is in. */
const instrumentsByApp = new WeakMap<object, AppInstruments>()

function instrumentsOf(app: FastifyInstance): AppInstruments {
  let found = instrumentsByApp.get(app.server)
  if (!found) {
    found = { byPlugin: new Map(), clients: [] }
    instrumentsByApp.set(app.server, found)
  }
  return found
}

const isInstrument = (value: unknown): value is Instrument =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as { name?: unknown }).name === 'string' &&
  typeof (value as { get?: unknown }).get === 'function'

/**
 * The plugin's instruments in this app: `create()`'s, made by the plugin's first instance (later
 * instances share them, so one series counts for all). Each field that is a metric (has `name` and
 * `get`) is adopted by the metrics plugin at ready; other fields (helpers over them) are kept as is.
 */
export function pluginMetrics<M>(app: FastifyInstance, plugin: string, create: () => M): M {
  const { byPlugin } = instrumentsOf(app)
  let metrics = byPlugin.get(plugin) as M | undefined
  if (!metrics) {
    metrics = create()
    byPlugin.set(plugin, metrics as Record<string, unknown>)
  }
  return metrics
}

/** Records that `plugin` sends commands on `client`: the metrics plugin times them from ready on. */
export function pluginUsesRedis(app: FastifyInstance, client: RedisClient, plugin: string): void {
  instrumentsOf(app).clients.push({ client, plugin })
}

/**
 * What the plugins of `app` created and use (for the metrics plugin, at ready): every instrument,
 * and every plugin's Redis client with the name to label it by (`main` for the redis plugin's).
 */
export function appInstruments(app: FastifyInstance): {
  metrics: Instrument[]
  clients: Array<{ client: RedisClient; name: string }>
} {
  const { byPlugin, clients } = instrumentsOf(app)
  const main = app.hasDecorator('redis') ? app.redis : undefined
  return {
    metrics: [...byPlugin.values()].flatMap((fields) => Object.values(fields).filter(isInstrument)),
    clients: clients.map(({ client, plugin }) => {
      const raw = rawClient(client)
      return { client: raw, name: raw === main ? 'main' : plugin }
    }),
  }
}

/**
 * The registry's metric of this name if one exists (a second instance of a plugin in one app shares
 * it), else `metric`, registered now. The one way a metric of the library enters a registry: every
 * metric is created unregistered (`registers: []`) and adopted here, by the metrics plugin when the app is
 * ready, or at once by a function given a registry (`makeIdempotent`).
 */
export function adoptMetric<T>(registry: Registry, metric: T): T {
  // prom-client's types leave `name` off its metric classes; every instance has it.
  const existing = registry.getSingleMetric((metric as unknown as { name: string }).name)
  if (existing) return existing as unknown as T
  registry.registerMetric(metric as never)
  return metric
}
