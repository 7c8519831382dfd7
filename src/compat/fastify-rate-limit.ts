import { createHash } from 'node:crypto'
import { isIPv6 } from 'node:net'
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify'
import fp from 'fastify-plugin'
import { optionChecker, optionKeys } from '../plugins/common/options.ts'
import { bootPluginRedis, type RedisClient } from '../plugins/common/redis.ts'
import { addRouteHook } from '../plugins/common/route-hooks.ts'
import { parseDuration } from '../plugins/rate-limit/duration.ts'
import { RateLimitEngine, type RateLimitResult } from '../plugins/rate-limit/engine.ts'
import { clientAddress } from '../plugins/rate-limit/keys.ts'
import { createMetrics } from '../plugins/rate-limit/metrics.ts'
import { normalizePolicy, type Policy, type RateLimitPolicy } from '../plugins/rate-limit/policy.ts'

// @fastify/rate-limit 11's options, decorators, route config and headers on this suite's
// rate-limit engine: every count is the fixed-window policy's (Redis script or memory store).
// docs/migrating-from-fastify-rate-limit.md says what differs and why.

type Awaitable<T> = T | Promise<T>
type MaxFunction = (request: FastifyRequest, key: string) => Awaitable<number>
type WindowFunction = (request: FastifyRequest, key: string) => Awaitable<number>

export interface ErrorResponseBuilderContext {
  statusCode: number
  ban: boolean
  after: string
  max: number
  ttl: number
}

export interface RateLimitOptions {
  max?: number | MaxFunction
  timeWindow?: number | string | WindowFunction
  keyGenerator?: (request: FastifyRequest) => Awaitable<string | number>
  allowList?: string[] | ((request: FastifyRequest, key: string) => Awaitable<boolean>)
  groupId?: string
  hook?: 'onRequest' | 'preParsing' | 'preValidation' | 'preHandler'
  skipOnError?: boolean
  errorResponseBuilder?: (request: FastifyRequest, context: ErrorResponseBuilderContext) => unknown
  addHeaders?: Partial<Record<string, boolean>>
  addHeadersOnExceeding?: Partial<Record<string, boolean>>
  enableDraftSpec?: boolean
  ipv6Subnet?: number
  ban?: number
  onBanReach?: (request: FastifyRequest, key: string) => void
  onExceeding?: (request: FastifyRequest, key: string) => void
  onExceeded?: (request: FastifyRequest, key: string) => void
  continueExceeding?: boolean
  exponentialBackoff?: boolean
}

export interface RateLimitPluginOptions extends RateLimitOptions {
  global?: boolean
  /** An ioredis client: counters live in Redis (shared by every instance); without it, in this process. */
  redis?: RedisClient
  /** Redis key prefix. Default 'fastify-rate-limit-'. */
  nameSpace?: string
  /** Keys kept by the in-process store (least recently used dropped first). Default 5000. */
  cache?: number
  /**
   * @fastify/rate-limit's custom store class (`new Store(options)` with `incr`, `read`, `child`):
   * routes then count in it instead of Redis or this process (see the migration guide).
   */
  store?: CustomStoreClass
}

/** What a `createRateLimit` limiter answers: allowed (allow list) or counted. */
export type CreateRateLimitResult =
  | { isAllowed: true; key: string }
  | {
      isAllowed: false
      key: string
      max: number
      timeWindow: number
      remaining: number
      ttl: number
      ttlInSeconds: number
      isExceeded: boolean
      isBanned: boolean
    }

type StoreCallback = (err: Error | null, result?: { current: number; ttl: number }) => void
interface CustomStore {
  incr(key: string | number, callback: StoreCallback, timeWindow: number, max: number): void
  read?(key: string | number, callback: StoreCallback, timeWindow: number, max: number): void
  child(options: Record<string, unknown>): CustomStore
}
export type CustomStoreClass = new (options: Record<string, unknown>) => CustomStore

export type Hook = (request: FastifyRequest, reply: FastifyReply) => Promise<void>

/**
 * The decorators this plugin adds. Not declared on FastifyInstance here: @fastify/rate-limit's own
 * types declare the same names and may share a program with ours. An app without them adds:
 * `declare module 'fastify' { interface FastifyInstance extends RateLimitDecorators {} }`.
 */
export interface RateLimitDecorators {
  rateLimit: (options?: RateLimitOptions) => Hook
  createRateLimit: (
    options?: RateLimitOptions,
  ) => (request: FastifyRequest, callOptions?: { increment?: boolean }) => Promise<CreateRateLimitResult>
}

