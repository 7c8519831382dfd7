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
import { type AnyRedisClient, describeValue, type RedisClient } from '../../redis/client.ts'
import { bootPluginRedis, DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import { observePluginRedis, whenMetricsReady } from '../common/metrics.ts'
import { optionChecker, optionKeys } from '../common/options.ts'
import { pluginRegistered, routeCovered } from '../common/route-coverage.ts'
import { addRouteHook } from '../common/route-hooks.ts'
import {
  CACHE_OPTION_HINTS,
  type CacheApi,
  type CacheLoadErrorMode,
  type CacheSettings,
  checkRead,
  type GetOrLoadOptions,
  type Prefetch,
  RedisCache,
  shown,
  withDeadline,
} from './cache.ts'
import { L1Cache } from './l1.ts'
import { ConcurrencyLimiter } from './limiter.ts'
import { adoptCacheMetrics, createCacheMetrics } from './metrics.ts'

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

export interface CachePluginOptions {
  /** false: every read calls its loader and nothing touches Redis (default true). */
  enabled?: boolean
  /**
   * Any ioredis Redis or Cluster; defaults to the redis plugin's `app.redis`. Give the cache a
   * Redis of its own (with an eviction policy) by passing a client connected to it. Never closed by this plugin.
   */
  redis?: AnyRedisClient
  /**
   * Set when this Redis also holds sessions, idempotency records or rate limits: registration then
   * fails if the instance may evict (any maxmemory-policy but noeviction), since eviction would drop them.
   */
  sharedWithDurableData?: boolean
  /**
   * How long registration waits for the client to be ready (default 5000 ms; 0: do not wait).
   * A cache Redis that is not ready does not stop the boot: reads go to their loaders until it is.
   */
  connectTimeoutMs?: number
  keyPrefix?: string
  /** Fresh lifetime of an entry (default 60 s); also the bound on staleness after a failed invalidation. */
  ttlMs?: number
  /** Fraction of the TTL added at random to each entry, 0 to 1 (default 0.2). */
  jitter?: number
  /** How long past the TTL an entry may be served while one caller refreshes it (default 0: off). */
  staleWhileRevalidateMs?: number
  /** XFetch beta: > 0 refreshes hot entries early and probabilistically (default 0: off; 1 is typical). */
  earlyRefreshBeta?: number
  /** Lifetime of a cached "not found" (default 5 s). */
  negativeTtlMs?: number
  /** Lifetime of the fill lease, the bound on a crashed holder (default 5 s, Postgres' statement timeout). */
  leaseTtlMs?: number
  /** How long a miss waits for another holder's fill before loading itself (default 2 s). */
  leaseWaitMs?: number
  /** Loads running at once in this process, including all loads while Redis is down (default 8). */
  maxConcurrentLoads?: number
  /** In-process L1 lifetime; 0 turns the L1 off (default). Kept coherent through Redis pub/sub. */
  l1TtlMs?: number
  l1MaxEntries?: number
  /**
   * With a stale copy (past the soft TTL, within `staleWhileRevalidateMs`) and this read holding the
   * lease to refresh it: how long it waits for the refresh before serving the stale copy (the load
   * goes on and fills). Default 0: the stale copy at once. Per call: `getOrLoad(key, loader, { softTimeoutMs })`.
   */
  softTimeoutMs?: number
  /**
   * With no stale copy: how long a read waits for a load (its own, or another holder's) before it
   * rejects with `CacheLoadTimeoutError`; the load goes on and still fills. Default 0: no limit.
   */
  hardTimeoutMs?: number
  /** A refresh a read waits for (see `softTimeoutMs`) throws: 'serve-stale' (default) or 'fail'. */
  onLoadError?: CacheLoadErrorMode
  /** false disables the stale-fill fence. Exists only to demonstrate the race it prevents. */
  fence?: boolean
  /**
   * A value as stored (default JSON.stringify). Must return a string; a value it throws on, or
   * returns anything else for, rejects the read or `set` with CacheValueNotJsonError.
   */
  serialize?: (value: unknown) => string
  /** A stored string back to a value (default JSON.parse), e.g. with a reviver that restores Dates. */
  deserialize?: (payload: string) => unknown
}

const PLUGIN_OPTIONS = optionKeys<CachePluginOptions>({
  enabled: true,
  redis: true,
  sharedWithDurableData: true,
  connectTimeoutMs: true,
  keyPrefix: true,
  ttlMs: true,
  jitter: true,
  staleWhileRevalidateMs: true,
  earlyRefreshBeta: true,
  negativeTtlMs: true,
  leaseTtlMs: true,
  leaseWaitMs: true,
  maxConcurrentLoads: true,
  l1TtlMs: true,
  l1MaxEntries: true,
  softTimeoutMs: true,
  hardTimeoutMs: true,
  onLoadError: true,
  fence: true,
  serialize: true,
  deserialize: true,
})

const ROUTE_OPTIONS = optionKeys<CacheRouteConfig>({ prefetch: true })

const check = optionChecker('cache plugin', CACHE_OPTION_HINTS)

/** A route's `config.cache`. */
export interface CacheRouteConfig {
  /**
   * The key this route's handler reads with `getOrLoad`, from what is known in onRequest (params,
   * query, headers: not the body, not the session), or undefined. The entry is peeked (read-only: no
   * lease) while the other plugins' onRequest commands are in flight, and a `getOrLoad` of that key
   * made before the handler's first await takes the answer: a fresh entry costs no round trip of its
   * own, anything else is read as usual, once the route's checks have passed.
   */
  prefetch?: (request: FastifyRequest) => string | undefined
}

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
  const where = `route ${route.method} ${route.url}: config.cache`
  if (typeof config !== 'object' || config === null || Array.isArray(config))
    check.fail(`${where} must be an object ({ prefetch? }), got ${describeValue(config)}`)
  check.known(config as object, ROUTE_OPTIONS, where)
  const { prefetch } = config as CacheRouteConfig
  if (prefetch !== undefined && typeof prefetch !== 'function')
    check.fail(
      `${where}.prefetch must be a function of the request returning a key or undefined, got ${describeValue(prefetch)}`,
    )
  return config as CacheRouteConfig
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

type Checked = CacheSettings & {
  maxConcurrentLoads: number
  l1TtlMs: number
  l1MaxEntries: number
  connectTimeoutMs: number
}

function validate(options: CachePluginOptions): Checked {
  if (typeof options !== 'object' || options === null)
    check.fail(`options must be an object, got ${describeValue(options)}`)
  check.known(options, PLUGIN_OPTIONS)
  const int = (name: keyof CachePluginOptions, fallback: number, min: number) => {
    const value = options[name] === undefined ? fallback : options[name]
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min)
      check.fail(`\`${name}\` must be an integer of at least ${min}, got ${shown(value)}`)
    return value as number
  }
  const fraction = (name: keyof CachePluginOptions, fallback: number, max: number) => {
    const value = options[name] === undefined ? fallback : options[name]
    if (typeof value !== 'number' || !(value >= 0 && value <= max))
      check.fail(`\`${name}\` must be between 0 and ${max}, got ${shown(value)}`)
    return value as number
  }
  const flag = (name: keyof CachePluginOptions, fallback: boolean) => {
    const value = options[name] === undefined ? fallback : options[name]
    if (typeof value !== 'boolean') check.fail(`\`${name}\` must be true or false, got ${shown(value)}`)
    return value as boolean
  }
  const fn = <F>(name: keyof CachePluginOptions, fallback: F): F => {
    const value = options[name] === undefined ? fallback : options[name]
    if (typeof value !== 'function') check.fail(`\`${name}\` must be a function, got ${shown(value)}`)
    return value as F
  }
  const keyPrefix = options.keyPrefix === undefined ? 'cache:' : options.keyPrefix
  if (typeof keyPrefix !== 'string') check.fail(`\`keyPrefix\` must be a string, got ${shown(keyPrefix)}`)
  if (/[{}]/.test(keyPrefix))
    check.fail(`\`keyPrefix\` must not contain braces (they would change the hash tag), got '${keyPrefix}'`)
  const leaseTtlMs = int('leaseTtlMs', 5000, 10)
  const leaseWaitMs = int('leaseWaitMs', 2000, 0)
  if (leaseWaitMs > leaseTtlMs)
    check.fail(`\`leaseWaitMs\` (${leaseWaitMs}) must not exceed \`leaseTtlMs\` (${leaseTtlMs})`)
  const onLoadError = options.onLoadError === undefined ? 'serve-stale' : options.onLoadError
  if (onLoadError !== 'serve-stale' && onLoadError !== 'fail')
    check.fail(`\`onLoadError\` must be 'serve-stale' or 'fail', got ${shown(onLoadError)}`)
  flag('enabled', true)
  flag('sharedWithDurableData', false)
  return {
    keyPrefix,
    ttlMs: int('ttlMs', 60_000, 1),
    jitter: fraction('jitter', 0.2, 1),
    staleWhileRevalidateMs: int('staleWhileRevalidateMs', 0, 0),
    earlyRefreshBeta: fraction('earlyRefreshBeta', 0, 10),
    negativeTtlMs: int('negativeTtlMs', 5000, 1),
    leaseTtlMs,
    leaseWaitMs,
    fence: flag('fence', true),
    softTimeoutMs: int('softTimeoutMs', 0, 0),
    hardTimeoutMs: int('hardTimeoutMs', 0, 0),
    onLoadError,
    serialize: fn('serialize', JSON.stringify as (value: unknown) => string),
    deserialize: fn('deserialize', JSON.parse as (payload: string) => unknown),
    maxConcurrentLoads: int('maxConcurrentLoads', 8, 1),
    l1TtlMs: int('l1TtlMs', 0, 0),
    l1MaxEntries: int('l1MaxEntries', 10_000, 1),
    connectTimeoutMs: int('connectTimeoutMs', DEFAULT_CONNECT_TIMEOUT_MS, 0),
  }
}

