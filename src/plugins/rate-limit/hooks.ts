import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onRequestHookHandler,
  RouteOptions,
} from 'fastify'
import { channels, type RateLimitChannelContext, traced } from '../common/diagnostics.ts'
import { sendProblem } from '../common/problem.ts'
import { routeCovered } from '../common/route-coverage.ts'
import { addRouteHook, routeName } from '../common/route-hooks.ts'
import type { RateLimitContext } from './context.ts'
import { RateLimitError, RateLimitNoPolicyError } from './errors.ts'
import { routeConfigCheck } from './options.ts'
import type { Outcome, Refund } from './outcome.ts'
import { notChecked, requestLog, sendRejection, writeHeaders } from './responses.ts'
import { keepReservations } from './settlements.ts'
import type { Policy } from './types.ts'

// The plugin's hooks, each a function of the plugin instance's context: the check of a route's
// policies (onRequest or preHandler), the refund of what a success consumed (onSend), the policies
// each route gets (onRoute), the not-found handler's, and the check once the app is ready.

/** What the rate-limit channel's subscribers see of a request's check (src/plugins/common/diagnostics.ts). */
function describeOutcome(context: RateLimitChannelContext, outcome: Outcome | null): void {
  if (!outcome) return
  const decisions = outcome.decisions.filter((d) => d.policy.shadow === null).concat(outcome.shadowed)
  context.decisions = decisions.map(({ policy, allowed, remaining, limit, resetMs }) => ({
    policy: policy.name,
    algorithm: policy.algorithm,
    outcome: allowed ? 'allowed' : policy.shadow ? 'would_reject' : 'rejected',
    remaining,
    limit,
    resetMs,
    shadow: policy.shadow !== null,
  }))
  context.rejected = outcome.rejected?.policy.name ?? null
  context.degraded = outcome.degraded
  context.delayMs = outcome.delayMs
}

/** Decides a request under `policies`: headers on the way, the rejection, or the wait it was given. */
function limitHook({ engine, metrics, allow, legacyHeaders }: RateLimitContext, policies: Policy[]) {
  const giveBack = (request: FastifyRequest, releases: Refund[]) => {
    for (const release of releases)
      engine.refund(release).catch((err) =>
        // Not given back: the slot returns when its lease ends.
        requestLog(request).warn({ err, policy: release.policy.name }, 'concurrency slot not given back'),
      )
  }
  /** A check that failed (a policy's function threw, or no fallback could decide): 500 or 503, nothing consumed. */
  const refuse = (request: FastifyRequest, reply: FastifyReply, err: unknown) => {
    if (err instanceof RateLimitError)
      for (const name of err.policies) metrics.decision({ name, shadow: null }, 'error')
    sendProblem(reply, notChecked(request, err))
  }
  /** The decision applied: headers, refunds and slots kept for later, then the rejection, the wait or `done`. */
  const apply = (
    request: FastifyRequest,
    reply: FastifyReply,
    outcome: Outcome | null,
    done: (err?: Error) => void,
  ) => {
    if (!outcome) return done()
    for (const { decision, key } of outcome.wouldReject)
      requestLog(request).info(
        { policy: decision.policy.name, key: key.slice(0, 200), retryAfterMs: decision.retryMs },
        'shadow rate-limit policy would reject',
      )
    writeHeaders(reply, outcome.decisions, legacyHeaders)
    if (outcome.refunds.length)
      request.rateLimitRefunds = (request.rateLimitRefunds ?? []).concat(outcome.refunds)
    if (outcome.settlements.length) keepReservations(engine, metrics, request, reply, outcome.settlements)
    const { releases } = outcome
    if (releases.length) {
      // Refused by another policy: the slots go back now. Else when the response ends, is cut or
      // its client goes away ('close' comes in every case, after a streamed body's last byte).
      if (outcome.rejected || outcome.unavailable) giveBack(request, releases)
      else reply.raw.once('close', () => giveBack(request, releases))
    }
    // A callback hook that answers does not call `done`: the request goes no further.
    if (outcome.rejected || outcome.unavailable) sendRejection(request, reply, outcome)
    else if (outcome.delayMs > 0) setTimeout(done, outcome.delayMs)
    else done()
  }
  // Named for tracers: @fastify/otel's span reads `onRequest - rateLimit`. Callback-style: a
  // decision from a lease or the memory store, with no tracer listening, builds no promise.
  return function rateLimit(request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void) {
    let decided: Outcome | null | Promise<Outcome | null>
    try {
      if (allow?.(request)) return done()
      decided = channels.rateLimit.hasSubscribers
        ? traced(
            channels.rateLimit,
            () => ({ request, decisions: [], rejected: null, degraded: false, delayMs: 0 }),
            async () => engine.evaluate(request, policies, 'consume'),
            describeOutcome,
          )
        : engine.evaluate(request, policies, 'consume')
    } catch (err) {
      return refuse(request, reply, err)
    }
    if (!(decided instanceof Promise)) return apply(request, reply, decided, done)
    decided
      .then(
        (outcome) => apply(request, reply, outcome, done),
        (err) => refuse(request, reply, err),
      )
      // What fails past the decision (a header, a reply) goes to the error handler, as a thrown hook's would.
      .catch((err: Error) => done(err))
  }
}

