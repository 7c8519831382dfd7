import type { FastifyRequest } from 'fastify'
import { InvalidOptionError } from '../../plugins/common/errors.ts'
import type { RateLimitEngine } from '../../plugins/rate-limit/engine.ts'
import type { RateLimitResult } from '../../plugins/rate-limit/outcome.ts'
import { normalizePolicy } from '../../plugins/rate-limit/policy.ts'
import type { Policy, RateLimitPolicy } from '../../plugins/rate-limit/types.ts'
import { type Params, penaltyOptions } from './params.ts'
import { formatLong, normalizeIP, unavailableError } from './responses.ts'
import type { CreateRateLimitResult, CustomStore, ErrorResponseBuilderContext, Hook } from './types.ts'

// One limiter of the compat entry (the global one, a route's, a decorator's) and the named handlers
// that count a request in it: in a custom store, or in the engine's fixed-window policy.

/** What every limiter of one registration shares, built before its first hook and never changed. */
export interface CompatContext {
  engine: RateLimitEngine
  /** A custom store (`store` option): it counts instead of the engine. */
  store: CustomStore | null
  /** Marks a request already counted by this registration (a route hook and a decorator's). */
  ran: symbol
}

/** One limiter: its settings and the counter (policy name) it counts in. */
export interface Limiter {
  params: Params
  name: string
  policies: Map<string, Policy>
  /** A custom store's child for this limiter (null: the engine counts). */
  store: CustomStore | null
  /** The policy when max and timeWindow are numbers: found once, not per request. */
  fixedPolicy: Policy | null
}

export function createLimiter(
  context: CompatContext,
  params: Params,
  name: string,
  routeInfo?: object,
): Limiter {
  const { store } = context
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
async function countInStore(
  own: CustomStore,
  key: string | number,
  max: number,
  timeWindow: number,
  increment: boolean,
): Promise<{ remaining: number | null; ttl: number; allowed: boolean } | null> {
  const method = increment ? own.incr : own.read
  if (typeof method !== 'function')
    throw new InvalidOptionError(
      'The configured rate-limit store does not implement a `read` method, which is required to use `{ increment: false }`',
    )
  const { current, ttl } = await new Promise<{ current: number; ttl: number }>((resolve, reject) =>
    method.call(own, key, (err, result) => (err ? reject(err) : resolve(result!)), timeWindow, max),
  )
  return { remaining: max - current, ttl, allowed: current <= max }
}

function policyOf(l: Limiter, max: number, windowMs: number): Policy {
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
export async function countRequest(
  context: CompatContext,
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
      ? (request.routeOptions.config as { rateLimit?: { groupId?: string } } | undefined)?.rateLimit?.groupId
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
  const result: RateLimitResult = await context.engine.consume(policy, String(key), cost, request)
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

export const limiterHook = (context: CompatContext, l: Limiter, routeGroupId?: string | null): Hook =>
  async function rateLimit(request, reply) {
    const req = request as unknown as Record<symbol, boolean>
    if (req[context.ran]) return
    req[context.ran] = true
    let r: CreateRateLimitResult
    try {
      r = await countRequest(context, l, request, true, routeGroupId)
    } catch (err) {
      const headers = (err as { headers?: Record<string, string> }).headers
      if ((err as { code?: string }).code === 'FRG_RATE_LIMIT_UNAVAILABLE' && headers) reply.headers(headers)
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
    const refusal: ErrorResponseBuilderContext = {
      statusCode: 429,
      ban: false,
      max: r.max,
      ttl: r.ttl,
      after: formatLong(ttlInSeconds * 1000),
    }
    if (r.isBanned) {
      refusal.statusCode = 403
      refusal.ban = true
      params.onBanReach(request, r.key)
    }
    throw params.errorResponseBuilder(request, refusal)
  }
