import fastifyCookie from '@fastify/cookie'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { observePluginRedis, whenMetricsReady } from '../shared/metrics.ts'
import '../shared/principal.ts'
import { HttpProblem, sendProblem } from '../shared/problem.ts'
import { awaitRedisAtBoot, pluginRedis, type RedisClient } from '../shared/redis.ts'
import { type SessionRecord, SessionStore, sessionStoreUnavailable } from './store.ts'

export { type SessionRecord, SessionStore }

export interface SessionPluginOptions {
  /** Signing secrets, each at least 32 characters; the first signs, all verify (rotation). */
  secrets: string[]
  /** Any ioredis Redis or Cluster; defaults to the redis plugin's `app.redis`. Never closed by this plugin. */
  redis?: RedisClient
  /** Cookie name; with `secure` it gets the `__Host-` prefix. Default `sid`. */
  cookieName?: string
  /** Sends the cookie with Secure (turn on behind HTTPS and in production). Default false. */
  secure?: boolean
  sameSite?: 'lax' | 'strict'
  /** Idle expiry, slid on every request that presents the session. Default 30 minutes. */
  idleTimeoutMs?: number
  /** Lifetime from login regardless of activity. Default 8 hours. */
  absoluteTimeoutMs?: number
  /** Prepended to every session and index key. Default `sess:`. */
  keyPrefix?: string
}

declare module 'fastify' {
  interface FastifyInstance {
    sessions: SessionStore
  }
  interface FastifyRequest {
    /** The session presented by a valid signed cookie, loaded and touched; null when none. */
    session: SessionRecord | null
    /** True when the session could not be loaded because Redis failed. */
    sessionUnavailable: boolean
  }
  interface FastifyReply {
    /**
     * Starts a session for `principal` with a new id, destroying the one presented (no fixation).
     * Rejects with a 503 HttpProblem (`session-store-unavailable`, Retry-After: 1) when Redis fails.
     */
    regenerateSession(principal: string, data?: Record<string, string>): Promise<SessionRecord>
    /** Destroys the presented session server-side and clears the cookie; 503 HttpProblem when Redis fails. */
    destroySession(): Promise<void>
  }
  interface FastifyContextConfig {
    /** 'required': 401 without a session, 503 when sessions cannot be checked. */
    session?: 'required' | 'optional'
  }
}

function validate(options: SessionPluginOptions): Required<Omit<SessionPluginOptions, 'redis'>> {
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
  const sameSite = options.sameSite ?? 'lax'
  if (sameSite !== 'lax' && sameSite !== 'strict') fail("`sameSite` must be 'lax' or 'strict'")
  const cookieName = options.cookieName ?? 'sid'
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(cookieName)) fail('`cookieName` must be 1-32 letters, digits, _ or -')
  return {
    secrets: options.secrets,
    secure: options.secure ?? false,
    sameSite,
    cookieName,
    idleTimeoutMs,
    absoluteTimeoutMs,
    keyPrefix: options.keyPrefix ?? 'sess:',
  }
}

/** Verified cookies remembered per process (about 100 bytes each). */
const VERIFIED_COOKIES = 10_000

async function sessionPlugin(app: FastifyInstance, rawOptions: SessionPluginOptions) {
  const options = validate(rawOptions)
  const redis = pluginRedis(app, 'session', rawOptions.redis)
  await awaitRedisAtBoot(app, redis, 'session')
  const store = new SessionStore(redis, options)
  const signer = fastifyCookie.signerFactory(options.secrets)
  const cookieName = options.secure ? `__Host-${options.cookieName}` : options.cookieName
  const cookieOptions = {
    path: '/',
    httpOnly: true,
    sameSite: options.sameSite,
    secure: options.secure,
    maxAge: Math.ceil(options.absoluteTimeoutMs / 1000),
  } as const

  if (!app.hasRequestDecorator('cookies')) await app.register(fastifyCookie)
  app.decorate('sessions', store)
  // How the rate-limit and idempotency plugins learn who the caller is, unless told otherwise.
  app.decorate('sessionPrincipal', (request: FastifyRequest) => request.session?.principal ?? null)
  whenMetricsReady(app, (metrics) => observePluginRedis(app, metrics, redis, 'session'))
  app.decorateRequest('session', null)
  app.decorateRequest('sessionUnavailable', false)

  const setCookie = (reply: FastifyReply, id: string) =>
    reply.setCookie(cookieName, signer.sign(id), cookieOptions)

  app.decorateReply('regenerateSession', async function (this: FastifyReply, principal, data) {
    // A session was presented but could not be loaded: it cannot be destroyed either, and a login
    // that left it alive would break the promise that the pre-login id is dead.
    if (this.request.sessionUnavailable) throw sessionStoreUnavailable()
    const previous = this.request.session
    // The presented id is deleted before the new one exists: after login it is dead server-side.
    if (previous) {
      await store.destroy(previous.id, previous.principal)
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
    if (current) await store.destroy(current.id, current.principal)
    this.request.session = null
    this.clearCookie(cookieName, {
      path: '/',
      httpOnly: true,
      secure: options.secure,
      sameSite: options.sameSite,
    })
  })

  // The load starts in onRequest and is awaited in preParsing, so later onRequest hooks (the rate
  // limiter's per-IP bucket) send their Redis commands while it is in flight: one round trip for
  // both instead of two. `request.session` is therefore set from preParsing on.
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

  app.addHook('preParsing', async (request: FastifyRequest, reply: FastifyReply) => {
    await loading.get(request)
    if (request.routeOptions.config.session !== 'required' || request.session) return
    const problem = request.sessionUnavailable
      ? sessionStoreUnavailable()
      : new HttpProblem(401, 'unauthenticated', 'Authentication required', 'Log in first.')
    sendProblem(reply, problem)
    return reply
  })
}

export default fp(sessionPlugin, { name: 'fastify-redis-gateway/session', fastify: '5.x' })
