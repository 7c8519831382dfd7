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

/**
 * Runs `register` with the metrics plugin's API once the app is ready, if the metrics plugin is
 * registered: before or after the calling plugin, either order works. Until then (and without the
 * metrics plugin) a plugin counts in metrics that nothing exports.
 */
export function whenMetricsReady(app: FastifyInstance, register: (metrics: MetricsApi) => void): void {
  app.addHook('onReady', async () => {
    if (app.hasDecorator('metrics')) register(app.metrics)
  })
}

/**
 * Observes a plugin's Redis client (the client behind its view): as `main` when it is the redis
 * plugin's, else under the plugin's name. The plugin's own commands are labelled by the plugin either way.
 */
export function observePluginRedis(
  app: FastifyInstance,
  metrics: MetricsApi,
  client: RedisClient,
  plugin: string,
) {
  const raw = rawClient(client)
  metrics.observeRedis(raw, app.hasDecorator('redis') && app.redis === raw ? 'main' : plugin)
}

/**
 * The registry's metric of this name if one exists (a second instance of a plugin in one app shares
 * it), else `metric`, registered now. The one way a metric of the library enters a registry: every
 * metric is created unregistered (`registers: []`) and adopted here, by its plugin once the metrics
 * plugin is ready (`whenMetricsReady`) or by the metrics plugin itself.
 */
export function adoptMetric<T>(registry: Registry, metric: T): T {
  // prom-client's types leave `name` off its metric classes; every instance has it.
  const existing = registry.getSingleMetric((metric as unknown as { name: string }).name)
  if (existing) return existing as unknown as T
  registry.registerMetric(metric as never)
  return metric
}
