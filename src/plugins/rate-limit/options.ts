import type { FastifyRequest } from 'fastify'
import { describeValue } from '../../redis/client.ts'
import { DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import {
  declareOptions,
  type Fail,
  type OptionChecker,
  type OptionHints,
  type OptionsOf,
  option,
  optionChecker,
  optionKeys,
  type SettingsOf,
} from '../common/options.ts'
import type { PrincipalFunction } from '../common/principal.ts'
import { type Duration, durationOption } from './duration.ts'
import { DEFAULT_IPV6_SUBNET } from './keys.ts'
import type {
  AllowList,
  BanOptions,
  ErrorResponseBuilder,
  ExceededHandler,
  RateLimitPolicy,
} from './types.ts'

// Every options object of the plugin is checked key by key: a misspelt `algoritm:` or
// @fastify/rate-limit's `max:` would otherwise leave a route unlimited in silence. Names from
// @fastify/rate-limit get a hint saying what to write here instead. The plugin's own options are
// declared once (RATE_LIMIT_OPTIONS): their type, checks, defaults and the table in
// docs/rate-limit.md come from that declaration; a policy's are checked by normalizePolicy.

export const POLICY_KEYS = optionKeys<RateLimitPolicy>({
  name: true,
  algorithm: true,
  limit: true,
  windowMs: true,
  refillPerSecond: true,
  leaseMs: true,
  key: true,
  cost: true,
  hook: true,
  countOnlyFailures: true,
  settle: true,
  quotaUnit: true,
  sync: true,
  shadow: true,
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

/** A policy's option written among the plugin's, and the reverse, say where it belongs. */
const misplaced = (keys: readonly string[], where: string): OptionHints =>
  Object.fromEntries(keys.map((key) => [key, `\`${key}\` is an option of ${where}`]))

/** A list of policies as written; each is checked where the plugin defines it (policies.ts). */
function policyList(value: unknown, fail: Fail, name: string): RateLimitPolicy[] {
  if (!Array.isArray(value)) fail(`\`${name}\` must be an array of policies`)
  return value as RateLimitPolicy[]
}

/** A plugin or a policy's `allowList` as the predicate it is checked with; null when there is none. */
export function allowListPredicate(
  list: AllowList | undefined,
  fail: (message: string) => never,
): ((r: FastifyRequest) => boolean) | null {
  if (list === undefined) return null
  if (typeof list === 'function') return list
  if (!Array.isArray(list) || list.some((ip) => typeof ip !== 'string'))
    fail('`allowList` must be an array of IP strings or a function')
  const ips = new Set(list)
  return (request) => ips.has(request.ip)
}

/** A duration option (milliseconds or a duration string) read as milliseconds, at least 1. */
const duration = (ms: number, doc: string) =>
  option.custom<number, Duration>({
    type: 'duration',
    default: ms,
    doc: `${doc} ([duration](#durations))`,
    read: (value, fail, name) => durationOption(name, value, 1, fail),
  })

const PLUGIN_DECLARATIONS = {
  store: option.custom<'redis' | 'memory'>({
    type: "'redis' | 'memory'",
    default: 'redis',
    defaultText: "`'redis'`",
    doc: "where counters live: `'redis'`, shared by every instance, or `'memory'`, this process only ([stores](#stores-redis-or-memory))",
    read(value, fail) {
      if (value !== 'redis' && value !== 'memory')
        fail(
          `\`store\` must be 'redis' or 'memory'${typeof value === 'string' ? '' : ` (@fastify/rate-limit's custom store classes have no equivalent here; ${MIGRATING.slice(1, -1)})`}`,
        )
      return value as 'redis' | 'memory'
    },
  }),
  memoryMaxKeys: option.integer({
    min: 100,
    default: 100_000,
    doc: "`store: 'memory'`: keys kept at most (at least 100); the least recently used is dropped past it",
  }),
  redis: option.redisClient({
    doc: "an ioredis `Redis` or `Cluster`; never closed by this plugin. Without either, or with something else (a URL string, an options object), the boot fails with `FRG_REDIS_CLIENT_INVALID`. Not used with `store: 'memory'`",
    defaultText: '`app.redis` (the [redis plugin](redis.md))',
  }),
  connectTimeoutMs: option.integer({
    min: 0,
    default: DEFAULT_CONNECT_TIMEOUT_MS,
    doc: 'how long registration waits for the client to be ready ([boot](#boot)); 0: do not wait',
  }),
  keyPrefix: option.string({ default: 'rl:', doc: 'prefix of every key ([Redis layout](#redis-layout))' }),
  principal: option.function<PrincipalFunction>({
    type: 'a function of the request returning who the caller is',
    defaultText: "the session plugin's principal, if registered",
    // In a docs table's cell: its pipes escaped.
    doc: '`(request) => string \\| null \\| undefined`; what `keyBy.customer` keys by',
  }),
  policies: option.custom<readonly RateLimitPolicy[], RateLimitPolicy[]>({
    type: 'policy[]',
    default: [],
    defaultText: '`[]`',
    doc: 'applied to every route registered after the plugin (unless the route says `rateLimits: false`)',
    read: policyList,
  }),
  namedPolicies: option.custom<readonly RateLimitPolicy[], RateLimitPolicy[]>({
    type: 'policy[]',
    default: [],
    defaultText: '`[]`',
    doc: "defined once, applied where a route names them: `config: { rateLimits: 'login' }`",
    read: policyList,
  }),
  defaults: option.custom<Partial<Omit<RateLimitPolicy, 'name'>>>({
    type: 'policy options',
    default: {},
    defaultText: '`{}`',
    doc: 'option values every policy starts from (an explicit policy option wins)',
    read(value) {
      checkDefaults(value)
      return value as Partial<Omit<RateLimitPolicy, 'name'>>
    },
  }),
  allowList: option.custom<((request: FastifyRequest) => boolean) | null, AllowList>({
    type: 'string[] | function',
    default: null,
    defaultText: 'none',
    doc: 'client IPs or a predicate; every policy is skipped for them',
    read: (value, fail) => allowListPredicate(value as AllowList, fail),
  }),
  legacyHeaders: option.boolean({
    default: false,
    doc: 'also `X-RateLimit-Limit/-Remaining/-Reset` for the tightest policy',
  }),
  overrides: option.custom<{ pollMs: number } | null, boolean | { pollMs?: Duration }>({
    type: 'boolean | { pollMs? }',
    default: null,
    defaultText: '`false`',
    doc: "runtime [overrides](#overrides) of a policy's limit per key (`app.rateLimiter.overrides`): `true`, or `{ pollMs }`, how often each instance checks for a change whose message it missed (default 5 s, at least 100 ms)",
    read(value, fail) {
      if (value === false) return null
      if (value === true) return { pollMs: 5000 }
      if (typeof value !== 'object' || value === null || Array.isArray(value))
        fail(`\`overrides\` must be true, false or { pollMs? }, got ${describeValue(value)}`)
      const given = value as { pollMs?: Duration }
      pluginCheck.known(given, ['pollMs'], 'overrides')
      const pollMs = durationOption('overrides.pollMs', given.pollMs ?? 5000, 1, fail)
      if (pollMs < 100) fail('`overrides.pollMs` must be at least 100 ms (every poll is a Redis call)')
      return { pollMs }
    },
  }),
  overLimitCacheKeys: option.integer({
    min: 0,
    default: 10_000,
    doc: 'keys remembered in memory while over their limit; 0 turns it off',
  }),
  retryRedisAfterMs: duration(
    1000,
    "after a Redis failure, decide by each policy's `onRedisError` for this long before asking Redis again",
  ),
  timeoutMs: duration(
    500,
    "bound on a script call (and on `reset`, `block`), used only when the client has no command timeout of its own (ioredis's `commandTimeout` or [`boundCommands`](redis.md#command-timeout-one-timer-per-client))",
  ),
  ipv6Subnet: option.integer({
    min: 32,
    max: 128,
    default: DEFAULT_IPV6_SUBNET,
    doc: 'IPv6 clients are keyed by this prefix length, 32 to 128 ([client addresses](#client-addresses-and-ipv6))',
  }),
  onExceeded: option.function<ExceededHandler>({
    type: 'a function of (request, decision)',
    doc: "`(request, decision) => void`, told of every 429 (and every [ban](#penalties-ban-exponentialbackoff-continueexceeding)'s 403) unless the policy has its own ([your own 429](#your-own-429-onexceeded-and-errorresponse))",
  }),
  errorResponse: option.function<ErrorResponseBuilder>({
    type: 'a function of (request, decision)',
    defaultText: 'the problem body',
    doc: "`(request, decision) => body`: the 429's body (a ban's 403's: `decision.isBanned`) unless the policy has its own",
  }),
  now: option.function<() => number>({
    type: 'a function returning ms since the epoch',
    default: Date.now,
    defaultText: '`Date.now`',
    doc: "this process's clock, `() => ms since the epoch`: what `store: 'memory'`, the `local` fallback and the over-limit cache read. Scripts on Redis read Redis's clock (`TIME`). Buffered leases are timed on the monotonic clock unless this is given. Tests pass a clock they move",
  }),
}

const PLUGIN_KEYS = Object.keys(PLUGIN_DECLARATIONS)

/** The plugin's options, declared once. */
export const RATE_LIMIT_OPTIONS = declareOptions('rate-limit plugin', PLUGIN_DECLARATIONS, {
  hints: {
    ...misplaced(
      POLICY_KEYS.filter((key) => !PLUGIN_KEYS.includes(key)),
      `a policy (or of \`defaults\`): ${EXAMPLE}`,
    ),
    ...FASTIFY_RATE_LIMIT,
    hook: "`hook` is set per policy ('onRequest' or 'preHandler'), for every policy in `defaults: { hook: 'preHandler' }`",
  },
})

/** The options the plugin is registered with (docs/rate-limit.md, "Options"). */
export type RateLimitPluginOptions = OptionsOf<typeof RATE_LIMIT_OPTIONS>
/** The plugin's options as read: checked, defaults applied. */
export type RateLimitSettings = SettingsOf<typeof RATE_LIMIT_OPTIONS>

/** The plugin's checker, for what is checked after its options were read (a route's config). */
export const pluginCheck: OptionChecker = RATE_LIMIT_OPTIONS.checker

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

/** Checks the plugin's `defaults` (a policy's options but its name) once, at registration. */
export function checkDefaults(defaults: unknown): void {
  if (defaults === undefined) return
  if (typeof defaults !== 'object' || defaults === null || Array.isArray(defaults))
    policyCheck.fail(`\`defaults\` must be an object of policy options, got ${describeValue(defaults)}`)
  policyCheck.known(defaults, DEFAULTS_KEYS, 'defaults')
}
