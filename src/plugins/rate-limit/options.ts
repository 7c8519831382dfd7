import { describeValue } from '../../redis/client.ts'
import { type OptionChecker, type OptionHints, optionChecker, optionKeys } from '../common/options.ts'
import { checkPrincipalOption } from '../common/principal.ts'
import { durationOption } from './duration.ts'
import type { BanOptions, RateLimitPluginOptions, RateLimitPolicy } from './types.ts'

// Every options object of the plugin is checked key by key: a misspelt `algoritm:` or
// @fastify/rate-limit's `max:` would otherwise leave a route unlimited in silence. Names from
// @fastify/rate-limit get a hint saying what to write here instead.

export const POLICY_KEYS = optionKeys<RateLimitPolicy>({
  name: true,
  algorithm: true,
  limit: true,
  windowMs: true,
  refillPerSecond: true,
  key: true,
  cost: true,
  hook: true,
  countOnlyFailures: true,
  onRedisError: true,
  localShare: true,
  maxDelayMs: true,
  allowList: true,
  blockMs: true,
  ban: true,
  exponentialBackoff: true,
  continueExceeding: true,
  onExceeded: true,
  errorResponse: true,
})

/** What a policy's `ban` object may hold. */
export const BAN_KEYS = optionKeys<BanOptions>({ after: true, onBanReach: true })

/** What `defaults` may hold: every policy option but its name. */
export const DEFAULTS_KEYS = POLICY_KEYS.filter((key) => key !== 'name')

const MIGRATING = '(see "Migrating from @fastify/rate-limit" in docs/rate-limit.md)'
const EXAMPLE = "policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 3, windowMs: '1 minute' }]"

const theirs = (name: string, advice: string) => `@fastify/rate-limit's \`${name}\` ${advice} ${MIGRATING}`
const none = (name: string, instead: string) => theirs(name, `has no equivalent here; ${instead}`)

/** @fastify/rate-limit's names, wherever they are written. */
const FASTIFY_RATE_LIMIT: OptionHints = {
  max: theirs('max', `is a policy's \`limit\`: ${EXAMPLE}`),
  timeWindow: theirs('timeWindow', `is a policy's \`windowMs\` (milliseconds or '1 minute'): ${EXAMPLE}`),
  keyGenerator: theirs(
    'keyGenerator',
    "is a policy's `key`: 'ip' or a function of the request returning the identity (keyBy.ip, keyBy.customer, keyBy.header(name), keyBy.bodyField(name))",
  ),
  groupId: theirs('groupId', "is a policy's `name`: routes naming one policy share its quota"),
  skipOnError: theirs(
    'skipOnError',
    "is a policy's `onRedisError: 'open'` (the default; 'closed' answers 503, 'local' limits in process), for every policy: defaults: { onRedisError: 'open' }",
  ),
  errorResponseBuilder: theirs(
    'errorResponseBuilder',
    'is `errorResponse(request, decision)`, of the plugin or of a policy (the status stays 429)',
  ),
  nameSpace: theirs('nameSpace', "is the plugin's `keyPrefix` (default 'rl:')"),
  cache: theirs(
    'cache',
    "(the size of its in-memory LRU) is the plugin's `memoryMaxKeys`, with store: 'memory'",
  ),
  global: theirs(
    'global',
    "has no switch here: the plugin's `policies` apply to every route registered after it, its `namedPolicies` only where a route names them (config: { rateLimits: 'name' })",
  ),
  ban: theirs(
    'ban',
    "is a fixed-window policy's `ban: { after: N, onBanReach(request, key) }` here (403 once N requests were rejected in the window)",
  ),
  onBanReach: theirs(
    'onBanReach',
    "is the `onBanReach(request, key)` of a fixed-window policy's `ban: { after: N, onBanReach }`",
  ),
  continueExceeding: theirs(
    'continueExceeding',
    'is set per fixed-window policy: `continueExceeding: true` (or in `defaults`)',
  ),
  exponentialBackoff: theirs(
    'exponentialBackoff',
    'is set per fixed-window policy: `exponentialBackoff: true` (or in `defaults`)',
  ),
  onExceeding: none('onExceeding', 'the RateLimit header and app.rateLimiter.peek say what is left'),
  addHeaders: none(
    'addHeaders',
    'the draft RateLimit and RateLimit-Policy headers are always sent; `legacyHeaders: true` adds X-RateLimit-*',
  ),
  addHeadersOnExceeding: none(
    'addHeadersOnExceeding',
    'the draft RateLimit and RateLimit-Policy headers are always sent; `legacyHeaders: true` adds X-RateLimit-*',
  ),
  enableDraftSpec: none(
    'enableDraftSpec',
    'the draft RateLimit and RateLimit-Policy headers are always sent; `legacyHeaders: true` adds X-RateLimit-*',
  ),
}

