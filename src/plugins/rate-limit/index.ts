import { setTimeout as sleep } from 'node:timers/promises'
import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onRequestHookHandler,
  RouteOptions,
} from 'fastify'
import fp from 'fastify-plugin'
import { describeValue } from '../../redis/client.ts'
import { bootPluginRedis } from '../../redis/server.ts'
import { observePluginRedis, whenMetricsReady } from '../common/metrics.ts'
import { checkPrincipalOption, type PrincipalFunction, resolvePrincipal } from '../common/principal.ts'
import { sendProblem } from '../common/problem.ts'
import { pluginRegistered, routeCovered } from '../common/route-coverage.ts'
import { addRouteHook, routeName } from '../common/route-hooks.ts'
import { type Duration, durationOption, parseDuration } from './duration.ts'
import { RateLimitEngine } from './engine.ts'
import {
  RateLimitArgumentError,
  RateLimitError,
  RateLimitNoPolicyError,
  RateLimitPolicyConflictError,
  RateLimitUnknownPolicyError,
} from './errors.ts'
import { DEFAULT_IPV6_SUBNET } from './keys.ts'
import { createMetrics } from './metrics.ts'
import { PLUGIN_KEYS, pluginCheck, routeConfigCheck } from './options.ts'
import type { Outcome, RateLimitResult, Refund } from './outcome.ts'
import {
  allowListPredicate,
  checkDefaults,
  normalizePolicy,
  type PolicyContext,
  signature,
} from './policy.ts'
import { notChecked, sendRejection, writeHeaders } from './responses.ts'
import type { Decision, Policy, RateLimitPluginOptions, RateLimitPolicy, RouteRateLimit } from './types.ts'

export type { Duration } from './duration.ts'
export {
  RateLimitArgumentError,
  RateLimitError,
  RateLimitNoPolicyError,
  RateLimitPolicyConflictError,
  RateLimitUnknownPolicyError,
} from './errors.ts'
export { clientAddress, type KeyFunction, keyBy } from './keys.ts'
export type { RateLimitResult } from './outcome.ts'
export type { Algorithm } from './protocol.ts'
export type {
  AllowList,
  AsyncKeyFunction,
  BanHandler,
  BanOptions,
  Decision,
  ErrorResponseBuilder,
  ExceededHandler,
  FailureMode,
  LimitFunction,
  RateLimitPluginOptions,
  RateLimitPolicy,
  RouteRateLimit,
} from './types.ts'
export type { PrincipalFunction }

export interface RateLimitDecorator {
  /** Checks policies by name for this request without consuming anything. */
  peek(request: FastifyRequest, names: string | string[]): Promise<Decision[]>
  /**
   * Consumes `cost` (default 1; 0 only checks) of `key`'s quota under a policy, without a route:
   * `key` is the identity a key function would return (`ip:192.0.2.1`, `username:alice`), so a
   * route and this call share one quota. `request` is needed only for a per-request limit or window.
   */
  consume(policy: string, key: string, cost?: number, request?: FastifyRequest): Promise<RateLimitResult>
  /** Clears `key`'s counter and block under a policy (after a successful login, say). */
  reset(policy: string, key: string, request?: FastifyRequest): Promise<void>
  /** Rejects `key` under a policy (one with `blockMs`) for `ms` from now, on every instance. */
  block(policy: string, key: string, ms: Duration): Promise<void>
}

declare module 'fastify' {
  // Not `rateLimit`: @fastify/rate-limit declares that name, and its types may share a program with ours.
  interface FastifyContextConfig {
    rateLimits?: RouteRateLimit
  }
  interface FastifyInstance {
    rateLimiter: RateLimitDecorator
  }
  interface FastifyRequest {
    rateLimitRefunds: Refund[] | null
  }
}

const nonNegativeInt = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0

const { fail } = pluginCheck

