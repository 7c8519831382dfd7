import { createHash } from 'node:crypto'
import type { FastifyRequest } from 'fastify'
import type { PrincipalFunction } from '../common/principal.ts'

/**
 * Returns the identity a request's quota belongs to; null or undefined: the policy does not apply.
 * `principal` is the plugin's `principal` option (or the session plugin's), for keys by caller.
 */
export type KeyFunction = (request: FastifyRequest, principal: PrincipalFunction) => string | null | undefined

/** Longest identity the engine remembers the tag of; longer ones are hashed on each request. */
const MAX_CACHED_IDENTITY = 512

/**
 * The hash tag of a key identity. Client-supplied parts (usernames, headers, forwarded IPs) never
 * reach Redis as they are: 132 bits of SHA-256 keep keys short, uniform and free of `{}` that
 * would change the Cluster slot. The whole identity is hashed, however long: two identities that
 * differ anywhere have counters of their own.
 */
export function identityTag(identity: string): string {
  return createHash('sha256').update(identity).digest('base64url').slice(0, 22)
}

/**
 * Hashing is most of the per-request CPU outside Redis: recent identities keep their tag. Only
 * short identities are remembered: 10000 long client-supplied strings (a body field can be a
 * megabyte) would otherwise be held here.
 */
export class IdentityTags {
  private readonly tags = new Map<string, string>()

  of(identity: string): string {
    if (identity.length > MAX_CACHED_IDENTITY) return identityTag(identity)
    let tag = this.tags.get(identity)
    if (tag === undefined) {
      if (this.tags.size >= 10_000) this.tags.clear()
      tag = identityTag(identity)
      this.tags.set(identity, tag)
    }
    return tag
  }
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

/** The IPv6 prefix length clients are grouped by unless the plugin's `ipv6Subnet` says otherwise. */
export const DEFAULT_IPV6_SUBNET = 64

const HEX_GROUP = /^[0-9a-f]{1,4}$/i
const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/

/** The eight 16-bit groups of an IPv6 address (zone, `::` and a dotted IPv4 tail allowed), or null. */
export function ipv6Groups(address: string): number[] | null {
  const zone = address.indexOf('%')
  const text = zone === -1 ? address : address.slice(0, zone)
  const halves = text.split('::')
  if (halves.length > 2) return null
  const parse = (part: string): number[] | null => {
    if (part === '') return []
    const groups: number[] = []
    const items = part.split(':')
    for (let i = 0; i < items.length; i++) {
      const item = items[i]!
      const v4 = i === items.length - 1 ? IPV4.exec(item) : null
      if (v4) {
        const octets = v4.slice(1).map(Number)
        if (octets.some((o) => o > 255)) return null
        groups.push((octets[0]! << 8) | octets[1]!, (octets[2]! << 8) | octets[3]!)
      } else if (HEX_GROUP.test(item)) groups.push(Number.parseInt(item, 16))
      else return null
    }
    return groups
  }
  const head = parse(halves[0]!)
  const tail = halves.length === 2 ? parse(halves[1]!) : []
  if (!head || !tail) return null
  const missing = 8 - head.length - tail.length
  if (halves.length === 2 ? missing < 1 : missing !== 0) return null
  return [...head, ...new Array<number>(missing).fill(0), ...tail]
}

/**
 * The client a request's address stands for: an IPv4 address as it is; an IPv6 address as its
 * first `subnet` bits (`2001:db8:0:0::/64`), since one client usually holds a whole /64; an
 * IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) as the IPv4 address. 128 keeps every IPv6 address
 * apart (in full form, so every spelling of one address is one client). Anything that does not
 * parse is returned unchanged.
 */
export function clientAddress(ip: string, subnet: number = DEFAULT_IPV6_SUBNET): string {
  if (ip.indexOf(':') === -1) return ip
  const groups = ipv6Groups(ip)
  if (!groups) return ip
  if (
    groups[5] === 0xffff &&
    groups[0] === 0 &&
    groups[1] === 0 &&
    groups[2] === 0 &&
    groups[3] === 0 &&
    groups[4] === 0
  )
    return `${groups[6]! >> 8}.${groups[6]! & 255}.${groups[7]! >> 8}.${groups[7]! & 255}`
  if (subnet >= 128) return groups.map((g) => g.toString(16)).join(':')
  const kept = Math.ceil(subnet / 16)
  const parts: string[] = []
  for (let i = 0; i < kept; i++) {
    const bits = Math.min(16, subnet - i * 16)
    const mask = bits === 16 ? 0xffff : (0xffff << (16 - bits)) & 0xffff
    parts.push((groups[i]! & mask).toString(16))
  }
  return `${parts.join(':')}::/${subnet}`
}

/** keyBy.ip with another IPv6 prefix length (the plugin's `ipv6Subnet`); one function per length. */
const ipKeys = new Map<number, (request: FastifyRequest) => string>()
export function ipKey(subnet: number): (request: FastifyRequest) => string {
  if (subnet === DEFAULT_IPV6_SUBNET) return keyBy.ip
  let key = ipKeys.get(subnet)
  if (!key) {
    key = (request) => {
      const ip = request.ip
      return typeof ip === 'string' && ip.indexOf(':') !== -1 ? `ip:${clientAddress(ip, subnet)}` : `ip:${ip}`
    }
    ipKeys.set(subnet, key)
  }
  return key
}

/** Ready-made key functions; each prefixes its kind so 'ip:1' and 'customer:1' never share a quota. */
export const keyBy = {
  /** The client address: IPv4 as it is, IPv6 grouped by /64 (the plugin's `ipv6Subnet` for its policies). */
  ip: (request: FastifyRequest): string => {
    const ip = request.ip
    // Not a string only for a socket already gone: one shared identity, as before any parsing.
    return typeof ip === 'string' && ip.indexOf(':') !== -1
      ? `ip:${clientAddress(ip, DEFAULT_IPV6_SUBNET)}`
      : `ip:${ip}`
  },
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
