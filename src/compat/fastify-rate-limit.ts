import type { FastifyInstance, RouteOptions } from 'fastify'
import fp from 'fastify-plugin'
import { InvalidOptionError } from '../plugins/common/errors.ts'
import { addRouteHook } from '../plugins/common/route-hooks.ts'
import { RateLimitEngine } from '../plugins/rate-limit/engine.ts'
import { createRateLimitMetrics } from '../plugins/rate-limit/metrics.ts'
import { bootPluginRedis } from '../redis/server.ts'
import {
  type CompatContext,
  countRequest,
  createLimiter,
  type Limiter,
  limiterHook,
} from './fastify-rate-limit/limiter.ts'
import {
  COMPAT_OPTIONS,
  counterName,
  globalParams,
  mergeParams,
  penaltyOptions,
} from './fastify-rate-limit/params.ts'
import { normalizeIP, REDIS_RETRY_AFTER_S } from './fastify-rate-limit/responses.ts'
import type {
  RateLimitDecorators,
  RateLimitOptions,
  RateLimitPluginOptions,
} from './fastify-rate-limit/types.ts'

// @fastify/rate-limit 11's options, decorators, route config and headers on this suite's
// rate-limit engine: every count is the fixed-window policy's (Redis script or memory store).
// docs/migrating-from-fastify-rate-limit.md says what differs and why.

/** The route config this plugin reads: `config: { rateLimit: { ... } }`, or `false` for none. */
export interface RateLimitRouteConfig {
  rateLimit?: RateLimitOptions | false
}

// Declared through `extends`, not as a member: an app migrating may have @fastify/rate-limit's
// types in the same program, which declare `rateLimit` as a member; a member declared twice with
// two types does not compile, while a member only needs to fit the one it overrides. The
// decorators are not declared (the migration guide says how): upstream's are typed by the
// instance's server types, which ours cannot fit.
declare module 'fastify' {
  interface FastifyContextConfig extends RateLimitRouteConfig {}
}

let registrations = 0

async function fastifyRateLimit(fastify: FastifyInstance, options: RateLimitPluginOptions) {
  const settings = COMPAT_OPTIONS.read(options ?? {})
  const base = globalParams(settings)
  // A custom store counts by itself: the options it needs are its own business, not the engine's.
  const store = typeof settings.store === 'function' ? new settings.store({ ...base }) : null
  if (!store) penaltyOptions(base)
  const redis = settings.redis
    ? await bootPluginRedis(fastify, 'rate-limit compat', {
        redis: settings.redis,
        connectTimeoutMs: settings.connectTimeoutMs,
        eviction: 'warn',
      })
    : null
  const registration = ++registrations
  const engine = new RateLimitEngine(redis, {
    // In memory each registration has counters of its own, as @fastify/rate-limit's LocalStore.
    keyPrefix: redis ? (settings.nameSpace ?? 'fastify-rate-limit-') : `frl${registration}:`,
    overLimitCacheKeys: redis ? 10_000 : 0,
    retryRedisAfterMs: REDIS_RETRY_AFTER_S * 1000,
    timeoutMs: 500,
    log: fastify.log.child({ plugin: 'rate-limit compat' }),
    // Counted in metrics nothing exports: @fastify/rate-limit has none.
    metrics: createRateLimitMetrics(),
    memoryMaxKeys: settings.cache,
  })
  fastify.addHook('onClose', async () => engine.close())
  const context: CompatContext = Object.freeze({ engine, store, ran: Symbol('fastify.request.rateLimitRan') })
  fastify.decorateRequest(context.ran as unknown as string, false)

  const global = createLimiter(context, base, 'global')
  let unnamed = 0
  const forOptions = (options: RateLimitOptions | undefined): Limiter => {
    if (typeof options !== 'object' || options === null) return global
    const params = mergeParams(base, options)
    return createLimiter(context, params, params.groupId ? counterName('g', params.groupId) : `d${++unnamed}`)
  }

  if (!fastify.hasDecorator('createRateLimit')) {
    // Typed by whichever declaration of the name is in the program (ours or @fastify/rate-limit's).
    const createRateLimit: RateLimitDecorators['createRateLimit'] = (options) => {
      const l = forOptions(options)
      return (request, callOptions) =>
        countRequest(context, l, request, callOptions?.increment !== false, undefined)
    }
    fastify.decorate('createRateLimit', createRateLimit as never)
  }
  if (!fastify.hasDecorator('rateLimit')) {
    const rateLimit: RateLimitDecorators['rateLimit'] = (options) => limiterHook(context, forOptions(options))
    fastify.decorate('rateLimit', rateLimit as never)
  }

  const addLimiterHook = (l: Limiter, route: RouteOptions) => {
    const config = (route.config as { rateLimit?: { groupId?: unknown } } | undefined)?.rateLimit
    const routeGroupId = typeof config?.groupId === 'string' ? config.groupId : null
    addRouteHook(route, l.params.hook as 'onRequest', limiterHook(context, l, routeGroupId))
  }

  fastify.addHook('onRoute', (route) => {
    const config = (route.config as { rateLimit?: unknown } | undefined)?.rateLimit
    if (config !== undefined && config !== null) {
      if (typeof config === 'object') {
        const params = mergeParams(base, config as RateLimitOptions)
        const where = `${[route.method].flat().join(',')}${route.url}`
        // Routes naming one groupId share its counter; any other route counts on its own.
        const name = params.groupId ? counterName('g', params.groupId) : counterName('r', where)
        addLimiterHook(createLimiter(context, params, name, route), route)
      } else if (config !== false) {
        throw new InvalidOptionError('Unknown value for route rate-limit configuration')
      }
    } else if (base.global) {
      addLimiterHook(global, route)
    }
  })
}

const plugin = fp(fastifyRateLimit, { fastify: '5.x', name: '@fastify/rate-limit' })

export default plugin
export type {
  CreateRateLimitResult,
  CustomStoreClass,
  ErrorResponseBuilderContext,
  Hook,
  RateLimitDecorators,
  RateLimitOptions,
  RateLimitPluginOptions,
} from './fastify-rate-limit/types.ts'
export { fastifyRateLimit, normalizeIP }
