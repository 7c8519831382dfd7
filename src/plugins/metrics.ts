import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { collectDefaultMetrics, Histogram, Registry } from 'prom-client'

export interface MetricsPluginOptions {
  /** Serve the registry at this path (default `/metrics`); false to serve nothing. */
  path?: string | false
  /** Include prom-client's process metrics (default true). */
  processMetrics?: boolean
}

declare module 'fastify' {
  interface FastifyInstance {
    /** One registry per app, so several apps in one process (tests, benchmarks) never share counters. */
    metrics: { registry: Registry }
  }
}

async function metricsPlugin(app: FastifyInstance, options: MetricsPluginOptions) {
  const registry = new Registry()
  if (options.processMetrics !== false) collectDefaultMetrics({ register: registry })
  const httpDuration = new Histogram({
    name: 'http_request_duration_seconds',
    help: 'HTTP request duration by method, route and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  })
  app.decorate('metrics', { registry })

  app.addHook('onResponse', async (request, reply) => {
    // The route pattern, never the raw URL: client-chosen paths must not create label values.
    const route = request.routeOptions.url ?? 'unmatched'
    httpDuration.observe(
      { method: request.method, route, status: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    )
  })

  const path = options.path ?? '/metrics'
  if (path) {
    app.get(path, { schema: { hide: true } }, async (_request, reply) =>
      reply.type(registry.contentType).send(await registry.metrics()),
    )
  }
}

export default fp(metricsPlugin, { name: 'metrics', fastify: '5.x' })
