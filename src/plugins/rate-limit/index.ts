import { setTimeout as sleep } from 'node:timers/promises'
import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onRequestHookHandler,
  RouteOptions,
} from 'fastify'
import fp from 'fastify-plugin'
import { observePluginRedis, whenMetricsReady } from '../shared/metrics.ts'
import { checkPrincipalOption, type PrincipalFunction, resolvePrincipal } from '../shared/principal.ts'
import { HttpProblem, sendProblem } from '../shared/problem.ts'
import { awaitRedisAtBoot, pluginRedis, type RedisClient } from '../shared/redis.ts'
import { type Decision, type Outcome, RateLimitEngine, RateLimitError, type Refund } from './engine.ts'
import { createMetrics } from './metrics.ts'
import {
  type AllowList,
  allowListPredicate,
  normalizePolicy,
  type Policy,
  type RateLimitPolicy,
  signature,
} from './policy.ts'

export type { Decision } from './engine.ts'
export { type KeyFunction, keyBy } from './keys.ts'
export type { Algorithm, AllowList, FailureMode, RateLimitPolicy } from './policy.ts'
export type { PrincipalFunction }

/** A route's `config.rateLimits`: policies (or names of `namedPolicies`), or false for none at all. */
export type RouteRateLimit = false | string | RateLimitPolicy | Array<string | RateLimitPolicy>

export interface RateLimitPluginOptions {
  /** Any ioredis Redis or Cluster; defaults to the redis plugin's `app.redis`. Never closed by this plugin. */
  redis?: RedisClient
  /** Who the caller is, for `keyBy.customer`; default: this suite's session plugin if registered, else nobody. */
  principal?: PrincipalFunction
  /** Prepended to every key (default `rl:`); keys are `<prefix>{<identity hash>}:<policy name>`. */
  keyPrefix?: string
  /** Applied to every route registered after the plugin (unless the route says `rateLimits: false`). */
  policies?: RateLimitPolicy[]
  /** Defined once, applied where a route names them: `config: { rateLimits: 'login' }`. */
  namedPolicies?: RateLimitPolicy[]
  /** Option values every policy starts from (an explicit policy option wins). */
  defaults?: Partial<Omit<RateLimitPolicy, 'name'>>
  /** Requests no policy applies to: client IPs, or a predicate. */
  allowList?: AllowList
  /** Also send X-RateLimit-Limit / -Remaining / -Reset for the tightest policy. Default false. */
  legacyHeaders?: boolean
  /** Keys kept in memory while over their limit, answered without Redis; 0 turns it off. Default 10000. */
  overLimitCacheKeys?: number
  /** After a Redis failure, decide by each policy's onRedisError for this long before trying again. Default 1000. */
  retryRedisAfterMs?: number
  /** Bound on a script call when the client has no commandTimeout of its own. Default 500. */
  timeoutMs?: number
}