const SHARED_FIX =
  '. With `sharedWithDurableData` this Redis also holds sessions, idempotency records and rate limits, which that policy may evict: give the cache a Redis of its own (its `redis` option)'

async function cachePlugin(app: FastifyInstance, options: CachePluginOptions) {
  const settings = validate(options)
  pluginRegistered(app, 'cache')
  if (options.enabled === false) {
    app.decorate('cache', disabledCache(settings.hardTimeoutMs, app.log.child({ plugin: 'cache' })))
    // Nothing to prefetch: every read calls its loader. Routes' options are still checked.
    app.addHook('onRoute', (route) => void coverRoute(app, route))
    return
  }
  // A cache that cannot connect at boot is not fatal: reads go to the source until it answers.
  // Evicting cache entries is fine on a Redis of the cache's own; not where durable data lives.
  const redis = await bootPluginRedis(app, 'cache', {
    redis: options.redis,
    connectTimeoutMs: settings.connectTimeoutMs,
    eviction: options.sharedWithDurableData ? 'refuse' : 'allow',
    fix: SHARED_FIX,
  })
  // ioredis types `duplicate` per client class; both return a client of the same kind.
  const subscriber = settings.l1TtlMs > 0 ? (redis.duplicate as () => RedisClient)() : undefined
  if (subscriber) app.addHook('onClose', async () => subscriber.disconnect())

  // Invalidations published while the subscriber is away are lost: the L1 is bypassed then.
  let subscribed = false
  const l1 = subscriber
    ? new L1Cache(settings.l1TtlMs, settings.l1MaxEntries, () => subscribed && subscriber.status === 'ready')
    : undefined
  const channel = `${settings.keyPrefix}invalidations`
  const cache = new RedisCache({
    redis,
    settings,
    metrics: createCacheMetrics(),
    limiter: new ConcurrencyLimiter(settings.maxConcurrentLoads),
    log: app.log.child({ plugin: 'cache' }),
    l1,
    // Keys as a JSON array, tags as {"tags": [...]}.
    broadcast: subscriber ? (message) => redis.publish(channel, JSON.stringify(message)) : undefined,
  })

  if (subscriber && l1) {
    // And it starts empty once subscribed again, for the same reason: emptied when the SUBSCRIBE is
    // confirmed, not at connect, so a read that filled the L1 while the subscription was pending
    // (an invalidation published then never arrives) is dropped too, and so is any read in flight.
    subscriber.on('error', () => {})
    subscriber.on('close', () => {
      subscribed = false
    })
    subscriber.on('ready', () => {
      subscriber
        .subscribe(channel)
        .then(() => {
          l1.clear()
          subscribed = true
        })
        .catch((err: unknown) => app.log.warn({ err }, 'cache L1 subscribe failed'))
    })
    subscriber.on('message', (_channel: string, message: string) => {
      try {
        const parsed = JSON.parse(message) as unknown
        if (Array.isArray(parsed)) cache.dropLocal(parsed as string[])
        else if (Array.isArray((parsed as { tags?: unknown })?.tags))
          cache.dropLocalTags((parsed as { tags: string[] }).tags)
        else throw new Error('neither keys nor tags')
      } catch (err) {
        app.log.warn({ err }, 'malformed cache invalidation message; L1 cleared')
        l1.clear()
      }
    })
    await subscriber.connect().catch(() => {})
  }
  whenMetricsReady(app, (metrics) => {
    cache.metrics = adoptCacheMetrics(metrics.registry, cache.metrics)
    observePluginRedis(app, metrics, redis, 'cache')
  })
  app.addHook('onClose', async () => cache.close())
  app.decorate('cache', cache)
  addPrefetching(app, cache)
}

export default fp(cachePlugin, { name: 'fastify-redis-gateway/cache', fastify: '5.x' })