export const PLUGIN_KEYS = optionKeys<RateLimitPluginOptions>({
  store: true,
  memoryMaxKeys: true,
  redis: true,
  connectTimeoutMs: true,
  principal: true,
  keyPrefix: true,
  policies: true,
  namedPolicies: true,
  defaults: true,
  allowList: true,
  legacyHeaders: true,
  overLimitCacheKeys: true,
  retryRedisAfterMs: true,
  timeoutMs: true,
  ipv6Subnet: true,
  onExceeded: true,
  errorResponse: true,
  now: true,
})

/** A policy's option written among the plugin's, and the reverse, say where it belongs. */
const misplaced = (keys: readonly string[], where: string): OptionHints =>
  Object.fromEntries(keys.map((key) => [key, `\`${key}\` is an option of ${where}`]))

export const pluginCheck: OptionChecker = optionChecker('rate-limit plugin', {
  ...misplaced(
    POLICY_KEYS.filter((key) => !PLUGIN_KEYS.includes(key)),
    `a policy (or of \`defaults\`): ${EXAMPLE}`,
  ),
  ...FASTIFY_RATE_LIMIT,
  hook: "`hook` is set per policy ('onRequest' or 'preHandler'), for every policy in `defaults: { hook: 'preHandler' }`",
})

export const policyCheck: OptionChecker = optionChecker('rate-limit plugin', {
  ...misplaced(
    PLUGIN_KEYS.filter((key) => !POLICY_KEYS.includes(key)),
    'the plugin, not of a policy',
  ),
  ...FASTIFY_RATE_LIMIT,
})

/** A route's `config.rateLimit` (singular) is @fastify/rate-limit's and would be ignored here. */
export const routeConfigCheck: OptionChecker = optionChecker('rate-limit plugin', {
  rateLimit: theirs(
    'rateLimit',
    'route config is `config.rateLimits` (plural) here: a policy, the name of one of `namedPolicies`, a list of them, or false',
  ),
})

const nonNegativeInt = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0

/** Checks the plugin's options once, at registration; each policy is checked where it is defined. */
export function checkPluginOptions(o: RateLimitPluginOptions): void {
  const { fail } = pluginCheck
  if (typeof o !== 'object' || o === null) fail(`options must be an object, got ${describeValue(o)}`)
  pluginCheck.known(o, PLUGIN_KEYS)
  if (o.store !== undefined && o.store !== 'redis' && o.store !== 'memory')
    fail(
      `\`store\` must be 'redis' or 'memory'${typeof o.store === 'string' ? '' : ' (@fastify/rate-limit\'s custom store classes have no equivalent here; see "Migrating from @fastify/rate-limit" in docs/rate-limit.md)'}`,
    )
  if (o.memoryMaxKeys !== undefined && !(Number.isSafeInteger(o.memoryMaxKeys) && o.memoryMaxKeys >= 100))
    fail('`memoryMaxKeys` must be an integer of at least 100')
  if (
    o.ipv6Subnet !== undefined &&
    !(Number.isSafeInteger(o.ipv6Subnet) && o.ipv6Subnet >= 32 && o.ipv6Subnet <= 128)
  )
    fail('`ipv6Subnet` must be an integer from 32 to 128')
  for (const name of ['onExceeded', 'errorResponse'] as const) {
    if (o[name] !== undefined && typeof o[name] !== 'function')
      fail(`\`${name}\` must be a function of (request, decision)`)
  }
  if (o.keyPrefix !== undefined && typeof o.keyPrefix !== 'string') fail('`keyPrefix` must be a string')
  if (o.now !== undefined && typeof o.now !== 'function')
    fail('`now` must be a function returning ms since the epoch')
  checkPrincipalOption('rate-limit', o.principal)
  for (const list of ['policies', 'namedPolicies'] as const) {
    if (o[list] !== undefined && !Array.isArray(o[list])) fail(`\`${list}\` must be an array of policies`)
  }
  checkDefaults(o.defaults)
  if (o.connectTimeoutMs !== undefined && !nonNegativeInt(o.connectTimeoutMs))
    fail('`connectTimeoutMs` must be a non-negative whole number of milliseconds (0: do not wait)')
  if (o.legacyHeaders !== undefined && typeof o.legacyHeaders !== 'boolean')
    fail('`legacyHeaders` must be a boolean')
  if (o.overLimitCacheKeys !== undefined && !nonNegativeInt(o.overLimitCacheKeys))
    fail('`overLimitCacheKeys` must be a non-negative integer')
  for (const name of ['retryRedisAfterMs', 'timeoutMs'] as const) {
    if (o[name] !== undefined) durationOption(name, o[name], 1, fail)
  }
}

/** Checks the plugin's `defaults` (a policy's options but its name) once, at registration. */
export function checkDefaults(defaults: unknown): void {
  if (defaults === undefined) return
  if (typeof defaults !== 'object' || defaults === null || Array.isArray(defaults))
    policyCheck.fail(`\`defaults\` must be an object of policy options, got ${describeValue(defaults)}`)
  policyCheck.known(defaults, DEFAULTS_KEYS, 'defaults')
}
