import { createHash } from 'node:crypto'
import type { FastifyRequest } from 'fastify'
import { optionChecker, optionKeys } from '../../plugins/common/options.ts'
import { DEFAULT_IPV6_SUBNET, defaultErrorResponse } from './responses.ts'
import type {
  Awaitable,
  ErrorResponseBuilderContext,
  MaxFunction,
  RateLimitOptions,
  RateLimitPluginOptions,
  WindowFunction,
} from './types.ts'

// Options as @fastify/rate-limit reads them (defaults, lenient coercions) into one settings object
// per limiter, checked for unknown names.

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

function subnetOf(value: unknown): number {
  return Number.isFinite(value) && (value as number) >= 0 && (value as number) <= 128
    ? Math.trunc(value as number)
    : DEFAULT_IPV6_SUBNET
}

export function globalParams(settings: RateLimitPluginOptions): Params {
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
export const check = optionChecker('@fastify/rate-limit compat')
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
export const PLUGIN_OPTIONS = [
  ...ROUTE_OPTIONS,
  'global',
  'redis',
  'nameSpace',
  'cache',
  'store',
  'connectTimeoutMs',
]

/**
 * How long registration waits for a Redis that is not ready. Upstream does not wait at all; a
 * second lets a client that is still connecting decide the first requests, without holding the
 * boot of an app whose Redis is down.
 */
export const DEFAULT_CONNECT_TIMEOUT_MS = 1000

export function connectTimeoutOf(value: unknown): number {
  if (value === undefined) return DEFAULT_CONNECT_TIMEOUT_MS
  if (!Number.isSafeInteger(value) || (value as number) < 0)
    check.fail(
      `\`connectTimeoutMs\` must be a whole number of milliseconds, 0 or more (0: do not wait), got ${String(value)}`,
    )
  return value as number
}

export function mergeParams(base: Params, options: RateLimitOptions): Params {
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
export function counterName(prefix: string, label: string): string {
  const name = `${prefix}.${label}`
  if (/^[A-Za-z0-9_.-]{1,64}$/.test(name)) return name
  return `${prefix}.${createHash('sha256')
    .update(label)
    .digest('base64url')
    .slice(0, 16)
    .replace(/[^A-Za-z0-9]/g, '_')}`
}
