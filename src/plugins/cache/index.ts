import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  HookHandlerDoneFunction,
  onRequestHookHandler,
  RouteOptions,
} from 'fastify'
import fp from 'fastify-plugin'
import { isCluster, type RedisClient } from '../../redis/client.ts'
import { withTimeout } from '../../redis/timeout.ts'
import { pluginContext, type RedisPluginContext, redisPluginContext } from '../common/context.ts'
import { SubscriberHeartbeat } from '../common/heartbeat.ts'
import { pluginRegistered, routeCovered } from '../common/route-coverage.ts'
import { addRouteHook } from '../common/route-hooks.ts'
import {
  type CacheApi,
  checkRead,
  type GetOrLoadOptions,
  type Prefetch,
  RedisCache,
  withDeadline,
} from './cache.ts'
import { L1Cache } from './l1.ts'
import { ConcurrencyLimiter } from './limiter.ts'
import { type CacheMetrics, createCacheMetrics } from './metrics.ts'
import {
  CACHE_OPTIONS,
  CACHE_ROUTE_OPTIONS,
  type CachePluginOptions,
  type CachePluginSettings,
  type CacheRouteConfig,
} from './options.ts'

export {
  CACHE_KEY,
  CACHE_TAG,
  type CacheApi,
  type CacheLoadErrorMode,
  type CacheSetOptions,
  type GetOrLoadOptions,
  type LoadTimeouts,
  RedisCache,
} from './cache.ts'
export {
  CacheKeyInvalidError,
  CacheLoadTimeoutError,
  CacheTagInvalidError,
  CacheUnavailableError,
  CacheValueNotJsonError,
} from './errors.ts'
export { type CacheKeyPart, cacheKey } from './key.ts'
export type { CachePluginOptions, CacheRouteConfig } from './options.ts'

declare module 'fastify' {
  interface FastifyInstance {
    cache: CacheApi
  }
  interface FastifyContextConfig {
    cache?: CacheRouteConfig
  }
}

type KeyOf = (request: FastifyRequest) => string | undefined

/** A route's `config.cache`, checked when the route is added; undefined when it has none. */
function routeCache(route: RouteOptions): CacheRouteConfig | undefined {
  const config = route.config?.cache as unknown
  if (config === undefined) return undefined
  return CACHE_ROUTE_OPTIONS.read(config, `route ${route.method} ${route.url}: config.cache`)
}

/** Covers (for the ready-time check) every route with a `config.cache`, and returns its prefetch. */
function coverRoute(app: FastifyInstance, route: RouteOptions): KeyOf | undefined {
  const config = routeCache(route)
  if (!config) return undefined
  routeCovered(app, 'cache', route)
  return config.prefetch
}

/**
 * Prefetching on the routes that ask for it: an onRequest hook, first among the route's own (after
 * the instance's, like the session load), sends the peek without awaiting anything, so it shares a
 * round trip with the session load and the rate limits; the handler runs with its request's prefetch.
 */
function addPrefetching(app: FastifyInstance, cache: RedisCache): void {
  const prefetches = new WeakMap<FastifyRequest, Prefetch>()
  const startPrefetch = (keyOf: KeyOf): onRequestHookHandler =>
    function cachePrefetch(request: FastifyRequest, _reply: FastifyReply, done: HookHandlerDoneFunction) {
      let key: unknown
      try {
        key = keyOf(request)
      } catch (err) {
        request.log.error({ err }, 'cache prefetch function threw; the route reads without it')
      }
      if (typeof key === 'string') {
        const prefetch = cache.prefetch(key)
        if (prefetch) prefetches.set(request, prefetch)
      }
      done()
    }
  app.addHook('onRoute', (route) => {
    const keyOf = coverRoute(app, route)
    if (!keyOf) return
    addRouteHook(route, 'onRequest', startPrefetch(keyOf), 'first')
    const handler = route.handler as (this: FastifyInstance, ...args: unknown[]) => unknown
    route.handler = function prefetchedHandler(this: FastifyInstance, request: FastifyRequest, reply) {
      const prefetch = prefetches.get(request)
      if (!prefetch) return handler.call(this, request, reply)
      return cache.whilePrefetched(prefetch, () => handler.call(this, request, reply))
    } as RouteOptions['handler']
  })
}

/** Every read calls its loader (bounded by `hardTimeoutMs` if set); nothing is stored. */
function disabledCache(defaultHardTimeoutMs: number, log: FastifyBaseLogger): CacheApi {
  return {
    enabled: false,
    getOrLoad<T>(key: string, loader: () => Promise<T | null>, options?: GetOrLoadOptions) {
      checkRead(key, options)
      const hardMs = options?.hardTimeoutMs ?? defaultHardTimeoutMs
      const load = async () => (options?.admit && !(await options.admit()) ? null : loader())
      if (!(hardMs > 0)) return load()
      return withDeadline(load(), Date.now() + hardMs, key, hardMs, (err) =>
        log.warn({ err, key }, 'cache load failed after its read timed out'),
      )
    },
    get: async () => undefined,
    has: async () => false,
    set: async () => true,
    delete: async () => true,
    invalidate: async () => true,
    invalidateTags: async () => true,
  }
}

const SHARED_FIX =
  '. With `sharedWithDurableData` this Redis also holds sessions, idempotency records and rate limits, which that policy may evict: give the cache a Redis of its own (its `redis` option)'