export interface RateLimitDecorator {
  /** Checks policies by name for this request without consuming anything. */
  peek(request: FastifyRequest, names: string | string[]): Promise<Decision[]>
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

function checkOptions(o: RateLimitPluginOptions): void {
  const fail = (message: string): never => {
    throw new Error(`rate-limit plugin: ${message}`)
  }
  if (o.keyPrefix !== undefined && typeof o.keyPrefix !== 'string') fail('`keyPrefix` must be a string')
  checkPrincipalOption('rate-limit', o.principal)
  for (const list of ['policies', 'namedPolicies'] as const) {
    if (o[list] !== undefined && !Array.isArray(o[list])) fail(`\`${list}\` must be an array of policies`)
  }
  if (o.legacyHeaders !== undefined && typeof o.legacyHeaders !== 'boolean')
    fail('`legacyHeaders` must be a boolean')
  if (o.overLimitCacheKeys !== undefined && !nonNegativeInt(o.overLimitCacheKeys))
    fail('`overLimitCacheKeys` must be a non-negative integer')
  for (const name of ['retryRedisAfterMs', 'timeoutMs'] as const) {
    if (o[name] !== undefined && !(nonNegativeInt(o[name]) && o[name]! > 0))
      fail(`\`${name}\` must be a positive integer`)
  }
}

function appendHeader(reply: FastifyReply, name: string, value: string): void {
  const previous = reply.getHeader(name)
  reply.header(name, previous ? `${previous}, ${value}` : value)
}

function writeHeaders(reply: FastifyReply, decisions: Decision[], legacy: boolean): void {
  for (const d of decisions) {
    appendHeader(reply, 'ratelimit-policy', d.header)
    if (d.remaining === null) continue
    appendHeader(reply, 'ratelimit', `"${d.policy.name}";r=${d.remaining};t=${Math.ceil(d.resetMs / 1000)}`)
    if (legacy) {
      const current = reply.getHeader('x-ratelimit-remaining')
      if (current !== undefined && Number(current) <= d.remaining) continue
      reply.header('x-ratelimit-limit', d.header.split(';q=')[1]!.split(';')[0])
      reply.header('x-ratelimit-remaining', d.remaining)
      reply.header('x-ratelimit-reset', Math.ceil(d.resetMs / 1000))
    }
  }
}

function rejection(outcome: Outcome): HttpProblem {
  if (outcome.unavailable) {
    const { name } = outcome.unavailable
    return new HttpProblem(
      503,
      'rate-limit-unavailable',
      'Service unavailable',
      `Rate limit '${name}' cannot be checked now.`,
      {
        headers: { 'retry-after': '1' },
        extra: { policy: name },
      },
    )
  }
  const d = outcome.rejected!
  const seconds = Math.max(1, Math.ceil(d.retryMs / 1000))
  const quota = d.header.slice(d.header.indexOf(';q=') + 3).replace(';w=', ' per ')
  return new HttpProblem(
    429,
    'rate-limited',
    'Too many requests',
    `Rate limit '${d.policy.name}' (${quota} s) exceeded; retry in ${seconds} s.`,
    {
      headers: { 'retry-after': String(seconds) },
      extra: { policy: d.policy.name },
    },
  )
}

/**
 * A request the limiter could not check because of the route's own setup (a policy function threw
 * or returned what cannot be counted, Redis refused the script): 500 for this request only, logged
 * with the policy, and never taken for a Redis outage that would change every other route.
 */
function notChecked(request: FastifyRequest, err: unknown): HttpProblem {
  const policies = err instanceof RateLimitError ? err.policies : []
  request.log.error({ err, policy: policies.join(', ') || undefined }, 'rate limit: request not checked')
  const named = policies.length ? ` '${policies.join("', '")}'` : 's'
  return new HttpProblem(
    500,
    'rate-limit-error',
    'Internal server error',
    `Rate limit${named} could not be applied to this request.`,
    policies.length ? { extra: { policy: policies.join(', ') } } : {},
  )
}

async function rateLimitPlugin(app: FastifyInstance, options: RateLimitPluginOptions) {
  checkOptions(options)
  const redis = pluginRedis(app, 'rate-limit', options.redis)
  await awaitRedisAtBoot(app, redis, 'rate-limit')
  const defaults = options.defaults ?? {}
  const known = new Map<string, { signature: string; policy: Policy }>()
  const define = (raw: RateLimitPolicy): Policy => {
    const policy = normalizePolicy(raw, defaults)
    const sig = signature(raw, defaults)
    const seen = known.get(policy.name)
    if (seen && seen.signature !== sig) {
      throw new Error(`rate-limit plugin: policy '${policy.name}' is defined twice with different settings`)
    }
    if (!seen) known.set(policy.name, { signature: sig, policy })
    return seen?.policy ?? policy
  }
  const global = (options.policies ?? []).map(define)
  const named = new Map((options.namedPolicies ?? []).map((raw) => [raw.name, define(raw)]))
  const allow = allowListPredicate(options.allowList)
  const legacy = options.legacyHeaders ?? false
  const engine = new RateLimitEngine(
    redis,
    {
      keyPrefix: options.keyPrefix ?? 'rl:',
      overLimitCacheKeys: options.overLimitCacheKeys ?? 10_000,
      retryRedisAfterMs: options.retryRedisAfterMs ?? 1000,
      timeoutMs: options.timeoutMs ?? 500,
      log: app.log,
    },
    createMetrics(undefined),
  )
  app.addHook('onReady', async () => {
    engine.principal = resolvePrincipal(app, options.principal)
  })
  app.addHook('onClose', async () => engine.close())
  whenMetricsReady(app, (metrics) => {
    engine.metrics = createMetrics(metrics.registry)
    observePluginRedis(app, metrics, redis, 'rate-limit')
  })

  const limit = (policies: Policy[]): onRequestHookHandler =>
    async function rateLimitHook(request, reply) {
      let outcome: Outcome | null
      try {
        if (allow?.(request)) return
        outcome = await engine.evaluate(request, policies, 'c')
      } catch (err) {
        if (err instanceof RateLimitError)
          for (const name of err.policies) engine.metrics.decision(name, 'error')
        return sendProblem(reply, notChecked(request, err))
      }
      if (!outcome) return
      writeHeaders(reply, outcome.decisions, legacy)
      if (outcome.refunds.length)
        request.rateLimitRefunds = (request.rateLimitRefunds ?? []).concat(outcome.refunds)
      if (outcome.rejected || outcome.unavailable) return sendProblem(reply, rejection(outcome))
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

  const resolve = (route: RouteOptions, entry: string | RateLimitPolicy): Policy => {
    if (typeof entry !== 'string') return define(entry)
    const policy = named.get(entry)
    if (!policy)
      throw new Error(`rate-limit plugin: route ${route.method} ${route.url} names unknown policy '${entry}'`)
    return policy
  }

  app.decorateRequest('rateLimitRefunds', null)
  app.decorate<RateLimitDecorator>('rateLimiter', {
    async peek(request, names) {
      const policies = [names].flat().map((name) => {
        const found = known.get(name)
        if (!found) throw new Error(`rate-limit plugin: unknown policy '${name}'`)
        return found.policy
      })
      return (await engine.evaluate(request, policies, 'p'))?.decisions ?? []
    },
  })

  app.addHook('onRoute', (route) => {
    const config = route.config?.rateLimits
    if (config === false) return
    const policies = [
      ...global,
      ...(config === undefined ? [] : [config].flat().map((e) => resolve(route, e))),
    ]
    if (policies.length === 0) return
    const add = <T>(existing: T | T[] | undefined, hook: T): T[] =>
      [...(existing ? [existing].flat() : []), hook] as T[]
    const early = policies.filter((p) => p.hook === 'onRequest')
    const late = policies.filter((p) => p.hook === 'preHandler')
    if (early.length) route.onRequest = add(route.onRequest, limit(early))
    if (late.length) route.preHandler = add(route.preHandler, limit(late) as never)
    if (policies.some((p) => p.isFailure)) route.onSend = add(route.onSend, refundSuccesses as never)
  })
}

export default fp(rateLimitPlugin, { name: 'fastify-redis-gateway/rate-limit', fastify: '5.x' })
