import fastifyCookie from '@fastify/cookie'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { isWellFormedId } from './checks.ts'
import type { ValidOptions } from './options.ts'
import type { Session } from './session.ts'

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
/** Longer cookies are refused unread: an id and its signature take about 90 characters. */
const MAX_COOKIE_LENGTH = 256

/** A presented cookie whose signature verified: the session id it carries. */
export interface VerifiedCookie {
  id: string
  /** Signed with a retired secret: re-sign it with the current one. */
  renew: boolean
}

/** The session cookie of one plugin instance: its name, attributes and signature. */
export interface SessionCookie {
  readonly name: string
  /** The request's cookie if present and signed by one of the secrets; null when absent, false when refused. */
  read(request: FastifyRequest): VerifiedCookie | null | false
  /** Sets the cookie for `session`; Max-Age is its own lifetime (the plugin's, or the one its login asked for). */
  set(reply: FastifyReply, session: Session): void
  clear(reply: FastifyReply): void
}

export function sessionCookie(options: ValidOptions): SessionCookie {
  const name = sessionCookieName(options)
  const signer = fastifyCookie.signerFactory(options.secrets)
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
  const attributesFor =
    options.secure === 'auto'
      ? (request: FastifyRequest) => (request.protocol === 'https' ? secureAttributes : plainAttributes)
      : () => fixedAttributes

  // An HMAC per request is a measurable share of a cached read. A signature that verified once
  // verifies forever (revocation and expiry live in Redis, checked on every load), so the last
  // VERIFIED_COOKIES verified cookies are remembered. Looking one up by its full string tells a
  // client no more than the store's own lookup by session id; forged cookies are never remembered.
  const verified = new Map<string, VerifiedCookie>()
  const unsign = (raw: string): VerifiedCookie | false => {
    const known = verified.get(raw)
    if (known) return known
    const result = signer.unsign(raw)
    // A signed value not of an id's form is refused like a forged one: every remembered cookie
    // carries a well-formed id, so a request that finds one checks the form no more.
    if (!result.valid || !result.value || !isWellFormedId(result.value)) return false
    const entry = { id: result.value, renew: result.renew }
    if (verified.size >= VERIFIED_COOKIES) verified.delete(verified.keys().next().value!)
    verified.set(raw, entry)
    return entry
  }

  return {
    name,
    read(request) {
      const raw = request.cookies[name]
      if (raw === undefined || raw === '') return null
      return raw.length <= MAX_COOKIE_LENGTH && unsign(raw)
    },
    set(reply, session) {
      reply.setCookie(name, signer.sign(session.id), {
        ...attributesFor(reply.request),
        maxAge: Math.ceil((session.absoluteExpiresAt - session.createdAt) / 1000),
      })
    },
    clear(reply) {
      reply.clearCookie(name, attributesFor(reply.request))
    },
  }
}