function checkOptions(o: RateLimitPluginOptions): void {
  if (typeof o !== 'object' || o === null) fail(`options must be an object, got ${describeValue(o)}`)
  pluginCheck.known(o, PLUGIN_KEYS)
  if (o.store !== undefined && o.store !== 'redis' && o.store !== 'memory')
    fail(
      `\`store\` must be 'redis' or 'memory'${typeof o.store === 'string' ? '' : ' (@fastify/rate-limit\'s custom store classes have no equivalent here; see "Migrating from @fastify/rate-limit" in docs/rate-limit.md)'}`,
    )
  if (o.memoryMaxKeys !== undefined && !(Number.isSafeInteger(o.memoryMaxKeys) && o.memoryMaxKeys >= 100))
    fail('`memoryMaxKeys` must be an integer of at least 100')
  if (
    o.ipv6Subnet !== undefined &&
    !(Number.isSafeInteger(o.ipv6Subnet) && o.ipv6Subnet >= 32 && o.ipv6Subnet <= 128)
  )
    fail('`ipv6Subnet` must be an integer from 32 to 128')
  for (const name of ['onExceeded', 'errorResponse'] as const) {
    if (o[name] !== undefined && typeof o[name] !== 'function')
      fail(`\`${name}\` must be a function of (request, decision)`)
  }
  if (o.keyPrefix !== undefined && typeof o.keyPrefix !== 'string') fail('`keyPrefix` must be a string')
  if (o.now !== undefined && typeof o.now !== 'function')
    fail('`now` must be a function returning ms since the epoch')
  checkPrincipalOption('rate-limit', o.principal)
  for (const list of ['policies', 'namedPolicies'] as const) {
    if (o[list] !== undefined && !Array.isArray(o[list])) fail(`\`${list}\` must be an array of policies`)
  }
  checkDefaults(o.defaults)
  if (o.connectTimeoutMs !== undefined && !nonNegativeInt(o.connectTimeoutMs))
    fail('`connectTimeoutMs` must be a non-negative whole number of milliseconds (0: do not wait)')
  if (o.legacyHeaders !== undefined && typeof o.legacyHeaders !== 'boolean')
    fail('`legacyHeaders` must be a boolean')
  if (o.overLimitCacheKeys !== undefined && !nonNegativeInt(o.overLimitCacheKeys))
    fail('`overLimitCacheKeys` must be a non-negative integer')
  for (const name of ['retryRedisAfterMs', 'timeoutMs'] as const) {
    if (o[name] !== undefined) durationOption(name, o[name], 1, fail)
  }
}

