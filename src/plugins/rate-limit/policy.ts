import type { FastifyReply, FastifyRequest } from 'fastify'
import { describeValue } from '../../redis/client.ts'
import { shownType } from '../common/options.ts'
import { durationOption, parseDuration } from './duration.ts'
import { DEFAULT_IPV6_SUBNET, ipKey, type KeyFunction, keyBy, needsPreHandler } from './keys.ts'
import { allowListPredicate, BAN_KEYS, POLICY_KEYS, policyCheck } from './options.ts'
import { type Quota, SCRIPT_OF_ALGORITHM } from './protocol.ts'
import type {
  BanHandler,
  BanOptions,
  ErrorResponseBuilder,
  ExceededHandler,
  Policy,
  RateLimitPolicy,
  Resolved,
  ShadowOptions,
  SyncOptions,
  SyncSettings,
} from './types.ts'

/** A buffered policy's defaults: a sync every 250 ms, leases of at most 100 units. */
export const DEFAULT_SYNC: SyncSettings = { intervalMs: 250, batch: 100 }
/** Most units one lease may take. */
const MAX_BATCH = 1_000_000
/** The algorithms buffered mode supports (docs/rate-limit.md says why not the sliding ones). */
const BUFFERED_ALGORITHMS = new Set(['fixed-window', 'token-bucket', 'gcra'])

/** `sync` checked: null for exact mode; the reasons a policy cannot be buffered, each with its cause. */
function syncSettings(
  raw: unknown,
  p: RateLimitPolicy,
  fail: (message: string) => never,
): SyncSettings | null {
  if (raw === undefined || raw === false) return null
  if (raw !== true && (typeof raw !== 'object' || raw === null || Array.isArray(raw)))
    fail(`\`sync\` must be true, false or { intervalMs?, batch? }, got ${describeValue(raw)}`)
  const given = raw === true ? {} : (raw as SyncOptions)
  policyCheck.known(given, ['intervalMs', 'batch'], `policy '${p.name}': sync`)
  const intervalMs = durationOption('sync.intervalMs', given.intervalMs ?? DEFAULT_SYNC.intervalMs, 1, fail)
  if (intervalMs < 10) fail('`sync.intervalMs` must be at least 10 ms (every sync is a Redis call)')
  const batch = given.batch ?? DEFAULT_SYNC.batch
  if (!Number.isSafeInteger(batch) || batch < 1 || batch > MAX_BATCH)
    fail(`\`sync.batch\` must be a whole number of units from 1 to ${MAX_BATCH}`)
  if (!BUFFERED_ALGORITHMS.has(p.algorithm))
    fail(
      `\`sync\` applies to fixed-window, token-bucket and gcra: a ${p.algorithm} policy weighs each request by its own time, which a lease taken earlier cannot keep`,
    )
  if (p.countOnlyFailures)
    fail('`sync` and `countOnlyFailures` exclude each other: a refund needs the exact count')
  if (p.maxDelayMs)
    fail('`sync` and `maxDelayMs` exclude each other: a delay is computed from the exact state')
  if (p.ban !== undefined || p.exponentialBackoff || p.continueExceeding)
    fail(
      '`sync` excludes `ban`, `exponentialBackoff` and `continueExceeding`: they count each rejection in Redis',
    )
  return { intervalMs, batch }
}

/** `shadow` checked: null for a policy that enforces. */
function shadowSettings(
  raw: unknown,
  p: RateLimitPolicy,
  fail: (message: string) => never,
): Required<ShadowOptions> | null {
  if (raw === undefined || raw === false) return null
  if (raw === true) return { headers: false }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw))
    fail(`\`shadow\` must be true, false or { headers? }, got ${describeValue(raw)}`)
  const given = raw as ShadowOptions
  policyCheck.known(given, ['headers'], `policy '${p.name}': shadow`)
  if (given.headers !== undefined && typeof given.headers !== 'boolean')
    fail(`\`shadow.headers\` must be a boolean, got ${describeValue(given.headers)}`)
  return { headers: given.headers ?? false }
}

