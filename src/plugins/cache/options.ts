import type { FastifyRequest } from 'fastify'
import { DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import { declareOptions, type OptionsOf, option, type SettingsOf } from '../common/options.ts'
import { CACHE_OPTION_HINTS } from './entry-options.ts'

// The cache plugin's options and a route's `config.cache`, declared once: the types, the checks,
// the defaults and the table in docs/cache.md all come from here (test/unit/options-docs.test.ts).

export const CACHE_OPTIONS = declareOptions(
  'cache plugin',
  {
    enabled: option.boolean({
      default: true,
      doc: '`false`: `getOrLoad` calls the loader, `invalidate` does nothing, Redis is not touched',
    }),
    redis: option.redisClient({
      doc: 'an ioredis `Redis` or `Cluster` for the cache',
      defaultText: '`app.redis`',
    }),
    sharedWithDurableData: option.boolean({
      default: false,
      doc: 'set when this Redis also holds sessions, idempotency records or rate limits: registration then fails if its `maxmemory-policy` is not `noeviction` (`RedisServerError`, `FRG_REDIS_EVICTION_POLICY`)',
    }),
    connectTimeoutMs: option.integer({
      min: 0,
      default: DEFAULT_CONNECT_TIMEOUT_MS,
      doc: 'how long registration waits for the client to be ready; 0 does not wait. A cache Redis not ready by then does not stop the boot: a warning names its address and last error, and reads go to their loaders until it answers',
    }),
    keyPrefix: option.string({
      default: 'cache:',
      doc: 'prefix of every key and of the pub/sub channel; no braces',
    }),
    ttlMs: option.integer({
      min: 1,
      default: 60_000,
      doc: 'fresh lifetime (per call: `getOrLoad(key, loader, { ttlMs })`); also the bound on staleness after a failed invalidation',
    }),
    jitter: option.number({
      min: 0,
      max: 1,
      default: 0.2,
      doc: 'fraction of the TTL added uniformly at random per fill, 0 to 1',
    }),
    staleWhileRevalidateMs: option.integer({
      min: 0,
      default: 0,
      defaultText: '0 (off)',
      doc: 'past the soft TTL the entry is served for this long while one caller refreshes it',
    }),
    earlyRefreshBeta: option.number({
      min: 0,
      max: 10,
      default: 0,
      defaultText: '0 (off)',
      doc: 'XFetch: refresh early when `now - loadMs * beta * ln(rand) >= softExpiry` (1 is typical)',
    }),
    negativeTtlMs: option.integer({ min: 1, default: 5000, doc: 'lifetime of a cached "not found"' }),
    leaseTtlMs: option.integer({
      min: 10,
      default: 5000,
      doc: "lifetime of a fill lease: bounds a crashed holder (the demo's Postgres statement timeout)",
    }),
    leaseWaitMs: option.integer({
      min: 0,
      default: 2000,
      doc: "how long a miss waits for another holder's fill; at most `leaseTtlMs`",
    }),
    maxConcurrentLoads: option.integer({
      min: 1,
      default: 8,
      doc: 'loads at once per process, including every load while the cache Redis is down',
    }),
    l1TtlMs: option.integer({
      min: 0,
      default: 0,
      defaultText: '0 (off)',
      doc: 'in-process L1 lifetime, kept coherent through Redis pub/sub',
    }),
    l1MaxEntries: option.integer({
      min: 1,
      default: 10_000,
      doc: 'L1 bound (oldest insertion evicted first)',
    }),
    softTimeoutMs: option.integer({
      min: 0,
      default: 0,
      doc: 'with a stale copy, how long a read that refreshes it waits for the refresh before serving the copy; 0 serves it at once ([Loader timeouts](#loader-timeouts-and-errors))',
    }),
    hardTimeoutMs: option.integer({
      min: 0,
      default: 0,
      defaultText: '0 (none)',
      doc: 'with no stale copy, how long a read waits for a load before it rejects with `CacheLoadTimeoutError`',
    }),
    onLoadError: option.oneOf(['serve-stale', 'fail'] as const, {
      default: 'serve-stale',
      doc: "a refresh the read waits for throws: `'serve-stale'` or `'fail'`",
    }),
    fence: option.boolean({
      default: true,
      doc: '`false` only to demonstrate the stale-set race in the tests; never in production',
    }),
    serialize: option.function<(value: unknown) => string>({
      default: JSON.stringify,
      defaultText: '`JSON.stringify`',
      doc: 'a value to the string stored; must return a string ([Values and JSON](#values-and-json))',
    }),
    deserialize: option.function<(payload: string) => unknown>({
      default: JSON.parse,
      defaultText: '`JSON.parse`',
      doc: 'a stored string back to a value (e.g. with a reviver that restores Dates)',
    }),
  },
  {
    hints: CACHE_OPTION_HINTS,
    check({ keyPrefix, leaseWaitMs, leaseTtlMs }, fail) {
      if (/[{}]/.test(keyPrefix))
        fail(`\`keyPrefix\` must not contain braces (they would change the hash tag), got '${keyPrefix}'`)
      if (leaseWaitMs > leaseTtlMs)
        fail(`\`leaseWaitMs\` (${leaseWaitMs}) must not exceed \`leaseTtlMs\` (${leaseTtlMs})`)
    },
  },
)

/** The cache plugin's options (see docs/cache.md, "Options"). */
export type CachePluginOptions = OptionsOf<typeof CACHE_OPTIONS>
export type CachePluginSettings = SettingsOf<typeof CACHE_OPTIONS>

/** A route's `config.cache`. */
export const CACHE_ROUTE_OPTIONS = declareOptions(
  'cache plugin',
  {
    prefetch: option.function<(request: FastifyRequest) => string | undefined>({
      type: 'a function of the request returning a key or undefined',
      doc: 'the key the handler reads, peeked while the other onRequest hooks run',
    }),
  },
  { hints: CACHE_OPTION_HINTS },
)

/**
 * A route's `config.cache`. `prefetch`: the key this route's handler reads with `getOrLoad`, from
 * what is known in onRequest (params, query, headers: not the body, not the session), or undefined.
 * The entry is peeked (read-only: no lease) while the other plugins' onRequest commands are in
 * flight, and a `getOrLoad` of that key made before the handler's first await takes the answer: a
 * fresh entry costs no round trip of its own, anything else is read as usual, once the route's
 * checks have passed.
 */
export type CacheRouteConfig = OptionsOf<typeof CACHE_ROUTE_OPTIONS>
