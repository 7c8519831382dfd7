import type { FastifyInstance, FastifyRequest, RouteOptions } from 'fastify'
import fp from 'fastify-plugin'
import { addRouteHook } from '../plugins/common/route-hooks.ts'
import { RateLimitEngine } from '../plugins/rate-limit/engine.ts'
import { createRateLimitMetrics } from '../plugins/rate-limit/metrics.ts'
import type { RateLimitResult } from '../plugins/rate-limit/outcome.ts'
import { normalizePolicy } from '../plugins/rate-limit/policy.ts'
import type { Policy, RateLimitPolicy } from '../plugins/rate-limit/types.ts'
import { bootPluginRedis } from '../redis/server.ts'
import {
  COMPAT_OPTIONS,
  counterName,
  globalParams,
  mergeParams,
  type Params,
  penaltyOptions,
} from './fastify-rate-limit/params.ts'
import {
  formatLong,
  normalizeIP,
  REDIS_RETRY_AFTER_S,
  unavailableError,
} from './fastify-rate-limit/responses.ts'
import type {
  CreateRateLimitResult,
  CustomStore,
  ErrorResponseBuilderContext,
  Hook,
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

/** One limiter: its settings and the counter (policy name) it counts in. */
interface Limiter {
  params: Params
  name: string
  policies: Map<string, Policy>
  /** A custom store's child for this limiter (null: the engine counts). */
  store: CustomStore | null
  /** The policy when max and timeWindow are numbers: found once, not per request. */
  fixedPolicy: Policy | null
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
  const ran = Symbol('fastify.request.rateLimitRan')
  fastify.decorateRequest(ran as unknown as string, false)

  let unnamed = 0
  const limiter = (params: Params, name: string, routeInfo?: object): Limiter => {
    if (store) {
      const own = name === 'global' ? store : store.child({ ...params, routeInfo: routeInfo ?? {} })
      return { params, name, policies: new Map(), store: own, fixedPolicy: null }
    }
    const extra = penaltyOptions(params)
    if (Object.keys(extra).length > 0) params = { ...params, ...{ policyExtra: extra } }
    const l: Limiter = { params, name, policies: new Map(), store: null, fixedPolicy: null }
    if (typeof params.max === 'number' && typeof params.timeWindow === 'number')
      l.fixedPolicy = policyOf(l, params.max, params.timeWindow)
    return l
  }

  /** Counts in a custom store: its `{ current, ttl }` as the engine's result. */
  const countInStore = async (
    own: CustomStore,
    key: string | number,
    max: number,
    timeWindow: number,
    increment: boolean,
  ): Promise<{ remaining: number | null; ttl: number; allowed: boolean } | null> => {
    const method = increment ? own.incr : own.read
    if (typeof method !== 'function')
      throw new Error(
        'The configured rate-limit store does not implement a `read` method, which is required to use `{ increment: false }`',
      )
    const { current, ttl } = await new Promise<{ current: number; ttl: number }>((resolve, reject) =>
      method.call(own, key, (err, result) => (err ? reject(err) : resolve(result!)), timeWindow, max),
    )
    return { remaining: max - current, ttl, allowed: current <= max }
  }
  const policyOf = (l: Limiter, max: number, windowMs: number): Policy => {
    const id = `${max}/${windowMs}`
    let policy = l.policies.get(id)
    if (!policy) {
      const raw = {
        name: l.name,
        algorithm: 'fixed-window',
        limit: Math.max(1, max),
        windowMs: Math.max(1, windowMs),
        onRedisError: l.params.skipOnError ? 'open' : 'closed',
        ...(l.params as Params & { policyExtra?: object }).policyExtra,
      } as RateLimitPolicy
      policy = normalizePolicy(raw)
      if (l.policies.size >= 1000) l.policies.clear()
      l.policies.set(id, policy)
    }
    return policy
  }

  /**
   * Counts one request. `routeGroupId` is the route's `config.rateLimit.groupId` when the hook was
   * attached to a known route (null: none); undefined asks the request (the decorators' hooks may
   * run on any route), which builds Fastify's routeOptions object: kept off the per-route path.
   */
  async function apply(
    l: Limiter,
    request: FastifyRequest,
    increment: boolean,
    routeGroupId: string | null | undefined,
  ): Promise<CreateRateLimitResult> {
    const { params } = l
    // Handed to allowList and the callbacks as keyGenerator returned it; counted as its string.
    let key: string | number = params.keyGenerator
      ? await params.keyGenerator(request)
      : normalizeIP(request.ip, params.ipv6Subnet)
    const groupId =
      routeGroupId === undefined
        ? (request.routeOptions.config as { rateLimit?: { groupId?: string } } | undefined)?.rateLimit
            ?.groupId
        : routeGroupId
    if (groupId) key += groupId
    if (params.allowList) {
      if (typeof params.allowList === 'function') {
        if (await params.allowList(request, key as string)) return { isAllowed: true, key: key as string }
      } else if (params.allowList.includes(key as string)) return { isAllowed: true, key: key as string }
    }
    const max = typeof params.max === 'number' ? params.max : await params.max(request, key as string)
    const timeWindow =
      typeof params.timeWindow === 'number'
        ? params.timeWindow
        : await params.timeWindow(request, key as string)
    if (l.store) {
      let counted: { remaining: number | null; ttl: number; allowed: boolean } | null = null
      try {
        counted = await countInStore(l.store, key, max, timeWindow, increment)
      } catch (err) {
        if (!params.skipOnError || (err as Error).message.includes('`read` method')) throw err
      }
      const ttl = counted?.ttl ?? 0
      return {
        isAllowed: false,
        key: key as string,
        max,
        timeWindow,
        remaining: Math.max(0, counted?.remaining ?? max),
        ttl,
        ttlInSeconds: Math.ceil(ttl / 1000),
        isExceeded: counted ? !counted.allowed : false,
        // upstream: current - max > ban
        isBanned: counted !== null && params.ban !== -1 && -counted.remaining! > params.ban,
      }
    }
    const policy = l.fixedPolicy ?? policyOf(l, max, timeWindow)
    // max 0: every request is over; a cost above the limit is never allowed (and counts nothing).
    const cost = increment ? (max === 0 ? 2 : 1) : 0
    const result: RateLimitResult = await engine.consume(policy, String(key), cost, request)
    if (result.remaining === null && !result.allowed) {
      // A policy with onRedisError 'closed' (skipOnError false) while Redis cannot be asked.
      throw unavailableError()
    }
    const open = result.remaining === null
    const remaining = max === 0 ? 0 : open ? max : result.remaining!
    // A read of a key with nothing counted reports no window, as upstream's read.
    const ttl = open || (!increment && remaining >= max) ? 0 : result.resetMs
    const banned = result.banned
    return {
      isAllowed: false,
      key: key as string,
      max,
      timeWindow,
      remaining: Math.max(0, remaining),
      ttl,
      ttlInSeconds: Math.ceil(ttl / 1000),
      isExceeded: !result.allowed,
      isBanned: banned,
    }
  }

  const handler = (l: Limiter, routeGroupId?: string | null): Hook =>
    async function rateLimitHook(request, reply) {
      const req = request as unknown as Record<symbol, boolean>
      if (req[ran]) return
      req[ran] = true
      let r: CreateRateLimitResult
      try {
        r = await apply(l, request, true, routeGroupId)
      } catch (err) {
        const headers = (err as { headers?: Record<string, string> }).headers
        if ((err as { code?: string }).code === 'FRG_RATE_LIMIT_UNAVAILABLE' && headers)
          reply.headers(headers)
        throw err
      }
      if (r.isAllowed) return
      const { params } = l
      const { labels } = params
      const { ttlInSeconds } = r
      if (!r.isExceeded) {
        const on = params.addHeadersOnExceeding
        if (on[labels.rateLimit]) reply.header(labels.rateLimit, r.max)
        if (on[labels.rateRemaining]) reply.header(labels.rateRemaining, r.remaining)
        if (on[labels.rateReset]) reply.header(labels.rateReset, ttlInSeconds)
        params.onExceeding(request, r.key)
        return
      }
      params.onExceeded(request, r.key)
      const on = params.addHeaders
      if (on[labels.rateLimit]) reply.header(labels.rateLimit, r.max)
      if (on[labels.rateRemaining]) reply.header(labels.rateRemaining, 0)
      if (on[labels.rateReset]) reply.header(labels.rateReset, ttlInSeconds)
      if (on[labels.retryAfter]) reply.header(labels.retryAfter, ttlInSeconds)
      const context: ErrorResponseBuilderContext = {
        statusCode: 429,
        ban: false,
        max: r.max,
        ttl: r.ttl,
        after: formatLong(ttlInSeconds * 1000),
      }
      if (r.isBanned) {
        context.statusCode = 403
        context.ban = true
        params.onBanReach(request, r.key)
      }
      throw params.errorResponseBuilder(request, context)
    }

  const global = limiter(base, 'global')
  const forOptions = (options: RateLimitOptions | undefined): Limiter => {
    if (typeof options !== 'object' || options === null) return global
    const params = mergeParams(base, options)
    return limiter(params, params.groupId ? counterName('g', params.groupId) : `d${++unnamed}`)
  }

  if (!fastify.hasDecorator('createRateLimit')) {
    // Typed by whichever declaration of the name is in the program (ours or @fastify/rate-limit's).
    const createRateLimit: RateLimitDecorators['createRateLimit'] = (options) => {
      const l = forOptions(options)
      return (request, callOptions) => apply(l, request, callOptions?.increment !== false, undefined)
    }
    fastify.decorate('createRateLimit', createRateLimit as never)
  }
  if (!fastify.hasDecorator('rateLimit')) {
    const rateLimit: RateLimitDecorators['rateLimit'] = (options) => handler(forOptions(options))
    fastify.decorate('rateLimit', rateLimit as never)
  }

  const addLimiterHook = (l: Limiter, route: RouteOptions) => {
    const config = (route.config as { rateLimit?: { groupId?: unknown } } | undefined)?.rateLimit
    const routeGroupId = typeof config?.groupId === 'string' ? config.groupId : null
    addRouteHook(route, l.params.hook as 'onRequest', handler(l, routeGroupId))
  }

  fastify.addHook('onRoute', (route) => {
    const config = (route.config as { rateLimit?: unknown } | undefined)?.rateLimit
    if (config !== undefined && config !== null) {
      if (typeof config === 'object') {
        const params = mergeParams(base, config as RateLimitOptions)
        const where = `${[route.method].flat().join(',')}${route.url}`
        // Routes naming one groupId share its counter; any other route counts on its own.
        const name = params.groupId ? counterName('g', params.groupId) : counterName('r', where)
        addLimiterHook(limiter(params, name, route), route)
      } else if (config !== false) {
        throw new Error('Unknown value for route rate-limit configuration')
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