const QUOTA_UNIT = /^[a-z][a-z0-9-]{0,31}$/

/** `settle` checked: null when the cost is final; the policies whose count cannot be reconciled refused. */
function settleSetting(p: RateLimitPolicy, fail: (message: string) => never): Policy['settle'] {
  const raw = p.settle
  if (raw === undefined || (raw as unknown) === false) return null
  if (raw !== true && typeof raw !== 'function')
    fail(
      `\`settle\` must be true (the route settles) or a function of (request, reply), got ${describeValue(raw)}`,
    )
  if (p.algorithm === 'concurrency')
    fail('`settle` does not apply to concurrency: a slot has no cost to reconcile')
  if (p.sync) fail('`settle` and `sync` exclude each other: a lease counts units before their cost is known')
  if (p.countOnlyFailures)
    fail(
      '`settle` and `countOnlyFailures` exclude each other: both change the count once the response is known',
    )
  return raw === true ? 'route' : raw
}

/** How long a concurrency slot is held at most when its `leaseMs` is not given. */
const DEFAULT_LEASE_MS = 60_000

/** Most rejections `ban.after` may wait for. */
const MAX_BAN_AFTER = 1_000_000

/** Plugin-wide settings a policy takes when it does not set its own. */
export interface PolicyContext {
  ipv6Subnet: number
  onExceeded: ExceededHandler | null
  errorResponse: ErrorResponseBuilder | null
}

const NO_CONTEXT: PolicyContext = { ipv6Subnet: DEFAULT_IPV6_SUBNET, onExceeded: null, errorResponse: null }

/** A dynamic policy's quota until a request resolves it. */
const NO_QUOTA: Quota = { limit: 0, windowMs: 0, refillPerSecond: 0 }

const NAME = /^[A-Za-z0-9_.-]{1,64}$/
const positiveInt = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) > 0

/**
 * Checks one policy; throws an InvalidOptionError naming the policy and the option, or an
 * UnknownOptionError for a key no policy has. `where` says where it was written (a route's config).
 */
