import type { FastifyReply, FastifyRequest } from 'fastify'
import { type KeyFunction, keyBy, needsPreHandler } from './keys.ts'

export type Algorithm = 'fixed-window' | 'sliding-log' | 'sliding-counter' | 'token-bucket' | 'gcra'
/** What a policy does while Redis cannot answer: allow, answer 503, or limit in this process. */
export type FailureMode = 'open' | 'closed' | 'local'

export interface RateLimitPolicy {
  /** Names the policy in headers, problems, metrics and its Redis key: 1-64 of A-Z a-z 0-9 _ . - */
  name: string
  algorithm: Algorithm
  /** Cost units allowed per window; for the token bucket, its capacity (the burst). */
  limit: number
  /** Window (GCRA: period) in ms; every algorithm except the token bucket. */
  windowMs?: number
  /** Token bucket only: tokens added per second. */
  refillPerSecond?: number
  /** Whose quota a request uses: 'ip' (default) or a function; null or undefined skips the policy. */
  key?: 'ip' | KeyFunction
  /** Units a request consumes (default 1). */
  cost?: number | ((request: FastifyRequest) => number)
  /** 'preHandler' for keys read from the parsed, validated body. Default 'onRequest'. */
  hook?: 'onRequest' | 'preHandler'
  /** Count a request only if its response is a failure (default predicate: status >= 400). */
  countOnlyFailures?: boolean | ((reply: FastifyReply) => boolean)
  /** Default 'open'. */
  onRedisError?: FailureMode
  /** With onRedisError 'local': this process's share of the limit, in (0, 1]. Default 1. */
  localShare?: number
  /** Token bucket and GCRA: wait up to this long for the next slot instead of rejecting. */
  maxDelayMs?: number
  /** Requests for which this policy is skipped: client IPs, or a predicate. */
  allowList?: AllowList
}

export type AllowList = readonly string[] | ((request: FastifyRequest) => boolean)

/** A validated policy with everything precomputed that the hot path needs. */
export interface Policy {
  name: string
  algorithm: Algorithm
  script: string
  limit: number
  windowMs: number
  refillPerSecond: number
  key: KeyFunction
  cost: number | ((request: FastifyRequest) => number)
  hook: 'onRequest' | 'preHandler'
  isFailure: ((reply: FastifyReply) => boolean) | null
  onRedisError: FailureMode
  localShare: number
  maxDelayMs: number
  allow: ((request: FastifyRequest) => boolean) | null
  /** The RateLimit-Policy item, e.g. `"ip";q=100;w=2`. */
  header: string
  /** Window in whole seconds as advertised in headers and problems. */
  windowSec: number
  /** ARGV pair before cost: limit and window ms, or capacity and refill per second. */
  args: [number, number]
}

const SCRIPTS: Record<Algorithm, string> = {
  'fixed-window': 'rateLimitFixedWindow',
  'sliding-log': 'rateLimitSlidingLog',
  'sliding-counter': 'rateLimitSlidingCounter',
  'token-bucket': 'rateLimitTokenBucket',
  gcra: 'rateLimitGcra',
}

const NAME = /^[A-Za-z0-9_.-]{1,64}$/
const positiveInt = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) > 0

export function allowListPredicate(list: AllowList | undefined): ((r: FastifyRequest) => boolean) | null {
  if (list === undefined) return null
  if (typeof list === 'function') return list
  if (!Array.isArray(list) || list.some((ip) => typeof ip !== 'string')) {
    throw new Error('rate-limit plugin: `allowList` must be an array of IP strings or a function')
  }
  const ips = new Set(list)
  return (request) => ips.has(request.ip)
}

