import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import type { AnyRedisClient, RedisClient } from '../../redis/client.ts'
import { bootPluginRedis, type EvictionCheck } from '../../redis/server.ts'
import { pluginMetrics, pluginUsesRedis } from './metrics.ts'
import { bridgeOpenTelemetry } from './otel.ts'
import { type PrincipalFunction, resolvePrincipal } from './principal.ts'

// One context per plugin registration, built before its first hook runs and never changed after:
//
//   const settings = CACHE_OPTIONS.read(options)
//   const context = await redisPluginContext(app, 'cache', {
//     metrics: createCacheMetrics,            // instruments, created unregistered (see metrics.ts)
//     principal: settings.principal,          // optional: else the session plugin's, else nobody
//     redis: { redis: settings.redis, connectTimeoutMs, eviction: 'allow' },   // bootPluginRedis's
//   })
//   context.log.warn(...)     // app.log.child({ plugin: 'cache' }): no "cache: " prefix in messages
//   context.metrics.hits.inc({ name })
//   context.principal(request)
//   context.redis.get(...)    // the plugin's view of its client (commands labelled by the plugin)
//
// `pluginContext` is the same without Redis (a disabled plugin, the metrics plugin).

export interface PluginContext<M = undefined> {
  /** The plugin's name (`cache`, `rate-limit`): its log field, its metrics label. */
  readonly name: string
  /** The app's logger with `plugin: <name>` on every line. */
  readonly log: FastifyBaseLogger
  /** The plugin's instruments (shared with its other instances in the app); exported by the metrics plugin. */
  readonly metrics: M
  /**
   * Who the caller is: the plugin's `principal` option, else the session plugin's principal when
   * it is registered (known once the app is ready, so registration order does not matter), else
   * nobody (null). The function itself never changes; call it from a request's hooks.
   */
  readonly principal: PrincipalFunction
}

export interface RedisPluginContext<M = undefined> extends PluginContext<M> {
  /** The plugin's client, booted by bootPluginRedis: waited for, server checked, commands labelled. */
  readonly redis: RedisClient
}

export interface ContextParts<M> {
  /** Creates the plugin's instruments (see `pluginMetrics`); called once per app. */
  metrics?: () => M
  /** The plugin's `principal` option, if it has one. */
  principal?: PrincipalFunction | undefined
}

/** bootPluginRedis's settings: the `redis` option, how long to wait for it, the eviction check. */
export interface ContextRedis {
  redis: AnyRedisClient | undefined
  connectTimeoutMs: number | undefined
  eviction: EvictionCheck
  /** Appended to the eviction refusal: how to fix it. */
  fix?: string
}

export function pluginContext<M = undefined>(
  app: FastifyInstance,
  name: string,
  parts: ContextParts<M> = {},
): PluginContext<M> {
  const own = parts.principal
  // OpenTelemetry, if an SDK is registered: decisions become span attributes (otel.ts).
  app.addHook('onReady', async () => void (await bridgeOpenTelemetry()))
  let asked: PrincipalFunction = () => null
  if (!own)
    app.addHook('onReady', async () => {
      asked = resolvePrincipal(app, undefined)
    })
  return Object.freeze({
    name,
    log: app.log.child({ plugin: name }),
    metrics: (parts.metrics ? pluginMetrics(app, name, parts.metrics) : undefined) as M,
    principal: own ?? ((request) => asked(request)),
  })
}

/** `pluginContext` with the plugin's Redis client, booted now (registration waits for it). */
export async function redisPluginContext<M = undefined>(
  app: FastifyInstance,
  name: string,
  parts: ContextParts<M> & { redis: ContextRedis },
): Promise<RedisPluginContext<M>> {
  const redis = await bootPluginRedis(app, name, parts.redis)
  pluginUsesRedis(app, redis, name)
  return Object.freeze({ ...pluginContext(app, name, parts), redis })
}