export function normalizePolicy(
  raw: RateLimitPolicy,
  defaults: Partial<RateLimitPolicy> = {},
  context: PolicyContext = NO_CONTEXT,
  where = '',
): Policy {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw))
    policyCheck.fail(
      `${where}a policy must be an object (name, algorithm, limit, ...), got ${describeValue(raw)}`,
    )
  const p = { ...defaults, ...raw }
  const name = typeof p.name === 'string' && NAME.test(p.name) ? p.name : undefined
  policyCheck.known(raw, POLICY_KEYS, `${where}policy '${name ?? String(p.name)}'`)
  const fail = (message: string): never =>
    policyCheck.fail(`${where}policy '${name ?? String(p.name)}': ${message}`)
  if (!name) fail('`name` must be 1-64 characters of A-Z a-z 0-9 _ . -')
  if (!(p.algorithm in SCRIPT_OF_ALGORITHM)) {
    fail(
      '`algorithm` must be one of fixed-window, sliding-log, sliding-counter, token-bucket, gcra, concurrency',
    )
  }
  const concurrency = p.algorithm === 'concurrency'
  if (p.leaseMs !== undefined && !concurrency) fail('`leaseMs` applies to concurrency only')
  const limitFn = typeof p.limit === 'function' ? p.limit : null
  if (!limitFn && !positiveInt(p.limit))
    fail('`limit` must be a positive integer or a function of the request')
  const limit = limitFn ? 0 : (p.limit as number)
  const bucket = p.algorithm === 'token-bucket'
  let windowFn: ((request: FastifyRequest) => number) | null = null
  let windowMs = 0
  if (bucket) {
    if (
      typeof p.refillPerSecond !== 'number' ||
      !(p.refillPerSecond > 0) ||
      !Number.isFinite(p.refillPerSecond)
    )
      fail('`refillPerSecond` must be a positive number')
    if (p.windowMs !== undefined) fail('`windowMs` does not apply to the token bucket (use refillPerSecond)')
  } else if (concurrency) {
    if (p.windowMs !== undefined)
      fail(
        '`windowMs` does not apply to concurrency: a slot is held while its request runs (`leaseMs` bounds it)',
      )
    if (p.refillPerSecond !== undefined) fail('`refillPerSecond` applies to the token bucket only')
    // The slot's lease is the sliding log's window.
    windowMs = durationOption('leaseMs', p.leaseMs ?? DEFAULT_LEASE_MS, 1, fail)
    if (p.countOnlyFailures)
      fail(
        '`countOnlyFailures` does not apply to concurrency: every slot is given back when its response ends',
      )
  } else {
    if (typeof p.windowMs === 'function') windowFn = p.windowMs
    else windowMs = durationOption('windowMs', p.windowMs, 1, fail, true)
    if (p.refillPerSecond !== undefined) fail('`refillPerSecond` applies to the token bucket only')
    // The arrival time is a double in ms since the epoch (resolution about 0.25 µs): an interval
    // under 10 µs per unit would stop advancing it, and the policy would never reject.
    if (p.algorithm === 'gcra' && !limitFn && !windowFn && limit > windowMs * 100)
      fail('`limit` of a gcra policy may be at most 100 per millisecond of `windowMs`')
  }
  const cost = p.cost ?? 1
  if (typeof cost !== 'function' && (!positiveInt(cost) || (!limitFn && cost > limit))) {
    fail('`cost` must be a positive integer no larger than `limit`, or a function')
  }
  const key = p.key === undefined || p.key === 'ip' || p.key === keyBy.ip ? ipKey(context.ipv6Subnet) : p.key
  if (typeof key !== 'function') fail("`key` must be 'ip' or a function of the request")
  const hook = p.hook ?? 'onRequest'
  if (hook !== 'onRequest' && hook !== 'preHandler') fail("`hook` must be 'onRequest' or 'preHandler'")
  if (hook === 'onRequest' && needsPreHandler.has(key as KeyFunction))
    fail("`key` reads the session or the body, which onRequest does not have yet: set hook: 'preHandler'")
  const onRedisError = p.onRedisError ?? 'open'
  if (!['open', 'closed', 'local'].includes(onRedisError))
    fail("`onRedisError` must be 'open', 'closed' or 'local'")
  const localShare = p.localShare ?? 1
  if (typeof localShare !== 'number' || !(localShare > 0 && localShare <= 1))
    fail('`localShare` must be in (0, 1]')
  const maxDelayMs = durationOption('maxDelayMs', p.maxDelayMs ?? 0, 0, fail)
  if (maxDelayMs > 0 && p.algorithm !== 'token-bucket' && p.algorithm !== 'gcra') {
    fail('`maxDelayMs` applies to token-bucket and gcra only')
  }
  const blockMs = p.blockMs === undefined ? 0 : durationOption('blockMs', p.blockMs, 1, fail)
  let banAfter = -1
  let onBanReach: BanHandler | null = null
  if (p.ban !== undefined) {
    const ban = p.ban as unknown
    if (typeof ban !== 'object' || ban === null || Array.isArray(ban))
      fail(
        `\`ban\` must be an object { after, onBanReach? }, got ${describeValue(ban)}${typeof ban === 'number' ? ` (@fastify/rate-limit's \`ban: ${ban}\` is \`ban: { after: ${ban} }\` here)` : ''}`,
      )
    policyCheck.known(ban as object, BAN_KEYS, `${where}policy '${name}': ban`)
    const { after, onBanReach: hook } = ban as BanOptions
    if (!Number.isSafeInteger(after) || after < 0 || after > MAX_BAN_AFTER)
      fail(`\`ban.after\` must be a whole number of rejections from 0 to ${MAX_BAN_AFTER}`)
    if (hook !== undefined && typeof hook !== 'function')
      fail('`ban.onBanReach` must be a function of (request, key)')
    banAfter = after
    onBanReach = hook ?? null
  }
  for (const option of ['exponentialBackoff', 'continueExceeding'] as const) {
    if (p[option] !== undefined && typeof p[option] !== 'boolean') fail(`\`${option}\` must be a boolean`)
  }
  const exponentialBackoff = p.exponentialBackoff ?? false
  const continueExceeding = p.continueExceeding ?? false
  if (exponentialBackoff && continueExceeding)
    fail(
      '`exponentialBackoff` and `continueExceeding` exclude each other (one restarts the window at its length, the other doubles it): choose one',
    )
  const penalised = banAfter >= 0 || exponentialBackoff || continueExceeding
  if (penalised && p.algorithm !== 'fixed-window') {
    const which = banAfter >= 0 ? 'ban' : exponentialBackoff ? 'exponentialBackoff' : 'continueExceeding'
    fail(`\`${which}\` applies to fixed-window only (it counts the rejected requests of a window)`)
  }
  for (const option of ['onExceeded', 'errorResponse'] as const) {
    if (p[option] !== undefined && typeof p[option] !== 'function')
      fail(`\`${option}\` must be a function of (request, decision)`)
  }
  const sync = syncSettings(p.sync, p, fail)
  const shadow = shadowSettings(p.shadow, p, fail)
  const settle = settleSetting(p, fail)
  if (p.quotaUnit !== undefined && (typeof p.quotaUnit !== 'string' || !QUOTA_UNIT.test(p.quotaUnit)))
    fail("`quotaUnit` must be a short name (a-z, 0-9 and '-', up to 32 characters), such as 'bytes'")
  if (p.quotaUnit !== undefined && concurrency)
    fail('`quotaUnit` does not apply to concurrency: it counts concurrent-requests')
  const failures = p.countOnlyFailures
  const isFailure =
    typeof failures === 'function'
      ? failures
      : failures
        ? (reply: FastifyReply) => reply.statusCode >= 400
        : null
  const policy: Policy = {
    name: name!,
    algorithm: p.algorithm,
    script: SCRIPT_OF_ALGORITHM[p.algorithm],
    limit,
    limitFn,
    windowMs,
    windowFn,
    dynamic: limitFn !== null || windowFn !== null,
    refillPerSecond: p.refillPerSecond ?? 0,
    key: key as KeyFunction,
    cost,
    hook,
    isFailure,
    sync,
    shadow,
    settle,
    quotaUnit: p.quotaUnit ?? null,
    onRedisError,
    // A buffered policy knows how many instances share its quota: without `localShare`, the
    // fallback's share follows them (null); an exact one falls back on the whole limit.
    localShare: p.localShare === undefined && sync ? null : localShare,
    maxDelayMs,
    allow: allowListPredicate(p.allowList, fail),
    blockMs,
    banAfter,
    onBanReach,
    exponentialBackoff,
    continueExceeding,
    penalised,
    onExceeded: p.onExceeded ?? context.onExceeded,
    errorResponse: p.errorResponse ?? context.errorResponse,
    header: '',
    windowSec: 0,
    quota: NO_QUOTA,
  }
  if (!policy.dynamic) {
    const global = resolve(policy, limit, windowMs, 1)
    policy.header = global.header
    policy.quota = global.quota
    policy.windowSec = windowSecOf(policy, limit, windowMs)
    if (bucket) policy.windowMs = Math.ceil((limit * 1000) / policy.refillPerSecond)
  }
  return policy
}

