import { type OptionChecker, type OptionHints, optionChecker, optionKeys } from '../common/options.ts'
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
