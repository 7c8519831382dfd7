import fastifyCookie from '@fastify/cookie'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { observePluginRedis, whenMetricsReady } from '../common/metrics.ts'
import '../common/principal.ts'
import { HttpProblem, sendProblem } from '../common/problem.ts'
import { awaitRedisAtBoot, pluginRedis, type RedisClient } from '../common/redis.ts'
import { detachSession, MAX_FIELD_BYTES, MAX_SESSION_BYTES, Session, type SessionValue } from './session.ts'
import { type SessionRecord, SessionStore, sessionStoreUnavailable } from './store.ts'

export { MAX_FIELD_BYTES, MAX_SESSION_BYTES, Session, type SessionRecord, SessionStore, type SessionValue }

export interface SessionPluginOptions {
  /** Signing secrets, each at least 32 characters; the first signs, all verify (rotation). */
  secrets: string[]
  /** Any ioredis Redis or Cluster; defaults to the redis plugin's `app.redis`. Never closed by this plugin. */
  redis?: RedisClient
  /**
   * Cookie name. With `secure: true` it gets the `__Host-` prefix (`Path=/`, no `Domain`), or
   * `__Secure-` when `domain` or another `path` is set; no prefix otherwise. Default `sid`.
   */
  cookieName?: string
  /**
   * Sends the cookie with Secure (turn on behind HTTPS and in production). `'auto'`: Secure when
   * the request came over HTTPS (`request.protocol === 'https'`), and the name has no prefix. Default false.
   */
  secure?: boolean | 'auto'
  /** Default `'lax'`. `'none'` needs `secure` (true or 'auto'; under 'auto' a plain HTTP response gets Lax). */
  sameSite?: 'lax' | 'strict' | 'none'
  /** The cookie's Domain attribute (sent to subdomains too). Default none: this host only. */
  domain?: string
  /** The cookie's Path attribute. Default `/`. */
  path?: string
  /** The Partitioned attribute (CHIPS), for a session inside a third-party frame; needs `secure`. Default false. */
  partitioned?: boolean
  /**
   * True: a request without a session gets an anonymous one (no principal), stored in Redis and
   * sent as a cookie as soon as something is set on it; an untouched one is never stored. Default
   * false: `request.session` is null until login.
   */
  saveUninitialized?: boolean
  /** Idle expiry, slid on every request that presents the session. Default 30 minutes. */
  idleTimeoutMs?: number
  /** Lifetime from login regardless of activity. Default 8 hours. */
  absoluteTimeoutMs?: number
  /**
   * A request slides the idle expiry only when this instance last did so for that session at least
   * this long ago, so most requests write nothing to Redis; a session then expires between
   * `idleTimeoutMs - touchAfterMs` and `idleTimeoutMs` after its last request. 0 slides it on every
   * request. Default `idleTimeoutMs / 20` (90 s of the default 30 minutes).
   */
  touchAfterMs?: number
  /** Prepended to every session and index key. Default `sess:`. */
  keyPrefix?: string
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
     * an anonymous one when none was presented; else null. Set from preParsing on.
     */
    session: RequestSession | null
    /** True when the session could not be loaded because Redis failed. */
    sessionUnavailable: boolean
  }
  interface FastifyReply {
    /**
     * Starts a session for `principal` with a new id, destroying the one presented (no fixation).
     * Rejects with a 503 HttpProblem (`session-store-unavailable`, Retry-After: 1) when Redis fails.
     */
    regenerateSession(principal: string, data?: Record<string, SessionValue>): Promise<RequestSession>
    /** Destroys the presented session server-side and clears the cookie; 503 HttpProblem when Redis fails. */
    destroySession(): Promise<void>
  }
  interface FastifyContextConfig {
    /** 'required': 401 without a signed-in session (an anonymous one does not count), 503 when sessions cannot be checked. */
    session?: 'required' | 'optional'
  }
}

interface ValidOptions {
  secrets: string[]
  cookieName: string
  secure: boolean | 'auto'
  sameSite: 'lax' | 'strict' | 'none'
  domain: string | undefined
  path: string
  partitioned: boolean
  saveUninitialized: boolean
  idleTimeoutMs: number
  absoluteTimeoutMs: number
  touchAfterMs: number | undefined
  keyPrefix: string
}

