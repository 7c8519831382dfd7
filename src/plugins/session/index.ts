import fastifyCookie from '@fastify/cookie'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { observePluginRedis, whenMetricsReady } from '../common/metrics.ts'
import '../common/principal.ts'
import { describeValue } from '../../redis/client.ts'
import { bootPluginRedis } from '../../redis/server.ts'
import { optionChecker } from '../common/options.ts'
import { sendProblem } from '../common/problem.ts'
import { contextCovered, pluginRegistered, routeCovered } from '../common/route-coverage.ts'
import { routeName } from '../common/route-hooks.ts'
import { type SessionPluginOptions, validateOptions } from './options.ts'
import { requireSession, unauthenticated } from './require-session.ts'
import { detachSession, MAX_FIELD_BYTES, MAX_SESSION_BYTES, Session, type SessionValue } from './session.ts'
import {
  MAX_INDEX_SCAN,
  MAX_LISTED_SESSIONS,
  type SessionInfo,
  type SessionLifetime,
  type SessionRecord,
  SessionStore,
  sessionHandle,
  sessionStoreUnavailable,
} from './store.ts'

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

/**
 * The name the cookie is sent under. `__Host-` needs Secure, `Path=/` and no Domain; `__Secure-`
 * needs Secure only. Under `secure: 'auto'` a plain HTTP response carries no Secure attribute, which
 * a browser refuses for a prefixed name: no prefix then.
 */
export function sessionCookieName(options: {
  cookieName?: string
  secure?: boolean | 'auto'
  domain?: string | undefined
  path?: string
}): string {
  const name = options.cookieName ?? 'sid'
  if (options.secure !== true) return name
  return options.domain === undefined && (options.path ?? '/') === '/' ? `__Host-${name}` : `__Secure-${name}`
}

/** Verified cookies remembered per process (about 100 bytes each). */
const VERIFIED_COOKIES = 10_000

const routeConfig = optionChecker('session plugin')