/**
 * Gives back what a successful request consumed under its count-only-failures policies: in onSend,
 * before the client sees the answer, so its next attempt already finds the quota back.
 */
function refundSuccesses({ engine }: RateLimitContext) {
  return async function rateLimitRefund(request: FastifyRequest, reply: FastifyReply, payload: unknown) {
    for (const refund of request.rateLimitRefunds ?? []) {
      let failure = true
      try {
        failure = refund.policy.isFailure!(reply)
      } catch (err) {
        // A predicate that throws must not break the response: the attempt stays counted (the safe side).
        requestLog(request).error({ err, policy: refund.policy.name }, 'countOnlyFailures predicate threw')
      }
      if (failure) continue
      await engine.refund(refund).catch((err) => requestLog(request).warn({ err }, 'refund failed'))
    }
    return payload
  }
}

/** onRoute: the route's policies (the plugin's and its `config.rateLimits`) in the hooks they run in. */
export function limitRoute(app: FastifyInstance, context: RateLimitContext) {
  const refund = refundSuccesses(context)
  return function rateLimitRoute(route: RouteOptions) {
    const routeConfig = route.config as Record<string, unknown> | undefined
    if (routeConfig?.rateLimit !== undefined)
      context.routes.foreignConfigs.push({
        where: `route ${routeName(route)}: config`,
        value: routeConfig.rateLimit,
      })
    const config = route.config?.rateLimits
    if (config !== undefined) routeCovered(app, 'rateLimits', route)
    const policies = context.policies.ofRoute(route, config)
    if (policies.length === 0) return
    context.routes.limited++
    const early = policies.filter((p) => p.hook === 'onRequest')
    const late = policies.filter((p) => p.hook === 'preHandler')
    if (early.length) addRouteHook(route, 'onRequest', limitHook(context, early))
    if (late.length) addRouteHook(route, 'preHandler', limitHook(context, late) as never)
    if (policies.some((p) => p.isFailure)) addRouteHook(route, 'onSend', refund as never)
  }
}

/**
 * Requests no route matched never pass onRoute: the not-found handler of this instance (set before
 * or after the plugin) gets the plugin's policies through instance hooks, which return at once for
 * every matched route.
 */
export function limitNotFound(app: FastifyInstance, context: RateLimitContext): void {
  const { global } = context.policies
  if (global.length === 0) return
  const early = global.filter((p) => p.hook === 'onRequest')
  const late = global.filter((p) => p.hook === 'preHandler')
  const onlyNotFound = (hook: onRequestHookHandler) =>
    function rateLimitNotFound(request: FastifyRequest, reply: FastifyReply, done: () => void) {
      if (!request.is404) return done()
      hook.call(app, request, reply, done)
    }
  if (early.length) app.addHook('onRequest', onlyNotFound(limitHook(context, early) as onRequestHookHandler))
  if (late.length) app.addHook('preHandler', onlyNotFound(limitHook(context, late) as onRequestHookHandler))
  if (global.some((p) => p.isFailure)) {
    const refund = refundSuccesses(context)
    app.addHook('onSend', function rateLimitRefundNotFound(request, reply, payload, done) {
      if (!request.is404 || !request.rateLimitRefunds) return done(null, payload)
      refund(request, reply, payload).then(
        (result) => done(null, result),
        (err) => done(err),
      )
    })
  }
}

/** onReady: @fastify/rate-limit's route config without that plugin, or a plugin that limits nothing, fail the boot. */
export function checkReady(app: FastifyInstance, { policies, routes }: RateLimitContext): void {
  // Its decorator is `rateLimit`: with it registered too, `config.rateLimit` is its to read.
  if (!app.hasDecorator('rateLimit'))
    for (const { where, value } of routes.foreignConfigs)
      routeConfigCheck.known({ rateLimit: value }, ['rateLimits'], where)
  if (policies.empty && routes.limited === 0)
    throw new RateLimitNoPolicyError(
      "rate-limit plugin: no policy: the plugin is registered without `policies` or `namedPolicies` and no route it sees has `config.rateLimits`, so it limits nothing. Add `policies` (every route after the plugin), `namedPolicies` (routes name them, or app.rateLimiter uses them), or a policy in a route's `config.rateLimits`",
    )
}
