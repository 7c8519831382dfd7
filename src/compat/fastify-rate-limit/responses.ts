import { isIPv6 } from 'node:net'
import type { FastifyRequest } from 'fastify'
import { clientAddress } from '../../plugins/rate-limit/keys.ts'
import type { ErrorResponseBuilderContext } from './types.ts'

// What @fastify/rate-limit derives from a request and answers with: the IP key, the default 429.

export const DEFAULT_IPV6_SUBNET = 64

/** @fastify/rate-limit's normalizeIP: IPv4 lower-cased, mapped IPv6 as IPv4, IPv6 as its /subnet start. */
export function normalizeIP(ip: string, ipv6Subnet = DEFAULT_IPV6_SUBNET): string {
  if (!isIPv6(ip)) return ip.toLowerCase()
  const mapped = clientAddress(ip, DEFAULT_IPV6_SUBNET)
  if (!mapped.includes(':')) return mapped
  const groups = clientAddress(ip, 128)
    .split(':')
    .map((g) => Number.parseInt(g, 16))
  if (ipv6Subnet < 128) {
    for (let i = 0; i < 8; i++) {
      const bits = Math.max(0, Math.min(16, ipv6Subnet - i * 16))
      groups[i] = groups[i]! & (bits === 0 ? 0 : (0xffff << (16 - bits)) & 0xffff)
    }
  }
  return compressIPv6(groups)
}

/** RFC 5952 text: the longest run of two or more zero groups (the first of equals) becomes `::`. */
function compressIPv6(groups: number[]): string {
  let best = -1
  let bestLength = 1
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++
      continue
    }
    let j = i
    while (j < 8 && groups[j] === 0) j++
    if (j - i > bestLength) {
      best = i
      bestLength = j - i
    }
    i = j
  }
  const hex = groups.map((g) => g.toString(16))
  if (best < 0) return hex.join(':')
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLength).join(':')}`
}

/** @lukeed/ms's format(ms, true), which @fastify/rate-limit's default message uses. */
export function formatLong(ms: number): string {
  const unit = (value: number, name: string) => {
    const n = Math.round(value)
    return `${n} ${name}${n !== 1 ? 's' : ''}`
  }
  if (ms < 1000) return `${ms} ms`
  if (ms < 60_000) return unit(ms / 1000, 'second')
  if (ms < 3_600_000) return unit(ms / 60_000, 'minute')
  if (ms < 86_400_000) return unit(ms / 3_600_000, 'hour')
  if (ms < 31_557_600_000) return unit(ms / 86_400_000, 'day')
  return unit(ms / 31_557_600_000, 'year')
}

export function defaultErrorResponse(_request: FastifyRequest, context: ErrorResponseBuilderContext) {
  const err = new Error(`Rate limit exceeded, retry in ${context.after}`) as Error & { statusCode: number }
  err.statusCode = context.statusCode
  return err
}

/** Seconds before Redis is asked again once it failed (the engine's `retryRedisAfterMs`). */
export const REDIS_RETRY_AFTER_S = 1

/**
 * Redis could not be asked and skipOnError is false: 503 with `Retry-After` and the suite's code,
 * not the client's error text. `headers` is applied by Fastify's default error handler; the hook
 * also sets it on the reply for error handlers of the app's own.
 */
export function unavailableError() {
  const err = new Error('Rate limit cannot be checked now; retry shortly') as Error & {
    statusCode: number
    code: string
    headers: Record<string, string>
  }
  err.statusCode = 503
  err.code = 'FRG_RATE_LIMIT_UNAVAILABLE'
  err.headers = { 'retry-after': String(REDIS_RETRY_AFTER_S) }
  return err
}