async function sessionPlugin(app: FastifyInstance, rawOptions: SessionPluginOptions) {
  const options = validateOptions(rawOptions)
  pluginRegistered(app, 'session')
  // The hooks below are instance hooks: they run for every route of this context, declared before
  // the plugin or after it. Routes of other contexts that ask for a session are taken one by one.
  contextCovered(app, 'session')
  app.addHook('onRoute', (route) => {
    const wanted = (route.config as { session?: unknown } | undefined)?.session
    if (wanted === undefined) return
    if (wanted !== 'required' && wanted !== 'optional')
      routeConfig.fail(
        `route ${routeName(route)}: \`config.session\` must be 'required' or 'optional', got ${describeValue(wanted)}`,
      )
    routeCovered(app, 'session', route)
  })
  // Sessions are cache-like (an evicted one means logging in again), so an evicting Redis is worth
  // a warning, not a refusal.
  const redis = await bootPluginRedis(app, 'session', {
    redis: rawOptions.redis,
    connectTimeoutMs: options.connectTimeoutMs,
    eviction: 'warn',
  })
  const store = new SessionStore(redis, options)
  const signer = fastifyCookie.signerFactory(options.secrets)
  const cookieName = sessionCookieName(options)
  const attributes = (secure: boolean) => ({
    path: options.path,
    ...(options.domain === undefined ? {} : { domain: options.domain }),
    httpOnly: true,
    secure,
    // A browser refuses SameSite=None and Partitioned without Secure: a plain HTTP response under
    // `secure: 'auto'` gets Lax and no Partitioned.
    sameSite: secure || options.sameSite !== 'none' ? options.sameSite : ('lax' as const),
    ...(secure && options.partitioned ? { partitioned: true } : {}),
  })
  const secureAttributes = attributes(true)
  const plainAttributes = attributes(false)
  const fixedAttributes = options.secure === true ? secureAttributes : plainAttributes
  const cookieOptionsFor =
    options.secure === 'auto'
      ? (request: FastifyRequest) => (request.protocol === 'https' ? secureAttributes : plainAttributes)
      : () => fixedAttributes

  if (!app.hasRequestDecorator('cookies')) await app.register(fastifyCookie)
  app.decorate('sessions', store)
  // How the rate-limit and idempotency plugins learn who the caller is, unless told otherwise.
  // An anonymous session ('' principal) is nobody.
  app.decorate('sessionPrincipal', (request: FastifyRequest) => request.session?.principal || null)
  whenMetricsReady(app, (metrics) => observePluginRedis(app, metrics, redis, 'session'))
  app.decorateRequest('session', null)
  app.decorateRequest('sessionUnavailable', false)

  // Max-Age is the session's own lifetime: the plugin's, or the one its login asked for.
  const setCookie = (reply: FastifyReply, session: Session) =>
    reply.setCookie(cookieName, signer.sign(session.id), {
      ...cookieOptionsFor(reply.request),
      maxAge: Math.ceil((session.absoluteExpiresAt - session.createdAt) / 1000),
    })

  /** A request's anonymous session: stored, and its cookie set, on its first change. */
  const anonymousSession = (request: FastifyRequest, reply: FastifyReply) =>
    store.unsavedAnonymous({
      stored: (session) => setCookie(reply, session),
      // The presented session could not be loaded: storing a new one would silently replace it.
      blocked: () => (request.sessionUnavailable ? sessionStoreUnavailable() : null),
    })

  app.decorateReply('regenerateSession', async function (this: FastifyReply, principal, data, lifetime) {
    // A session was presented but could not be loaded: it cannot be destroyed either, and a login
    // that left it alive would break the promise that the pre-login id is dead.
    if (this.request.sessionUnavailable) throw sessionStoreUnavailable()
    // A wrong lifetime is the caller's mistake: refused before the presented session is touched.
    store.checkLifetime(lifetime)
    const previous = this.request.session
    // The presented id (signed in or anonymous) is deleted before the new one exists: after login it
    // is dead server-side. Unsaved changes of the previous session are dropped with it.
    if (previous) {
      detachSession(previous)
      if (previous.id !== '') await store.destroy(previous.id, previous.principal || undefined)
      this.request.session = null
    }
    const created = await store.create(principal, data, lifetime)
    this.request.session = created
    setCookie(this, created)
    // Login is rare and already slow (scrypt): a cheap place to keep the index bounded.
    await store.pruneIndex(principal).catch((err) => this.log.warn({ err }, 'session index prune failed'))
    return created
  })

  app.decorateReply('destroySession', async function (this: FastifyReply) {
    // Clearing the cookie of a session Redis could not load would report a logout that did not happen.
    if (this.request.sessionUnavailable) throw sessionStoreUnavailable()
    const current = this.request.session
    if (current) {
      detachSession(current)
      if (current.id !== '') await store.destroy(current.id, current.principal || undefined)
    }
    this.request.session = options.saveUninitialized ? anonymousSession(this.request, this) : null
    this.clearCookie(cookieName, cookieOptionsFor(this.request))
  })

  // The load starts in onRequest and is awaited in preParsing, so later onRequest hooks (the rate
  // limiter's per-IP bucket, the cache's prefetch) send their Redis commands while it is in flight:
  // one round trip for all of them. `request.session` is therefore set from preParsing on.
  const loading = new WeakMap<FastifyRequest, Promise<void>>()

  // An HMAC per request is a measurable share of a cached read. A signature that verified once
  // verifies forever (revocation and expiry live in Redis, checked on every load), so the last
  // VERIFIED_COOKIES verified cookies are remembered. Looking one up by its full string tells a
  // client no more than the store's own lookup by session id; forged cookies are never remembered.
  const verified = new Map<string, { value: string; renew: boolean }>()
  const unsign = (raw: string) => {
    const known = verified.get(raw)
    if (known) return known
    const result = signer.unsign(raw)
    if (!result.valid || !result.value) return null
    const entry = { value: result.value, renew: result.renew }
    if (verified.size >= VERIFIED_COOKIES) verified.delete(verified.keys().next().value!)
    verified.set(raw, entry)
    return entry
  }

  app.addHook('onRequest', (request: FastifyRequest, reply: FastifyReply, done: () => void) => {
    const raw = request.cookies[cookieName]
    const unsigned = raw && raw.length <= 256 ? unsign(raw) : null
    if (unsigned) {
      loading.set(
        request,
        store.load(unsigned.value).then(
          (session) => {
            request.session = session
            // Signed with a retired secret: re-sign with the current one.
            if (session && unsigned.renew) setCookie(reply, session)
          },
          (err) => {
            request.sessionUnavailable = true
            request.log.warn({ err }, 'session store unavailable')
          },
        ),
      )
    }
    done()
  })

  const saveUninitialized = options.saveUninitialized
  app.addHook('preParsing', async (request: FastifyRequest, reply: FastifyReply) => {
    await loading.get(request)
    if (saveUninitialized && request.session === null) request.session = anonymousSession(request, reply)
    // Anything but 'optional' is taken as 'required': a value the onRoute check did not see (a route
    // declared before the plugin) must not let a caller in unchecked.
    const wanted = request.routeOptions.config.session
    if (wanted === undefined || wanted === 'optional' || request.session?.principal) return
    sendProblem(reply, request.sessionUnavailable ? sessionStoreUnavailable() : unauthenticated())
    return reply
  })

  // Saved at the end of the request, only when it changed a field or touched the session: a request
  // that changed nothing sends nothing more to Redis. A failed save answers 503 instead of the
  // route's response (the changes are dropped, so the error response does not try again).
  app.addHook('onSend', (request: FastifyRequest, _reply: FastifyReply, payload: unknown, done) => {
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
  })
}

export default fp(sessionPlugin, { name: 'fastify-redis-gateway/session', fastify: '5.x' })