/**
 * Keeps the L1 coherent: every instance drops the keys and tags another one invalidated. The L1
 * is bypassed while the subscriber is away (invalidations published then are lost) and starts
 * empty once subscribed again: emptied when the SUBSCRIBE is confirmed, not at connect, so a read
 * that filled the L1 while the subscription was pending is dropped too, and so is any read in flight.
 * A channel that answers late delivers late: the L1 serves only while the subscriber's heartbeat
 * PING is answered within an interval, which also finds a connection that died without closing.
 */
async function subscribeToInvalidations(
  context: CacheContext,
  subscriber: RedisClient,
  channel: string,
  state: { subscribed: boolean },
  heartbeat: SubscriberHeartbeat,
  l1: L1Cache,
  cache: RedisCache,
  settings: CachePluginSettings,
): Promise<void> {
  // Settled by the first SUBSCRIBE's answer, or by the connection's first close.
  let firstOutcome!: () => void
  const subscribedOrDown = new Promise<void>((resolve) => {
    firstOutcome = resolve
  })
  subscriber.on('end', () => heartbeat.stop())
  subscriber.on('error', () => {})
  subscriber.on('close', () => {
    heartbeat.dropped()
    state.subscribed = false
    firstOutcome()
  })
  subscriber.on('ready', () => {
    subscriber
      .subscribe(channel)
      .then(() => {
        l1.clear()
        state.subscribed = true
        firstOutcome()
      })
      .catch((err: unknown) => context.log.warn({ err }, 'cache L1 subscribe failed'))
  })
  subscriber.on('message', (_channel: string, message: string) => {
    try {
      const parsed = JSON.parse(message) as unknown
      if (Array.isArray(parsed)) cache.dropLocal(parsed as string[])
      else if (Array.isArray((parsed as { tags?: unknown })?.tags))
        cache.dropLocalTags((parsed as { tags: string[] }).tags)
      else throw new Error('neither keys nor tags')
    } catch (err) {
      context.log.warn({ err }, 'malformed cache invalidation message; L1 cleared')
      l1.clear()
    }
  })
  await subscriber.connect().catch(() => {})
  // Once the app is ready, its L1 serves: registration waits for the subscription (bounded like the
  // wait for Redis itself; until subscribed, the L1 is bypassed, never stale).
  await withTimeout(subscribedOrDown, settings.connectTimeoutMs, () => {})
}

type CacheContext = RedisPluginContext<CacheMetrics>

/** The cache over its Redis, with an L1 kept coherent through pub/sub when `l1TtlMs` is set. */
async function redisCache(app: FastifyInstance, context: CacheContext, settings: CachePluginSettings) {
  const { redis } = context
  // ioredis types `duplicate` per client class; both return a client of the same kind.
  const subscriber = settings.l1TtlMs > 0 ? (redis.duplicate as () => RedisClient)() : undefined
  const state = { subscribed: false }
  // Cleared when a PING comes late and when it is answered: what was read meanwhile may predate a
  // message that was late.
  const heartbeat =
    subscriber &&
    new SubscriberHeartbeat(settings.l1TtlMs, {
      live: () => state.subscribed,
      ping: () => subscriber.ping(),
      late: () => l1?.clear(),
      onTime: () => l1?.clear(),
    })
  const l1 =
    subscriber && heartbeat
      ? new L1Cache(
          settings.l1TtlMs,
          settings.l1MaxEntries,
          () => state.subscribed && !heartbeat.late && subscriber.status === 'ready',
        )
      : undefined
  const channel = `${settings.keyPrefix}invalidations`
  const cache = new RedisCache({
    redis,
    settings,
    metrics: context.metrics,
    limiter: new ConcurrencyLimiter(settings.maxConcurrentLoads),
    log: context.log,
    l1,
    // Keys as a JSON array, tags as {"tags": [...]}.
    // Published with or without an L1 of its own: another instance may have one (a fleet with mixed
    // settings, or a rolling deploy that turns the L1 on), and it hears of writes only this way.
    broadcast: (message) => redis.publish(channel, JSON.stringify(message)),
    broadcastInOrder: !isCluster(redis),
  })
  if (subscriber && heartbeat && l1) {
    app.addHook('onClose', async () => subscriber.disconnect())
    await subscribeToInvalidations(context, subscriber, channel, state, heartbeat, l1, cache, settings)
  }
  app.addHook('onClose', async () => cache.close())
  return cache
}

async function cachePlugin(app: FastifyInstance, options: CachePluginOptions) {
  const settings = CACHE_OPTIONS.read(options)
  pluginRegistered(app, 'cache')
  if (!settings.enabled) {
    const { log } = pluginContext(app, 'cache')
    app.decorate('cache', disabledCache(settings.hardTimeoutMs, log))
    // Nothing to prefetch: every read calls its loader. Routes' options are still checked.
    app.addHook('onRoute', (route) => void coverRoute(app, route))
    return
  }
  // A cache that cannot connect at boot is not fatal: reads go to the source until it answers.
  // Evicting cache entries is fine on a Redis of the cache's own; not where durable data lives.
  const context = await redisPluginContext(app, 'cache', {
    metrics: createCacheMetrics,
    redis: {
      redis: settings.redis,
      connectTimeoutMs: settings.connectTimeoutMs,
      eviction: settings.sharedWithDurableData ? 'refuse' : 'allow',
      fix: SHARED_FIX,
    },
  })
  const cache = await redisCache(app, context, settings)
  app.decorate('cache', cache)
  addPrefetching(app, cache)
}

export default fp(cachePlugin, { name: 'fastify-redis-gateway/cache', fastify: '5.x' })