const DOMAIN =
  /^\.?(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/
/** Printable ASCII but space and `;` (RFC 6265 path-value), at most 1024 characters. */
const COOKIE_PATH = /^\/[\x21-\x3A\x3C-\x7E]{0,1023}$/

function validate(options: SessionPluginOptions): ValidOptions {
  if (typeof options !== 'object' || options === null) throw new Error('session plugin: options are required')
  const fail = (message: string) => {
    throw new Error(`session plugin: ${message}`)
  }
  if (!Array.isArray(options.secrets) || options.secrets.length === 0)
    fail('`secrets` must be a non-empty array')
  if (options.secrets.some((s) => typeof s !== 'string' || s.length < 32)) {
    fail('every secret in `secrets` must be a string of at least 32 characters')
  }
  const idleTimeoutMs = options.idleTimeoutMs ?? 30 * 60_000
  const absoluteTimeoutMs = options.absoluteTimeoutMs ?? 8 * 3_600_000
  if (!Number.isSafeInteger(idleTimeoutMs) || idleTimeoutMs <= 0)
    fail('`idleTimeoutMs` must be a positive integer')
  if (!Number.isSafeInteger(absoluteTimeoutMs) || absoluteTimeoutMs < idleTimeoutMs) {
    fail('`absoluteTimeoutMs` must be an integer no smaller than `idleTimeoutMs`')
  }
  // Its default lives in the store (SessionStore is usable on its own).
  const touchAfterMs = options.touchAfterMs
  if (
    touchAfterMs !== undefined &&
    (!Number.isSafeInteger(touchAfterMs) || touchAfterMs < 0 || touchAfterMs >= idleTimeoutMs)
  )
    fail('`touchAfterMs` must be an integer from 0 to below `idleTimeoutMs`')
  const secure = options.secure ?? false
  if (secure !== true && secure !== false && secure !== 'auto') fail("`secure` must be true, false or 'auto'")
  const sameSite = options.sameSite ?? 'lax'
  if (sameSite !== 'lax' && sameSite !== 'strict' && sameSite !== 'none')
    fail("`sameSite` must be 'lax', 'strict' or 'none'")
  if (sameSite === 'none' && secure === false) fail("`sameSite: 'none'` requires `secure` (true or 'auto')")
  const partitioned = options.partitioned ?? false
  if (typeof partitioned !== 'boolean') fail('`partitioned` must be a boolean')
  if (partitioned && secure === false) fail("`partitioned` requires `secure` (true or 'auto')")
  const domain = options.domain
  if (domain !== undefined && (typeof domain !== 'string' || !DOMAIN.test(domain)))
    fail('`domain` must be a host name such as example.com')
  const path = options.path ?? '/'
  if (typeof path !== 'string' || !COOKIE_PATH.test(path))
    fail('`path` must start with / and hold no spaces, semicolons or control characters')
  const saveUninitialized = options.saveUninitialized ?? false
  if (typeof saveUninitialized !== 'boolean') fail('`saveUninitialized` must be a boolean')
  const cookieName = options.cookieName ?? 'sid'
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(cookieName)) fail('`cookieName` must be 1-32 letters, digits, _ or -')
  return {
    secrets: options.secrets,
    secure,
    sameSite,
    domain,
    path,
    partitioned,
    saveUninitialized,
    cookieName,
    idleTimeoutMs,
    absoluteTimeoutMs,
    touchAfterMs,
    keyPrefix: options.keyPrefix ?? 'sess:',
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

async function sessionPlugin(app: FastifyInstance, rawOptions: SessionPluginOptions) {
  const options = validate(rawOptions)
  const redis = pluginRedis(app, 'session', rawOptions.redis)
  await awaitRedisAtBoot(app, redis, 'session')
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
    maxAge: Math.ceil(options.absoluteTimeoutMs / 1000),
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

  const setCookie = (reply: FastifyReply, id: string) =>
    reply.setCookie(cookieName, signer.sign(id), cookieOptionsFor(reply.request))

  /** A request's anonymous session: stored, and its cookie set, on its first change. */
  const anonymousSession = (request: FastifyRequest, reply: FastifyReply) =>
    store.unsavedAnonymous({
      stored: (id) => setCookie(reply, id),
      // The presented session could not be loaded: storing a new one would silently replace it.
      blocked: () => (request.sessionUnavailable ? sessionStoreUnavailable() : null),
    })

  app.decorateReply('regenerateSession', async function (this: FastifyReply, principal, data) {
    // A session was presented but could not be loaded: it cannot be destroyed either, and a login
    // that left it alive would break the promise that the pre-login id is dead.
    if (this.request.sessionUnavailable) throw sessionStoreUnavailable()
    const previous = this.request.session
    // The presented id (signed in or anonymous) is deleted before the new one exists: after login it
    // is dead server-side. Unsaved changes of the previous session are dropped with it.
    if (previous) {
      detachSession(previous)
      if (previous.id !== '') await store.destroy(previous.id, previous.principal || undefined)
      this.request.session = null
    }
    const created = await store.create(principal, data)
    this.request.session = created
    setCookie(this, created.id)
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
            if (session && unsigned.renew) setCookie(reply, session.id)
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
    if (request.routeOptions.config.session !== 'required' || request.session?.principal) return
    const problem = request.sessionUnavailable
      ? sessionStoreUnavailable()
      : new HttpProblem(401, 'unauthenticated', 'Authentication required', 'Log in first.')
    sendProblem(reply, problem)
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
