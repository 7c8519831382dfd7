import { createHash } from 'node:crypto'
import type { FastifyRequest } from 'fastify'
import type { PrincipalFunction } from '../shared/principal.ts'

/**
 * Returns the identity a request's quota belongs to; null or undefined: the policy does not apply.
 * `principal` is the plugin's `principal` option (or the session plugin's), for keys by caller.
 */
export type KeyFunction = (request: FastifyRequest, principal: PrincipalFunction) => string | null | undefined

/** Longest key material hashed; longer client input is cut first so hashing cost stays bounded. */
export const MAX_KEY_INPUT = 512

/**
 * The hash tag of a key identity. Client-supplied parts (usernames, headers, forwarded IPs) never
 * reach Redis as they are: 132 bits of SHA-256 keep keys short, uniform and free of `{}` that
 * would change the Cluster slot.
 */
export function identityTag(identity: string): string {
  const input = identity.length > MAX_KEY_INPUT ? identity.slice(0, MAX_KEY_INPUT) : identity
  return createHash('sha256').update(input).digest('base64url').slice(0, 22)
}

/**
 * Key functions that read what exists only from preHandler on (the session, set in preParsing; the
 * parsed body). In an onRequest policy they would return null on every request and the policy
 * would silently limit nothing, so such a policy is refused at boot.
 */
export const needsPreHandler = new WeakSet<KeyFunction>()
const late = <F extends KeyFunction>(key: F): F => {
  needsPreHandler.add(key)
  return key
}

/** Ready-made key functions; each prefixes its kind so 'ip:1' and 'customer:1' never share a quota. */
export const keyBy = {
  ip: (request: FastifyRequest): string => `ip:${request.ip}`,
  /** The caller, as the plugin's `principal` option says (needs hook 'preHandler'); anonymous: no limit. */
  customer: late((request: FastifyRequest, principal: PrincipalFunction): string | null => {
    const who = principal(request)
    return who ? `customer:${who}` : null
  }),
  /** A string field of the parsed, validated body: needs hook 'preHandler'. */
  bodyField: (field: string) =>
    late((request: FastifyRequest): string | null => {
      const value = (request.body as Record<string, unknown> | undefined)?.[field]
      return typeof value === 'string' && value.length > 0 ? `${field}:${value}` : null
    }),
  header:
    (name: string) =>
    (request: FastifyRequest): string | null => {
      const value = request.headers[name.toLowerCase()]
      return typeof value === 'string' && value.length > 0 ? `${name}:${value}` : null
    },
}
