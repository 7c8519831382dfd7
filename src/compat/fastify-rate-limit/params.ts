import { createHash } from 'node:crypto'
import type { FastifyRequest } from 'fastify'
import { InvalidOptionError } from '../../plugins/common/errors.ts'
import {
  type AnyOption,
  declareOptions,
  type OptionChecker,
  option,
  optionKeys,
  type SettingsOf,
} from '../../plugins/common/options.ts'
import { DEFAULT_IPV6_SUBNET, defaultErrorResponse } from './responses.ts'
import type {
  Awaitable,
  CustomStoreClass,
  ErrorResponseBuilderContext,
  MaxFunction,
  RateLimitOptions,
  RateLimitPluginOptions,
  WindowFunction,
} from './types.ts'

// Options as @fastify/rate-limit reads them (defaults, lenient coercions) into one settings object
// per limiter, checked for unknown names. The plugin's are declared once (COMPAT_OPTIONS).

const DEFAULT_MAX = 1000
const DEFAULT_WINDOW = 60_000

export const HEADERS = {
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
export function penaltyOptions(params: Params): Record<string, unknown> {
  const options: Record<string, unknown> = {}
  if (params.ban >= 0) options.ban = { after: params.ban }
  if (params.continueExceeding) options.continueExceeding = true
  else if (params.exponentialBackoff) options.exponentialBackoff = true
  return options
}

export interface Params {
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

/**
 * The grammar of @lukeed/ms's parse, which upstream reads a `timeWindow` string with: a number and
 * an optional unit (ms, s, m, h, d, w, y and their long forms); no unit is milliseconds.
 */
const UPSTREAM_DURATION =
  /^(-?(?:\d+)?\.?\d+) *(m(?:illiseconds?|s(?:ecs?)?))?(s(?:ec(?:onds?|s)?)?)?(m(?:in(?:utes?|s)?)?)?(h(?:ours?|rs?)?)?(d(?:ays?)?)?(w(?:eeks?|ks?)?)?(y(?:ears?|rs?)?)?$/
const UNIT_MS = [1, 1000, 60_000, 3_600_000, 86_400_000, 7 * 86_400_000, 365.25 * 86_400_000]

/** Milliseconds of a duration string as @lukeed/ms parses it ('5000', '1 week', '2w'), or undefined. */
export function parseTimeWindow(text: string): number | undefined {
  const match = UPSTREAM_DURATION.exec(text.toLowerCase())
  const amount = match ? Number.parseFloat(match[1]!) : 0
  // As upstream's parser: a zero amount is no duration.
  if (!match || !amount) return undefined
  const unit = match.slice(3).findIndex((group) => group !== undefined)
  return amount * UNIT_MS[unit + 1]!
}

/**
 * A window as upstream reads it. A string upstream parses is used as it parses it; one it cannot
 * (or a window under a millisecond) fails the boot, where a silent default would turn a weekly
 * limit into a per-minute one.
 */
function windowOf(value: unknown): number | WindowFunction {
  // Past 2^53 ms (about 285,000 years) a window cannot be counted exactly: it is that long, as for ever.
  if (finiteNonNegative(value)) return Math.min(Math.trunc(value), Number.MAX_SAFE_INTEGER)
  if (typeof value === 'function') return value as WindowFunction
  if (typeof value !== 'string') return DEFAULT_WINDOW
  const ms = parseTimeWindow(value)
  if (ms === undefined || !(ms >= 1))
    check.fail(
      `\`timeWindow\`: '${value}' is not a window: a number of milliseconds, or a string @fastify/rate-limit reads ('5000', '10s', '1 minute', '2h', '1 week', '2w')`,
    )
  return Math.min(Math.trunc(ms!), Number.MAX_SAFE_INTEGER)
}

const maxOf = (value: unknown): number | MaxFunction =>
  finiteNonNegative(value)
    ? Math.trunc(value)
    : typeof value === 'function'
      ? (value as MaxFunction)
      : DEFAULT_MAX

const banOf = (value: unknown): number => (finiteNonNegative(value) ? Math.trunc(value) : -1)

function subnetOf(value: unknown): number {
  return Number.isFinite(value) && (value as number) >= 0 && (value as number) <= 128
    ? Math.trunc(value as number)
    : DEFAULT_IPV6_SUBNET
}

type Listener = (request: FastifyRequest, key: string) => void

/**
 * An option as upstream reads it: `accept` gives the value to use, or undefined for one upstream
 * ignores, which reads as the default there and here.
 */
function upstream<T, In = T>(spec: {
  type: string
  default: T
  defaultText?: string
  doc: string
  accept: (value: unknown) => T | undefined
}) {
  const { accept, ...rest } = spec
  return option.custom<T, In>({ ...rest, read: (value) => accept(value) ?? spec.default })
}

/** An option taken as given: what uses it (the engine, the Redis boot, a store) checks it. */
const given = <T>(type: string, doc: string, defaultText = 'none') =>
  option.custom<T | undefined, T>({ type, doc, defaultText, default: undefined, read: (value) => value as T })

const whenFunction = <F>(value: unknown) => (typeof value === 'function' ? (value as F) : undefined)
const whenTrue = (value: unknown) => (value === true ? true : undefined)
const listener = (doc: string) =>
  upstream<Listener>({ type: 'function', default: noop, defaultText: 'none', doc, accept: whenFunction })

/**
 * How long registration waits for a Redis that is not ready. Upstream does not wait at all; a
 * second lets a client that is still connecting decide the first requests, without holding the
 * boot of an app whose Redis is down.
 */
export const DEFAULT_CONNECT_TIMEOUT_MS = 1000

/**
 * @fastify/rate-limit's plugin options, each read as upstream reads it (a value of another type
 * falls back to the default). What differs: upstream ignores an option it does not know, where a
 * typo (`timeWindo`) would silently leave the default window in place, so an unknown name fails
 * the boot with a did-you-mean; so do a `timeWindow` string upstream cannot read and a wrong
 * `connectTimeoutMs`, which upstream does not have.
 */
export const COMPAT_OPTIONS = declareOptions('@fastify/rate-limit compat', {
  global: upstream({
    type: 'boolean',
    default: true,
    doc: 'every route is limited; `false`: only routes with `config.rateLimit`',
    accept: (value) => (typeof value === 'boolean' ? value : undefined),
  }),
  max: upstream<number | MaxFunction>({
    type: 'number | function',
    default: DEFAULT_MAX,
    doc: 'requests per window, or `(request, key) => number` (async too)',
    accept: maxOf,
  }),
  timeWindow: upstream<number | WindowFunction, number | string | WindowFunction>({
    type: 'ms | string | function',
    default: DEFAULT_WINDOW,
    defaultText: '60000 (1 minute)',
    doc: "the window: milliseconds, a string upstream reads ('1 minute', '2w'), or a function",
    accept: windowOf,
  }),
  keyGenerator: upstream<RateLimitOptions['keyGenerator'] | null>({
    type: 'function',
    default: null,
    defaultText: 'the client IP',
    doc: '`(request) => key`',
    accept: whenFunction,
  }),
  allowList: upstream<RateLimitOptions['allowList'] | null>({
    type: 'string[] | function',
    default: null,
    defaultText: 'none',
    doc: 'IPs, or `(request, key) => boolean`: requests never limited',
    accept: (value) => (value ? (value as RateLimitOptions['allowList']) : undefined),
  }),
  groupId: given<string>('string', 'a route option: routes with one groupId share a counter'),
  hook: upstream<string>({
    type: 'string',
    default: 'onRequest',
    defaultText: "`'onRequest'`",
    doc: "the hook the limit runs in: `'onRequest'`, `'preParsing'`, `'preValidation'` or `'preHandler'`",
    accept: (value) => (value ? (value as string) : undefined),
  }),
  skipOnError: upstream({
    type: 'boolean',
    default: false,
    doc: 'let requests through while Redis fails',
    accept: whenTrue,
  }),
  errorResponseBuilder: upstream<Params['errorResponseBuilder']>({
    type: 'function',
    default: defaultErrorResponse,
    defaultText: "upstream's body",
    doc: '`(request, context) => error`, thrown to the error handler',
    accept: whenFunction,
  }),
  addHeaders: given<Record<string, boolean | undefined>>(
    'object',
    "headers by name, `false` to leave one out (`{ 'retry-after': false }`), on a rejection",
    'all sent',
  ),
  addHeadersOnExceeding: given<Record<string, boolean | undefined>>(
    'object',
    'the same, on a response within the limit',
    'all sent',
  ),
  enableDraftSpec: upstream({
    type: 'boolean',
    default: false,
    doc: 'the `ratelimit-*` header names',
    accept: whenTrue,
  }),
  ipv6Subnet: upstream({
    type: 'integer from 0 to 128',
    default: DEFAULT_IPV6_SUBNET,
    doc: 'IPv6 clients are keyed by this prefix length, 0 to 128',
    accept: subnetOf,
  }),
  ban: upstream({
    type: 'integer',
    default: -1,
    defaultText: 'none',
    doc: 'a whole number: 403 once this many requests were rejected in a window',
    accept: banOf,
  }),
  onBanReach: listener('`(request, key)`, called on every banned request'),
  onExceeding: listener('`(request, key)`, called on every request within the limit'),
  onExceeded: listener('`(request, key)`, called on every rejected request'),
  continueExceeding: upstream({
    type: 'boolean',
    default: false,
    doc: 'every rejection restarts the window',
    accept: whenTrue,
  }),
  exponentialBackoff: upstream({
    type: 'boolean',
    default: false,
    doc: 'each rejection doubles the window',
    accept: whenTrue,
  }),
  redis: given<RateLimitPluginOptions['redis']>(
    'ioredis client',
    'counters in Redis, shared by every instance',
    'none: counters in this process',
  ),
  nameSpace: given<string>('string', 'Redis key prefix', '`fastify-rate-limit-`'),
  cache: upstream({
    type: 'integer',
    default: 5000,
    doc: 'keys the in-process store keeps, a positive whole number (least recently used dropped first)',
    accept: (value) => (Number.isSafeInteger(value) && (value as number) > 0 ? (value as number) : undefined),
  }),
  store: given<CustomStoreClass>('class', 'a custom store class (`incr`, `read`, `child`)'),
  connectTimeoutMs: option.custom<number>({
    type: 'integer of at least 0',
    default: DEFAULT_CONNECT_TIMEOUT_MS,
    doc: 'how long registration waits for `redis` to be ready; 0: do not wait',
    read(value, fail) {
      if (!Number.isSafeInteger(value) || (value as number) < 0)
        fail(
          `\`connectTimeoutMs\` must be a whole number of milliseconds, 0 or more (0: do not wait), got ${String(value)}`,
        )
      return value as number
    },
  }),
} satisfies Record<keyof RateLimitPluginOptions, AnyOption>)

export type CompatSettings = SettingsOf<typeof COMPAT_OPTIONS>

export const check: OptionChecker = COMPAT_OPTIONS.checker

/** The global limiter's settings, from the plugin's. */
export function globalParams(settings: CompatSettings): Params {
  const labels = settings.enableDraftSpec ? DRAFT_HEADERS : HEADERS
  return {
    global: settings.global,
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
    max: settings.max,
    timeWindow: settings.timeWindow,
    hook: settings.hook,
    allowList: settings.allowList,
    ban: settings.ban,
    onBanReach: settings.onBanReach,
    onExceeding: settings.onExceeding,
    onExceeded: settings.onExceeded,
    continueExceeding: settings.continueExceeding,
    exponentialBackoff: settings.exponentialBackoff,
    ipv6Subnet: settings.ipv6Subnet,
    keyGenerator: settings.keyGenerator ?? null,
    errorResponseBuilder: settings.errorResponseBuilder,
    skipOnError: settings.skipOnError,
  }
}

/** What a route's `config.rateLimit` may hold. */
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

export function mergeParams(base: Params, options: RateLimitOptions): Params {
  check.known(options, ROUTE_OPTIONS, 'route options')
  const result = { ...base, ...options } as Params & Record<string, unknown>
  result.timeWindow = windowOf(result.timeWindow)
  result.max = maxOf(result.max)
  result.ban = banOf(result.ban)
  result.ipv6Subnet = subnetOf(result.ipv6Subnet)
  if (typeof options.keyGenerator !== 'function') result.keyGenerator = base.keyGenerator
  if (result.groupId !== undefined && typeof result.groupId !== 'string')
    throw new InvalidOptionError('groupId must be a string')
  return result
}

/** A counter's policy name: the characters a policy name allows, hashed when anything else is in it. */
export function counterName(prefix: string, label: string): string {
  const name = `${prefix}.${label}`
  if (/^[A-Za-z0-9_.-]{1,64}$/.test(name)) return name
  return `${prefix}.${createHash('sha256')
    .update(label)
    .digest('base64url')
    .slice(0, 16)
    .replace(/[^A-Za-z0-9]/g, '_')}`
}