async function rateLimitPlugin(app: FastifyInstance, options: RateLimitPluginOptions) {
  checkOptions(options)
  pluginRegistered(app, 'rateLimits')
  const memory = options.store === 'memory'
  const redis = memory
    ? null
    : await bootPluginRedis(app, 'rate-limit', {
        redis: options.redis,
        connectTimeoutMs: options.connectTimeoutMs,
        eviction: 'warn',
      })
  const defaults = options.defaults ?? {}
  const context: PolicyContext = {
    ipv6Subnet: options.ipv6Subnet ?? DEFAULT_IPV6_SUBNET,
    onExceeded: options.onExceeded ?? null,
    errorResponse: options.errorResponse ?? null,
  }
  const known = new Map<string, { signature: string; policy: Policy }>()
  const define = (raw: RateLimitPolicy, where = ''): Policy => {
    const policy = normalizePolicy(raw, defaults, context, where)
    const sig = signature(raw, defaults)
    const seen = known.get(policy.name)
    if (seen && seen.signature !== sig) {
      throw new RateLimitPolicyConflictError(
        `rate-limit plugin: ${where}policy '${policy.name}' is defined twice with different settings`,
        policy.name,
      )
    }
    if (!seen) known.set(policy.name, { signature: sig, policy })
    return seen?.policy ?? policy
  }
  const global = (options.policies ?? []).map((raw) => define(raw))
  const named = new Map((options.namedPolicies ?? []).map((raw) => [raw.name, define(raw)]))
  const allow = allowListPredicate(options.allowList, fail)
  const legacy = options.legacyHeaders ?? false
  const engine = new RateLimitEngine(
    redis,
    {
      keyPrefix: options.keyPrefix ?? 'rl:',
      // In memory every decision is as cheap as the cache would be.
      overLimitCacheKeys: memory ? 0 : (options.overLimitCacheKeys ?? 10_000),
      retryRedisAfterMs: parseDuration(options.retryRedisAfterMs ?? 1000)!,
      timeoutMs: parseDuration(options.timeoutMs ?? 500)!,
      log: app.log,
      memoryMaxKeys: options.memoryMaxKeys ?? 100_000,
      now: options.now ?? Date.now,
    },
    createMetrics(undefined),
  )
  /** Routes that got at least one policy of this plugin; none and no policy at all: it limits nothing. */
  let limitedRoutes = 0
  /** Routes carrying @fastify/rate-limit's `config.rateLimit`, refused unless that plugin is registered. */
  const foreignConfigs: Array<{ where: string; value: unknown }> = []
  app.addHook('onReady', async () => {
    engine.principal = resolvePrincipal(app, options.principal)
    // Its decorator is `rateLimit`: with it registered too, `config.rateLimit` is its to read.
    if (!app.hasDecorator('rateLimit'))
      for (const { where, value } of foreignConfigs)
        routeConfigCheck.known({ rateLimit: value }, ['rateLimits'], where)
    if (global.length === 0 && named.size === 0 && limitedRoutes === 0)
      throw new RateLimitNoPolicyError(
        "rate-limit plugin: no policy: the plugin is registered without `policies` or `namedPolicies` and no route it sees has `config.rateLimits`, so it limits nothing. Add `policies` (every route after the plugin), `namedPolicies` (routes name them, or app.rateLimiter uses them), or a policy in a route's `config.rateLimits`",
      )
  })
  app.addHook('onClose', async () => engine.close())
  whenMetricsReady(app, (metrics) => {
    engine.metrics = createMetrics(metrics.registry)
    if (redis) observePluginRedis(app, metrics, redis, 'rate-limit')
  })

  const limit = (policies: Policy[]): onRequestHookHandler =>
    async function rateLimitHook(request, reply) {
      let outcome: Outcome | null
      try {
        if (allow?.(request)) return
        outcome = await engine.evaluate(request, policies, 'consume')
      } catch (err) {
        if (err instanceof RateLimitError)
          for (const name of err.policies) engine.metrics.decision(name, 'error')
        return sendProblem(reply, notChecked(request, err))
      }
      if (!outcome) return
      writeHeaders(reply, outcome.decisions, legacy)
      if (outcome.refunds.length)
        request.rateLimitRefunds = (request.rateLimitRefunds ?? []).concat(outcome.refunds)
      if (outcome.rejected || outcome.unavailable) return sendRejection(request, reply, outcome)
      if (outcome.delayMs > 0) await sleep(outcome.delayMs)
    }

  // In onSend, before the client sees the answer: its next attempt already finds the quota back.
  const refundSuccesses = async (request: FastifyRequest, reply: FastifyReply, payload: unknown) => {
    for (const refund of request.rateLimitRefunds ?? []) {
      let failure = true
      try {
        failure = refund.policy.isFailure!(reply)
      } catch (err) {
        // A predicate that throws must not break the response: the attempt stays counted (the safe side).
        request.log.error(
          { err, policy: refund.policy.name },
          'rate limit: countOnlyFailures predicate threw',
        )
      }
      if (failure) continue
      await engine.refund(refund).catch((err) => request.log.warn({ err }, 'rate limit refund failed'))
    }
    return payload
  }

  const resolve = (route: RouteOptions, entry: unknown): Policy => {
    const where = `route ${routeName(route)}: config.rateLimits: `
    if (typeof entry === 'object' && entry !== null && !Array.isArray(entry))
      return define(entry as RateLimitPolicy, where)
    if (typeof entry !== 'string')
      fail(
        `${where}each entry must be a policy or the name of one of \`namedPolicies\`, got ${describeValue(entry)} (false, alone, turns every policy off)`,
      )
    const policy = named.get(entry as string)
    if (!policy)
      throw new RateLimitUnknownPolicyError(
        `rate-limit plugin: route ${routeName(route)} names unknown policy '${entry}'${namedList()}`,
        entry as string,
      )
    return policy
  }
  const namedList = () =>
    named.size ? ` (namedPolicies: ${[...named.keys()].join(', ')})` : ' (the plugin has no namedPolicies)'

  const policyNamed = (name: string, caller: string): Policy => {
    const found = typeof name === 'string' ? known.get(name) : undefined
    if (!found)
      throw new RateLimitUnknownPolicyError(
        `rate-limit plugin: ${caller}: unknown policy '${String(name)}'${known.size ? ` (policies: ${[...known.keys()].join(', ')})` : ''}`,
        String(name),
      )
    return found.policy
  }
  const checkKey = (key: unknown, caller: string): string => {
    if (typeof key !== 'string' || key.length === 0)
      throw new RateLimitArgumentError(
        `rate-limit plugin: ${caller}: \`key\` must be a non-empty string (the identity a key function returns), got ${describeValue(key)}`,
      )
    return key
  }

  app.decorateRequest('rateLimitRefunds', null)
  app.decorate<RateLimitDecorator>('rateLimiter', {
    async peek(request, names) {
      const policies = [names].flat().map((name) => policyNamed(name, 'peek()'))
      return (await engine.evaluate(request, policies, 'peek'))?.decisions ?? []
    },
    async consume(name, key, cost = 1, request) {
      const policy = policyNamed(name, 'consume()')
      checkKey(key, 'consume()')
      if (!Number.isSafeInteger(cost) || cost < 0)
        throw new RateLimitArgumentError(
          'rate-limit plugin: consume(): `cost` must be a whole number of units (0 or more)',
        )
      return engine.consume(policy, key, cost, request)
    },
    async reset(name, key, request) {
      const policy = policyNamed(name, 'reset()')
      await engine.reset(policy, checkKey(key, 'reset()'), request)
    },
    async block(name, key, ms) {
      const policy = policyNamed(name, 'block()')
      checkKey(key, 'block()')
      if (policy.blockMs === 0)
        throw new RateLimitArgumentError(
          `rate-limit plugin: block(): policy '${policy.name}' has no \`blockMs\` (blocks are checked only for policies that set it)`,
        )
      const duration = durationOption('ms', ms, 1, (message) => {
        throw new RateLimitArgumentError(`rate-limit plugin: block(): ${message}`)
      })
      await engine.block(policy, key, duration)
    },
  })

  app.addHook('onRoute', (route) => {
    const routeConfig = route.config as Record<string, unknown> | undefined
    if (routeConfig?.rateLimit !== undefined)
      foreignConfigs.push({ where: `route ${routeName(route)}: config`, value: routeConfig.rateLimit })
    const config = route.config?.rateLimits
    if (config !== undefined) routeCovered(app, 'rateLimits', route)
    if (config === false) return
    const policies = [
      ...global,
      ...(config === undefined ? [] : [config].flat().map((e) => resolve(route, e))),
    ]
    if (policies.length === 0) return
    limitedRoutes++
    const early = policies.filter((p) => p.hook === 'onRequest')
    const late = policies.filter((p) => p.hook === 'preHandler')
    if (early.length) addRouteHook(route, 'onRequest', limit(early))
    if (late.length) addRouteHook(route, 'preHandler', limit(late) as never)
    if (policies.some((p) => p.isFailure)) addRouteHook(route, 'onSend', refundSuccesses as never)
  })

  // Requests no route matched never pass onRoute: the not-found handler of this instance (set
  // before or after the plugin) gets the global policies through instance hooks, which return at
  // once for every matched route.
  if (global.length > 0) {
    const early = global.filter((p) => p.hook === 'onRequest')
    const late = global.filter((p) => p.hook === 'preHandler')
    const onlyNotFound = (hook: onRequestHookHandler) =>
      function rateLimitNotFound(request: FastifyRequest, reply: FastifyReply, done: () => void) {
        if (!request.is404) return done()
        return (hook as (request: FastifyRequest, reply: FastifyReply) => Promise<unknown>).call(
          app,
          request,
          reply,
        )
      }
    if (early.length) app.addHook('onRequest', onlyNotFound(limit(early)))
    if (late.length) app.addHook('preHandler', onlyNotFound(limit(late)))
    if (global.some((p) => p.isFailure)) {
      app.addHook('onSend', (request, reply, payload, done) => {
        if (!request.is404 || !request.rateLimitRefunds) return done(null, payload)
        refundSuccesses(request, reply, payload).then(
          (result) => done(null, result),
          (err) => done(err),
        )
      })
    }
  }
}

export default fp(rateLimitPlugin, { name: 'fastify-redis-gateway/rate-limit', fastify: '5.x' })