function windowSecOf(policy: Policy, limit: number, windowMs: number): number {
  const ms =
    policy.algorithm === 'token-bucket' ? Math.ceil((limit * 1000) / policy.refillPerSecond) : windowMs
  return Math.max(1, Math.round(ms / 1000))
}

/**
 * The share of a policy's quota this process enforces while Redis cannot be reached: its
 * `localShare`, or for a buffered policy without one, 1 / the live instances it last counted.
 */
export function localShareOf(policy: Policy, instances: number): number {
  return policy.localShare ?? 1 / Math.max(1, instances)
}

/** Header item and quota for a limit and window (a `share` below 1: this process's share, for the fallback). */
export function resolve(policy: Policy, limit: number, windowMs: number, share: number): Resolved {
  const q = share < 1 ? Math.max(1, Math.floor(limit * share)) : limit
  const bucket = policy.algorithm === 'token-bucket'
  return {
    // Requests in flight have no window: the draft's quota unit says what q counts.
    header:
      policy.algorithm === 'concurrency'
        ? `"${policy.name}";q=${q};qu="concurrent-requests"`
        : `"${policy.name}";q=${q};w=${windowSecOf(policy, limit, windowMs)}${policy.quotaUnit ? `;qu="${policy.quotaUnit}"` : ''}`,
    quota: bucket
      ? { limit: q, windowMs: 0, refillPerSecond: policy.refillPerSecond * share }
      : { limit: q, windowMs, refillPerSecond: 0 },
  }
}