/** Checks one policy; throws with a message naming the policy and the option. */
export function normalizePolicy(raw: RateLimitPolicy, defaults: Partial<RateLimitPolicy> = {}): Policy {
  const p = { ...defaults, ...raw }
  const name = typeof p.name === 'string' && NAME.test(p.name) ? p.name : undefined
  const fail = (message: string): never => {
    throw new Error(`rate-limit plugin: policy '${name ?? String(p.name)}': ${message}`)
  }
  if (!name) fail('`name` must be 1-64 characters of A-Z a-z 0-9 _ . -')
  if (!(p.algorithm in SCRIPTS)) {
    fail('`algorithm` must be one of fixed-window, sliding-log, sliding-counter, token-bucket, gcra')
  }
  if (!positiveInt(p.limit)) fail('`limit` must be a positive integer')
  const bucket = p.algorithm === 'token-bucket'
  if (bucket) {
    if (
      typeof p.refillPerSecond !== 'number' ||
      !(p.refillPerSecond > 0) ||
      !Number.isFinite(p.refillPerSecond)
    )
      fail('`refillPerSecond` must be a positive number')
    if (p.windowMs !== undefined) fail('`windowMs` does not apply to the token bucket (use refillPerSecond)')
  } else {
    if (!positiveInt(p.windowMs)) fail('`windowMs` must be a positive integer (milliseconds)')
    if (p.refillPerSecond !== undefined) fail('`refillPerSecond` applies to the token bucket only')
    // The arrival time is a double in ms since the epoch (resolution about 0.25 µs): an interval
    // under 10 µs per unit would stop advancing it, and the policy would never reject.
    if (p.algorithm === 'gcra' && p.limit > p.windowMs! * 100)
      fail('`limit` of a gcra policy may be at most 100 per millisecond of `windowMs`')
  }
  const cost = p.cost ?? 1
  if (typeof cost !== 'function' && (!positiveInt(cost) || cost > p.limit)) {
    fail('`cost` must be a positive integer no larger than `limit`, or a function')
  }
  const key = p.key === undefined || p.key === 'ip' ? keyBy.ip : p.key
  if (typeof key !== 'function') fail("`key` must be 'ip' or a function of the request")
  const hook = p.hook ?? 'onRequest'
  if (hook !== 'onRequest' && hook !== 'preHandler') fail("`hook` must be 'onRequest' or 'preHandler'")
  if (hook === 'onRequest' && needsPreHandler.has(key))
    fail("`key` reads the session or the body, which onRequest does not have yet: set hook: 'preHandler'")
  const onRedisError = p.onRedisError ?? 'open'
  if (!['open', 'closed', 'local'].includes(onRedisError))
    fail("`onRedisError` must be 'open', 'closed' or 'local'")
  const localShare = p.localShare ?? 1
  if (typeof localShare !== 'number' || !(localShare > 0 && localShare <= 1))
    fail('`localShare` must be in (0, 1]')
  const maxDelayMs = p.maxDelayMs ?? 0
  if (!Number.isSafeInteger(maxDelayMs) || maxDelayMs < 0) fail('`maxDelayMs` must be a non-negative integer')
  if (maxDelayMs > 0 && p.algorithm !== 'token-bucket' && p.algorithm !== 'gcra') {
    fail('`maxDelayMs` applies to token-bucket and gcra only')
  }
  const failures = p.countOnlyFailures
  const isFailure =
    typeof failures === 'function'
      ? failures
      : failures
        ? (reply: FastifyReply) => reply.statusCode >= 400
        : null
  const windowMs = bucket ? Math.ceil((p.limit * 1000) / p.refillPerSecond!) : p.windowMs!
  const windowSec = Math.max(1, Math.round(windowMs / 1000))
  return {
    name: name!,
    algorithm: p.algorithm,
    script: SCRIPTS[p.algorithm],
    limit: p.limit,
    windowMs,
    refillPerSecond: p.refillPerSecond ?? 0,
    key: key as KeyFunction,
    cost,
    hook,
    isFailure,
    onRedisError,
    localShare,
    maxDelayMs,
    allow: allowListPredicate(p.allowList),
    header: `"${name}";q=${p.limit};w=${windowSec}`,
    windowSec,
    args: bucket ? [p.limit, p.refillPerSecond!] : [p.limit, p.windowMs!],
  }
}

/**
 * Every option of a policy with its value when not given. Typed so that an option added to
 * RateLimitPolicy and not listed here fails to compile: `signature` compares all of them.
 */
const OPTION_DEFAULTS: { [K in keyof Omit<RateLimitPolicy, 'name'>]-?: unknown } = {
  algorithm: undefined,
  limit: undefined,
  windowMs: undefined,
  refillPerSecond: undefined,
  key: keyBy.ip,
  cost: 1,
  hook: 'onRequest',
  countOnlyFailures: false,
  onRedisError: 'open',
  localShare: 1,
  maxDelayMs: 0,
  allowList: undefined,
}

const functionIds = new WeakMap<object, number>()
let functionCount = 0

/** Functions compare by identity: each one gets a number the first time it is seen. */
function functionId(f: object): string {
  let id = functionIds.get(f)
  if (id === undefined) {
    id = ++functionCount
    functionIds.set(f, id)
  }
  return `function #${id}`
}

/**
 * Same settings wherever a name is used: one name is one counter, shared across routes. Every
 * option counts (a default and its explicit value are the same); functions by identity.
 */
export function signature(raw: RateLimitPolicy, defaults: Partial<RateLimitPolicy> = {}): string {
  const p: Record<string, unknown> = { ...defaults, ...raw }
  const values = Object.entries(OPTION_DEFAULTS).map(([option, fallback]) => {
    const value = option === 'key' && p.key === 'ip' ? keyBy.ip : (p[option] ?? fallback)
    if (typeof value === 'function') return functionId(value)
    // An allow list of IPs is a set: the order it was written in does not matter.
    return Array.isArray(value) ? [...value].sort() : value
  })
  return JSON.stringify(values)
}
