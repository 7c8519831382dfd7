import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onRequestHookHandler,
  onRouteHookHandler,
  onSendHookHandler,
  preParsingHookHandler,
  RequestPayload,
} from 'fastify'
import { describeValue } from '../../redis/client.ts'
import type { RedisPluginContext } from '../common/context.ts'
import { channels, traced } from '../common/diagnostics.ts'
import { sendProblem } from '../common/problem.ts'
import { routeCovered } from '../common/route-coverage.ts'
import { routeName } from '../common/route-hooks.ts'
import type { SessionCookie, VerifiedCookie } from './cookie.ts'
import type { LoadResult } from './decision.ts'
import type { SessionMetrics } from './metrics.ts'
import { SESSION_OPTIONS, type ValidOptions } from './options.ts'
import { unauthenticated } from './require-session.ts'
import { detachSession, type Session, type SessionValue } from './session.ts'
import { type SessionLifetime, type SessionStore, sessionStoreUnavailable } from './store.ts'

// The plugin's handlers, each a function of the instance's context. A load the L1 cannot answer
// starts in onRequest and is awaited in preParsing, so later onRequest hooks (the rate limiter's
// per-IP bucket, the cache's prefetch) send their Redis commands while it is in flight: one round
// trip for all of them. `request.session` and `request.sessionDecision` are therefore set from
// preParsing on (from onRequest on when the L1 answered).

/**
 * What the handlers of one plugin instance share, built at registration and never reassigned: the
 * common context (child logger, instruments, the Redis client, the principal: who the request's
 * session belongs to, for the rate-limit and idempotency plugins; an anonymous session is nobody)
 * and the session's own parts.
 */
export interface SessionContext extends RedisPluginContext<SessionMetrics> {
  readonly options: ValidOptions
  readonly store: SessionStore
  readonly cookie: SessionCookie
  /** Loads started in onRequest, awaited in preParsing. */
  readonly loading: WeakMap<FastifyRequest, Promise<void>>
}

/** Takes (for the ready-time coverage check) every route asking for a session; a wrong `config.session` fails. */
export const checkRouteConfig =
  (app: FastifyInstance): onRouteHookHandler =>
  (route) => {
    const wanted = (route.config as { session?: unknown } | undefined)?.session
    if (wanted === undefined) return
    if (wanted !== 'required' && wanted !== 'optional')
      SESSION_OPTIONS.checker.fail(
        `route ${routeName(route)}: \`config.session\` must be 'required' or 'optional', got ${describeValue(wanted)}`,
      )
    routeCovered(app, 'session', route)
  }

/**
 * onRequest: refuses a cookie no secret signed, or loads the session it names: at once when the L1
 * holds it, otherwise started here and awaited in preParsing.
 */
export const startLoad = (ctx: SessionContext): onRequestHookHandler =>
  // Named for tracers: @fastify/otel's span reads `onRequest - session`.
  function session(request, reply, done) {
    const cookie = ctx.cookie.read(request)
    if (cookie === false) request.sessionDecision = 'forged'
    else if (cookie !== null) {
      const loaded = ctx.store.loadPresented(cookie.id)
      if (!(loaded instanceof Promise)) presented(ctx, request, reply, cookie, loaded)
      else
        ctx.loading.set(
          request,
          loaded.then(
            (result) => presented(ctx, request, reply, cookie, result),
            (err) => {
              request.sessionDecision = 'unavailable'
              request.sessionUnavailable = true
              ctx.log.warn(
                { err, reqId: request.id },
                'store unavailable: the presented session was not loaded',
              )
            },
          ),
        )
    }
    done()
  }

/** What loading the presented cookie's session found, on the request. */
function presented(
  ctx: SessionContext,
  request: FastifyRequest,
  reply: FastifyReply,
  cookie: VerifiedCookie,
  { decision, session }: LoadResult,
): void {
  request.sessionDecision = decision
  request.session = session
  // Signed with a retired secret: re-sign with the current one.
  if (session && cookie.renew) ctx.cookie.set(reply, session)
}

/**
 * preParsing: the loaded session (or an anonymous one), and the 401/503 of a required route without
 * one. Callback-style: with nothing in flight and no tracer listening it settles without a promise.
 */
export const settleSession = (ctx: SessionContext): preParsingHookHandler =>
  function session(request, reply, payload, done) {
    const load = ctx.loading.get(request)
    if (load === undefined && !channels.session.hasSubscribers) {
      withAnonymous(ctx, request, reply)
      admit(ctx, request, reply, payload, done)
      return
    }
    traced(
      channels.session,
      () => ({ request, decision: null }),
      async () => {
        await load
        withAnonymous(ctx, request, reply)
      },
      (context) => {
        context.decision = request.sessionDecision
      },
    ).then(
      () => admit(ctx, request, reply, payload, done),
      (err: Error) => done(err),
    )
  }