/**
 * The limit and window of a dynamic policy for one request, checked like a computed cost: a
 * positive whole number each (a gcra policy at most 100 units per millisecond of window), else
 * the message of the 500 that request gets. `limit` and `windowMs` are what its functions returned
 * (an async limit function's promise already resolved).
 */
export function checkDynamic(policy: Policy, limit: unknown, windowMs: unknown): Resolved | string {
  if (!positiveInt(limit)) return `its limit function returned ${shown(limit)}, not a positive whole number`
  if (policy.windowFn && !positiveInt(windowMs))
    return `its windowMs function returned ${shown(windowMs)}, not a positive whole number of milliseconds`
  const window = windowMs as number
  if (policy.algorithm === 'gcra' && limit > window * 100)
    return `its limit ${limit} is more than 100 per millisecond of its window (${window} ms)`
  return resolve(policy, limit, window, 1)
}

/** A returned value in an error message, without calling anything of it or showing its content. */
export const shown = shownType

/**
 * Every option of a policy with its value when not given. Typed so that an option added to
 * RateLimitPolicy and not listed here fails to compile: `signature` compares all of them.
 */
const OPTION_DEFAULTS: { [K in keyof Omit<RateLimitPolicy, 'name'>]-?: unknown } = {
  algorithm: undefined,
  limit: undefined,
  windowMs: undefined,
  refillPerSecond: undefined,
  leaseMs: undefined,
  key: keyBy.ip,
  cost: 1,
  hook: 'onRequest',
  countOnlyFailures: false,
  settle: undefined,
  quotaUnit: undefined,
  sync: false,
  shadow: false,
  onRedisError: 'open',
  localShare: 1,
  maxDelayMs: 0,
  allowList: undefined,
  blockMs: 0,
  ban: undefined,
  exponentialBackoff: false,
  continueExceeding: false,
  onExceeded: undefined,
  errorResponse: undefined,
}

const DURATIONS = new Set(['windowMs', 'leaseMs', 'maxDelayMs', 'blockMs'])

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
    let value = option === 'key' && p.key === 'ip' ? keyBy.ip : (p[option] ?? fallback)
    // A duration compares by its milliseconds: '1 minute' is 60000.
    if (DURATIONS.has(option) && typeof value === 'string') value = parseDuration(value) ?? value
    // Its hook compares by identity like any other function.
    if (option === 'sync' && value) {
      const { intervalMs, batch } = value === true ? {} : (value as SyncOptions)
      return [parseDuration(intervalMs ?? DEFAULT_SYNC.intervalMs) ?? intervalMs, batch ?? DEFAULT_SYNC.batch]
    }
    if (option === 'shadow' && value)
      return [value === true ? false : Boolean((value as ShadowOptions).headers)]
    if (option === 'ban' && value && typeof value === 'object') {
      const { after, onBanReach } = value as BanOptions
      return [after, onBanReach ? functionId(onBanReach) : null]
    }
    if (typeof value === 'function') return functionId(value)
    // An allow list of IPs is a set: the order it was written in does not matter.
    return Array.isArray(value) ? [...value].sort() : value
  })
  return JSON.stringify(values)
}
