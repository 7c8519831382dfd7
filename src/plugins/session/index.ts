import fastifyCookie from '@fastify/cookie'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { withTimeout } from '../../redis/timeout.ts'
import { redisPluginContext } from '../common/context.ts'
import '../common/principal.ts'
import { contextCovered, pluginRegistered } from '../common/route-coverage.ts'
import { sessionCookie } from './cookie.ts'
import type { SessionDecision } from './decision.ts'
import {
  checkRouteConfig,
  destroySession,
  regenerateSession,
  type SessionContext,
  saveChanges,
  settleSession,
  startLoad,
} from './hooks.ts'
import { createSessionMetrics, l1Counters } from './metrics.ts'
import { type SessionPluginOptions, storeOptions, validateOptions } from './options.ts'
import { requireSession } from './require-session.ts'
import { MAX_FIELD_BYTES, MAX_SESSION_BYTES, Session, type SessionValue } from './session.ts'
import {
  MAX_INDEX_SCAN,
  MAX_LISTED_SESSIONS,
  type SessionInfo,
  type SessionLifetime,
  type SessionRecord,
  SessionStore,
  sessionHandle,
} from './store.ts'

export { sessionCookieName } from './cookie.ts'
export {
  SessionFieldNameError,
  SessionHandleError,
  SessionLifetimeError,
  SessionNotRegisteredError,
  SessionPrincipalError,
  SessionTooLargeError,
  SessionValueError,
} from './errors.ts'
export {
  MAX_FIELD_BYTES,
  MAX_INDEX_SCAN,
  MAX_LISTED_SESSIONS,
  MAX_SESSION_BYTES,
  requireSession,
  Session,
  type SessionDecision,
  type SessionInfo,
  type SessionLifetime,
  type SessionPluginOptions,
  type SessionRecord,
  SessionStore,
  type SessionValue,
  sessionHandle,
}

/** `Session` under another name: inside the augmentation below, `Session` is fastify's own interface. */
type RequestSession = Session

declare module 'fastify' {
  interface FastifyInstance {
    sessions: SessionStore
  }
  interface FastifyRequest {
    /**
     * The session presented by a valid signed cookie, loaded and touched; with `saveUninitialized`,
     * an anonymous one when none was presented; else null. Set from preParsing on. On a route with
     * `config: { session: 'required' }`, `requireSession(request)` returns it typed as present.
     */
    session: RequestSession | null
    /** True when the session could not be loaded because Redis failed. */
    sessionUnavailable: boolean
    /** What the plugin decided about this request's session and why ({@link SessionDecision}). */
    sessionDecision: SessionDecision
  }
  interface FastifyReply {
    /**
     * Starts a session for `principal` with a new id, destroying the one presented (no fixation).
     * `lifetime` gives this session its own idle timeout and lifetime ("remember me"), within the
     * plugin's `maxIdleTimeoutMs` / `maxAbsoluteTimeoutMs` (SessionLifetimeError otherwise); the
     * cookie's Max-Age follows. Rejects with a 503 HttpProblem (`session-store-unavailable`,
     * Retry-After: 1) when Redis fails.
     */
    regenerateSession(
      principal: string,
      data?: Record<string, SessionValue>,
      lifetime?: SessionLifetime,
    ): Promise<RequestSession>
    /** Destroys the presented session server-side and clears the cookie; 503 HttpProblem when Redis fails. */
    destroySession(): Promise<void>
  }
  interface FastifyContextConfig {
    /**
     * 'required': 401 without a signed-in session (an anonymous one does not count), 503 when
     * sessions cannot be checked; read it with `requireSession(request)`. Any other value fails at
     * registration.
     */
    session?: 'required' | 'optional'
  }
}

async function sessionPlugin(app: FastifyInstance, rawOptions: SessionPluginOptions) {
  const options = validateOptions(rawOptions)
  pluginRegistered(app, 'session')
  // The hooks below are instance hooks: they run for every route of this context, declared before
  // the plugin or after it. Routes of other contexts that ask for a session are taken one by one.
  contextCovered(app, 'session')
  app.addHook('onRoute', checkRouteConfig(app))
  const common = await redisPluginContext(app, 'session', {
    metrics: createSessionMetrics,
    // How the rate-limit and idempotency plugins learn who the caller is, unless told otherwise.
    principal: (request) => request.session?.principal || null,
    // Sessions are cache-like (an evicted one means logging in again), so an evicting Redis is
    // worth a warning, not a refusal.
    redis: { redis: options.redis, connectTimeoutMs: options.connectTimeoutMs, eviction: 'warn' },
  })
  const ctx: SessionContext = Object.freeze({
    ...common,
    options,
    store: new SessionStore(common.redis, storeOptions(options), l1Counters(common.metrics)),
    cookie: sessionCookie(options),
    loading: new WeakMap(),
  })

  // Once the app is ready, its L1 serves: registration waits for the subscription while Redis answers
  // (bounded like the wait for Redis itself; until subscribed, the L1 is bypassed, never stale).
  if (ctx.store.l1 && common.redis.status === 'ready')
    await withTimeout(ctx.store.l1.whenSubscribed(), options.connectTimeoutMs, () => {})
  if (!app.hasRequestDecorator('cookies')) await app.register(fastifyCookie)
  app.decorate('sessions', ctx.store)
  // The L1's subscriber connection is the plugin's own: closed with the app (the client never is).
  app.addHook('onClose', async () => ctx.store.close())
  app.decorate('sessionPrincipal', ctx.principal)
  app.decorateRequest('session', null)
  app.decorateRequest('sessionUnavailable', false)
  app.decorateRequest('sessionDecision', 'none')
  app.decorateReply('regenerateSession', regenerateSession(ctx))
  app.decorateReply('destroySession', destroySession(ctx))
  app.addHook('onRequest', startLoad(ctx))
  app.addHook('preParsing', settleSession(ctx))
  app.addHook('onSend', saveChanges)
}

export default fp(sessionPlugin, { name: 'fastify-redis-gateway/session', fastify: '5.x' })