/** Under `saveUninitialized`, a request without a session gets an anonymous one. */
function withAnonymous(ctx: SessionContext, request: FastifyRequest, reply: FastifyReply): void {
  if (!ctx.options.saveUninitialized || request.session !== null) return
  request.session = anonymousSession(ctx, request, reply)
  if (request.sessionDecision === 'none') request.sessionDecision = 'anonymous'
}

/** Counts the decision and goes on, or answers a required route without a signed-in session. */
function admit(
  ctx: SessionContext,
  request: FastifyRequest,
  reply: FastifyReply,
  payload: RequestPayload,
  done: (err?: Error | null, payload?: RequestPayload) => void,
): void {
  ctx.metrics.decisions.inc({ decision: request.sessionDecision })
  // Anything but 'optional' is taken as 'required': a value the onRoute check did not see (a route
  // declared before the plugin) must not let a caller in unchecked.
  const wanted = request.routeOptions.config.session
  if (wanted === undefined || wanted === 'optional' || request.session?.principal) done(null, payload)
  // Answered here, so the request goes no further: a callback hook that replies does not call done.
  else sendProblem(reply, request.sessionUnavailable ? sessionStoreUnavailable() : unauthenticated())
}

/**
 * onSend: saves the session when the request changed a field or touched it; a request that changed
 * nothing sends nothing more to Redis. A failed save answers 503 instead of the route's response
 * (the changes are dropped, so the error response does not try again).
 */
export const saveChanges: onSendHookHandler = function sessionSave(request, _reply, payload, done) {
  // Undefined, not null, on routes of contexts created before this plugin decorated the request.
  const current = request.session
  if (!current?.isModified()) {
    done(null, payload)
    return
  }
  current.save().then(
    () => done(null, payload),
    (err: Error) => done(err),
  )
}

/** A request's anonymous session: stored, and its cookie set, on its first change. */
function anonymousSession(ctx: SessionContext, request: FastifyRequest, reply: FastifyReply): Session {
  return ctx.store.unsavedAnonymous({
    stored: (session) => ctx.cookie.set(reply, session),
    // The presented session could not be loaded: storing a new one would silently replace it.
    blocked: () => (request.sessionUnavailable ? sessionStoreUnavailable() : null),
  })
}

/** `reply.regenerateSession`: login, with a new id, the presented session destroyed first (no fixation). */
export const regenerateSession = (ctx: SessionContext) =>
  async function regenerateSession(
    this: FastifyReply,
    principal: string,
    data?: Record<string, SessionValue>,
    lifetime?: SessionLifetime,
  ): Promise<Session> {
    // A session was presented but could not be loaded: it cannot be destroyed either, and a login
    // that left it alive would break the promise that the pre-login id is dead.
    if (this.request.sessionUnavailable) throw sessionStoreUnavailable()
    // A wrong lifetime is the caller's mistake: refused before the presented session is touched.
    ctx.store.checkLifetime(lifetime)
    const previous = this.request.session
    // The presented id (signed in or anonymous) is deleted before the new one exists: after login it
    // is dead server-side. Unsaved changes of the previous session are dropped with it.
    if (previous) {
      detachSession(previous)
      if (previous.id !== '') await ctx.store.destroy(previous.id, previous.principal || undefined)
      this.request.session = null
    }
    const created = await ctx.store.create(principal, data, lifetime)
    this.request.session = created
    ctx.cookie.set(this, created)
    // Login is rare and already slow (scrypt): a cheap place to keep the index bounded.
    await ctx.store
      .pruneIndex(principal)
      .catch((err) => ctx.log.warn({ err, reqId: this.request.id }, 'index prune failed'))
    return created
  }

/** `reply.destroySession`: logout, server-side, and the cookie cleared. */
export const destroySession = (ctx: SessionContext) =>
  async function destroySession(this: FastifyReply): Promise<void> {
    // Clearing the cookie of a session Redis could not load would report a logout that did not happen.
    if (this.request.sessionUnavailable) throw sessionStoreUnavailable()
    const current = this.request.session
    if (current) {
      detachSession(current)
      if (current.id !== '') await ctx.store.destroy(current.id, current.principal || undefined)
    }
    this.request.session = ctx.options.saveUninitialized ? anonymousSession(ctx, this.request, this) : null
    ctx.cookie.clear(this)
  }