const DEFAULT_MAX = 1000
const DEFAULT_WINDOW = 60_000
const DEFAULT_IPV6_SUBNET = 64

const HEADERS = {
  rateLimit: 'x-ratelimit-limit',
  rateRemaining: 'x-ratelimit-remaining',
  rateReset: 'x-ratelimit-reset',
  retryAfter: 'retry-after',
}
const DRAFT_HEADERS = {
  rateLimit: 'ratelimit-limit',
  rateRemaining: 'ratelimit-remaining',
  rateReset: 'ratelimit-reset',
  retryAfter: 'retry-after',
}

const noop = () => {}

/**
 * @fastify/rate-limit's penalties as the fixed-window policy's own options. `onBanReach` stays
 * here: upstream calls it on every banned request, the policy's once per ban. With both
 * `continueExceeding` and `exponentialBackoff`, upstream lets the first win; the policy refuses
 * the pair, so only it is passed.
 */
function penaltyOptions(params: Params): Record<string, unknown> {
  const options: Record<string, unknown> = {}
  if (params.ban >= 0) options.ban = { after: params.ban }
  if (params.continueExceeding) options.continueExceeding = true
  else if (params.exponentialBackoff) options.exponentialBackoff = true
  return options
}

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
function formatLong(ms: number): string {
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

function defaultErrorResponse(_request: FastifyRequest, context: ErrorResponseBuilderContext) {
  const err = new Error(`Rate limit exceeded, retry in ${context.after}`) as Error & { statusCode: number }
  err.statusCode = context.statusCode
  return err
}

/** Redis could not be asked and skipOnError is false: 503, not the client's error text. */
function unavailableError() {
  const err = new Error('Rate limit cannot be checked now; retry shortly') as Error & { statusCode: number }
  err.statusCode = 503
  return err
}

interface Params {
  global: boolean
  labels: typeof HEADERS
  addHeaders: Record<string, boolean | undefined>
  addHeadersOnExceeding: Record<string, boolean | undefined>
  max: number | MaxFunction
  timeWindow: number | WindowFunction
  hook: string
  allowList: RateLimitOptions['allowList'] | null
  ban: number
  onBanReach: (request: FastifyRequest, key: string) => void
  onExceeding: (request: FastifyRequest, key: string) => void
  onExceeded: (request: FastifyRequest, key: string) => void
  continueExceeding: boolean
  exponentialBackoff: boolean
  ipv6Subnet: number
  keyGenerator: ((request: FastifyRequest) => Awaitable<string | number>) | null
  errorResponseBuilder: (request: FastifyRequest, context: ErrorResponseBuilderContext) => unknown
  skipOnError: boolean
  groupId?: string
}

const finiteNonNegative = (v: unknown): v is number => Number.isFinite(v) && (v as number) >= 0

function windowOf(value: unknown): number | WindowFunction {
  if (finiteNonNegative(value)) return Math.trunc(value)
  if (typeof value === 'string') return parseDuration(value) ?? DEFAULT_WINDOW
  if (typeof value === 'function') return value as WindowFunction
  return DEFAULT_WINDOW
}

function subnetOf(value: unknown): number {
  return Number.isFinite(value) && (value as number) >= 0 && (value as number) <= 128
    ? Math.trunc(value as number)
    : DEFAULT_IPV6_SUBNET
}

function globalParams(settings: RateLimitPluginOptions): Params {
  const labels = settings.enableDraftSpec === true ? DRAFT_HEADERS : HEADERS
  return {
    global: typeof settings.global === 'boolean' ? settings.global : true,
    labels,
    addHeaders: {
      [labels.rateLimit]: true,
      [labels.rateRemaining]: true,
      [labels.rateReset]: true,
      [labels.retryAfter]: true,
      ...settings.addHeaders,
    },
    addHeadersOnExceeding: {
      [labels.rateLimit]: true,
      [labels.rateRemaining]: true,
      [labels.rateReset]: true,
      ...settings.addHeadersOnExceeding,
    },
    max: finiteNonNegative(settings.max)
      ? Math.trunc(settings.max)
      : typeof settings.max === 'function'
        ? settings.max
        : DEFAULT_MAX,
    timeWindow: windowOf(settings.timeWindow),
    hook: settings.hook || 'onRequest',
    allowList: settings.allowList || null,
    ban: finiteNonNegative(settings.ban) ? Math.trunc(settings.ban) : -1,
    onBanReach: typeof settings.onBanReach === 'function' ? settings.onBanReach : noop,
    onExceeding: typeof settings.onExceeding === 'function' ? settings.onExceeding : noop,
    onExceeded: typeof settings.onExceeded === 'function' ? settings.onExceeded : noop,
    continueExceeding: settings.continueExceeding === true,
    exponentialBackoff: settings.exponentialBackoff === true,
    ipv6Subnet: subnetOf(settings.ipv6Subnet),
    keyGenerator: typeof settings.keyGenerator === 'function' ? settings.keyGenerator : null,
    errorResponseBuilder:
      typeof settings.errorResponseBuilder === 'function'
        ? settings.errorResponseBuilder
        : defaultErrorResponse,
    skipOnError: settings.skipOnError === true,
  }
}

/**
 * Upstream ignores an option it does not know; here a typo (`timeWindo`) would silently leave the
 * default window in place, so unknown options fail the boot with a did-you-mean.
 */
const check = optionChecker('@fastify/rate-limit compat')
const ROUTE_OPTIONS = optionKeys<RateLimitOptions>({
  max: true,
  timeWindow: true,
  keyGenerator: true,
  allowList: true,
  groupId: true,
  hook: true,
  skipOnError: true,
  errorResponseBuilder: true,
  addHeaders: true,
  addHeadersOnExceeding: true,
  enableDraftSpec: true,
  ipv6Subnet: true,
  ban: true,
  onBanReach: true,
  onExceeding: true,
  onExceeded: true,
  continueExceeding: true,
  exponentialBackoff: true,
})
const PLUGIN_OPTIONS = [...ROUTE_OPTIONS, 'global', 'redis', 'nameSpace', 'cache', 'store']

function mergeParams(base: Params, options: RateLimitOptions): Params {
  check.known(options, ROUTE_OPTIONS, 'route options')
  const result = { ...base, ...options } as Params & Record<string, unknown>
  result.timeWindow = windowOf(result.timeWindow)
  result.max = finiteNonNegative(result.max)
    ? Math.trunc(result.max)
    : typeof result.max === 'function'
      ? result.max
      : DEFAULT_MAX
  result.ban = finiteNonNegative(result.ban) ? Math.trunc(result.ban) : -1
  result.ipv6Subnet = subnetOf(result.ipv6Subnet)
  if (typeof options.keyGenerator !== 'function') result.keyGenerator = base.keyGenerator
  if (result.groupId !== undefined && typeof result.groupId !== 'string')
    throw new Error('groupId must be a string')
  return result
}

/** A counter's policy name: the characters a policy name allows, hashed when anything else is in it. */
function counterName(prefix: string, label: string): string {
  const name = `${prefix}.${label}`
  if (/^[A-Za-z0-9_.-]{1,64}$/.test(name)) return name
  return `${prefix}.${createHash('sha256')
    .update(label)
    .digest('base64url')
    .slice(0, 16)
    .replace(/[^A-Za-z0-9]/g, '_')}`
}

/** One limiter: its settings and the counter (policy name) it counts in. */
interface Limiter {
  params: Params
  name: string
  policies: Map<string, Policy>
  /** A custom store's child for this limiter (null: the engine counts). */
  store: CustomStore | null
}

let registrations = 0

async function fastifyRateLimit(fastify: FastifyInstance, settings: RateLimitPluginOptions) {
  settings ??= {}
  check.known(settings, PLUGIN_OPTIONS)
  const base = globalParams(settings)
  // A custom store counts by itself: the options it needs are its own business, not the engine's.
  const store = typeof settings.store === 'function' ? new settings.store({ ...base }) : null
  if (!store) penaltyOptions(base)
  const redis = settings.redis
    ? await bootPluginRedis(fastify, 'rate-limit compat', {
        redis: settings.redis,
        connectTimeoutMs: undefined,
        eviction: 'warn',
      })
    : null
  const registration = ++registrations
  const engine = new RateLimitEngine(
    redis,
    {
      // In memory each registration has counters of its own, as @fastify/rate-limit's LocalStore.
      keyPrefix: redis ? (settings.nameSpace ?? 'fastify-rate-limit-') : `frl${registration}:`,
      overLimitCacheKeys: redis ? 10_000 : 0,
      retryRedisAfterMs: 1000,
      timeoutMs: 500,
      log: fastify.log,
      memoryMaxKeys: Number.isSafeInteger(settings.cache) && settings.cache! > 0 ? settings.cache! : 5000,
    },
    createMetrics(undefined),
  )
  fastify.addHook('onClose', async () => engine.close())
  const ran = Symbol('fastify.request.rateLimitRan')
  fastify.decorateRequest(ran as unknown as string, false)

  let unnamed = 0
  const limiter = (params: Params, name: string, routeInfo?: object): Limiter => {
    if (store) {
      const own = name === 'global' ? store : store.child({ ...params, routeInfo: routeInfo ?? {} })
      return { params, name, policies: new Map(), store: own }
    }
    const extra = penaltyOptions(params)
    if (Object.keys(extra).length > 0) params = { ...params, ...{ policyExtra: extra } }
    return { params, name, policies: new Map(), store: null }
  }

  /** Counts in a custom store: its `{ current, ttl }` as the engine's result. */
  const countInStore = async (
    own: CustomStore,
    key: string | number,
    max: number,
    timeWindow: number,
    increment: boolean,
  ): Promise<{ remaining: number | null; ttl: number; allowed: boolean } | null> => {
    const method = increment ? own.incr : own.read
    if (typeof method !== 'function')
      throw new Error(
        'The configured rate-limit store does not implement a `read` method, which is required to use `{ increment: false }`',
      )
    const { current, ttl } = await new Promise<{ current: number; ttl: number }>((resolve, reject) =>
      method.call(own, key, (err, result) => (err ? reject(err) : resolve(result!)), timeWindow, max),
    )
    return { remaining: max - current, ttl, allowed: current <= max }
  }
  const policyOf = (l: Limiter, max: number, windowMs: number): Policy => {
    const id = `${max}/${windowMs}`
    let policy = l.policies.get(id)
    if (!policy) {
      const raw = {
        name: l.name,
        algorithm: 'fixed-window',
        limit: Math.max(1, max),
        windowMs: Math.max(1, windowMs),
        onRedisError: l.params.skipOnError ? 'open' : 'closed',
        ...(l.params as Params & { policyExtra?: object }).policyExtra,
      } as RateLimitPolicy
      policy = normalizePolicy(raw)
      if (l.policies.size >= 1000) l.policies.clear()
      l.policies.set(id, policy)
    }
    return policy
  }

  async function apply(
    l: Limiter,
    request: FastifyRequest,
    increment = true,
  ): Promise<CreateRateLimitResult> {
    const { params } = l
    // Handed to allowList and the callbacks as keyGenerator returned it; counted as its string.
    let key: string | number = params.keyGenerator
      ? await params.keyGenerator(request)
      : normalizeIP(request.ip, params.ipv6Subnet)
    const groupId = (request.routeOptions.config as { rateLimit?: { groupId?: string } } | undefined)
      ?.rateLimit?.groupId
    if (groupId) key += groupId
    if (params.allowList) {
      if (typeof params.allowList === 'function') {
        if (await params.allowList(request, key as string)) return { isAllowed: true, key: key as string }
      } else if (params.allowList.includes(key as string)) return { isAllowed: true, key: key as string }
    }
    const max = typeof params.max === 'number' ? params.max : await params.max(request, key as string)
    const timeWindow =
      typeof params.timeWindow === 'number'
        ? params.timeWindow
        : await params.timeWindow(request, key as string)
    if (l.store) {
      let counted: { remaining: number | null; ttl: number; allowed: boolean } | null = null
      try {
        counted = await countInStore(l.store, key, max, timeWindow, increment)
      } catch (err) {
        if (!params.skipOnError || (err as Error).message.includes('`read` method')) throw err
      }
      const ttl = counted?.ttl ?? 0
      return {
        isAllowed: false,
        key: key as string,
        max,
        timeWindow,
        remaining: Math.max(0, counted?.remaining ?? max),
        ttl,
        ttlInSeconds: Math.ceil(ttl / 1000),
        isExceeded: counted ? !counted.allowed : false,
        // upstream: current - max > ban
        isBanned: counted !== null && params.ban !== -1 && -counted.remaining! > params.ban,
      }
    }
    const policy = policyOf(l, max, timeWindow)
    // max 0: every request is over; a cost above the limit is never allowed (and counts nothing).
    const cost = increment ? (max === 0 ? 2 : 1) : 0
    const result: RateLimitResult = await engine.consume(policy, String(key), cost, request)
    if (result.remaining === null && !result.allowed) {
      // A policy with onRedisError 'closed' (skipOnError false) while Redis cannot be asked.
      throw unavailableError()
    }
    const open = result.remaining === null
    const remaining = max === 0 ? 0 : open ? max : result.remaining!
    // A read of a key with nothing counted reports no window, as upstream's read.
    const ttl = open || (!increment && remaining >= max) ? 0 : result.resetMs
    const banned = result.banned
    return {
      isAllowed: false,
      key: key as string,
      max,
      timeWindow,
      remaining: Math.max(0, remaining),
      ttl,
      ttlInSeconds: Math.ceil(ttl / 1000),
      isExceeded: !result.allowed,
      isBanned: banned,
    }
  }

  const handler = (l: Limiter): Hook =>
    async function rateLimitHook(request, reply) {
      const req = request as unknown as Record<symbol, boolean>
      if (req[ran]) return
      req[ran] = true
      const r = await apply(l, request)
      if (r.isAllowed) return
      const { params } = l
      const { labels } = params
      const { ttlInSeconds } = r
      if (!r.isExceeded) {
        const on = params.addHeadersOnExceeding
        if (on[labels.rateLimit]) reply.header(labels.rateLimit, r.max)
        if (on[labels.rateRemaining]) reply.header(labels.rateRemaining, r.remaining)
        if (on[labels.rateReset]) reply.header(labels.rateReset, ttlInSeconds)
        params.onExceeding(request, r.key)
        return
      }
      params.onExceeded(request, r.key)
      const on = params.addHeaders
      if (on[labels.rateLimit]) reply.header(labels.rateLimit, r.max)
      if (on[labels.rateRemaining]) reply.header(labels.rateRemaining, 0)
      if (on[labels.rateReset]) reply.header(labels.rateReset, ttlInSeconds)
      if (on[labels.retryAfter]) reply.header(labels.retryAfter, ttlInSeconds)
      const context: ErrorResponseBuilderContext = {
        statusCode: 429,
        ban: false,
        max: r.max,
        ttl: r.ttl,
        after: formatLong(ttlInSeconds * 1000),
      }
      if (r.isBanned) {
        context.statusCode = 403
        context.ban = true
        params.onBanReach(request, r.key)
      }
      throw params.errorResponseBuilder(request, context)
    }

  const global = limiter(base, 'global')
  const forOptions = (options: RateLimitOptions | undefined): Limiter => {
    if (typeof options !== 'object' || options === null) return global
    const params = mergeParams(base, options)
    return limiter(params, params.groupId ? counterName('g', params.groupId) : `d${++unnamed}`)
  }

  if (!fastify.hasDecorator('createRateLimit')) {
    // Typed by whichever declaration of the name is in the program (ours or @fastify/rate-limit's).
    const createRateLimit: RateLimitDecorators['createRateLimit'] = (options) => {
      const l = forOptions(options)
      return (request, callOptions) => apply(l, request, callOptions?.increment !== false)
    }
    fastify.decorate('createRateLimit', createRateLimit as never)
  }
  if (!fastify.hasDecorator('rateLimit')) {
    const rateLimit: RateLimitDecorators['rateLimit'] = (options) => handler(forOptions(options))
    fastify.decorate('rateLimit', rateLimit as never)
  }

  const addLimiterHook = (l: Limiter, route: RouteOptions) =>
    addRouteHook(route, l.params.hook as 'onRequest', handler(l))

  fastify.addHook('onRoute', (route) => {
    const config = (route.config as { rateLimit?: unknown } | undefined)?.rateLimit
    if (config !== undefined && config !== null) {
      if (typeof config === 'object') {
        const params = mergeParams(base, config as RateLimitOptions)
        const where = `${[route.method].flat().join(',')}${route.url}`
        // Routes naming one groupId share its counter; any other route counts on its own.
        const name = params.groupId ? counterName('g', params.groupId) : counterName('r', where)
        addLimiterHook(limiter(params, name, route), route)
      } else if (config !== false) {
        throw new Error('Unknown value for route rate-limit configuration')
      }
    } else if (base.global) {
      addLimiterHook(global, route)
    }
  })
}

const plugin = fp(fastifyRateLimit, { fastify: '5.x', name: '@fastify/rate-limit' })

export default plugin
export { fastifyRateLimit }
