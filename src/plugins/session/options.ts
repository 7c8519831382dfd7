import { describeValue } from '../../redis/client.ts'
import { DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import { declareOptions, type Fail, type OptionsOf, option, type SettingsOf } from '../common/options.ts'
import type { L1Settings } from './l1.ts'

/** @fastify/session's names (and express-session's), with what to write here instead. */
const HINTS = {
  secret:
    '`secrets` takes an array (each 32+ characters; the first signs, all verify): write `secrets: [secret]`',
  cookie:
    'cookie attributes are flat options here: `secure`, `sameSite`, `domain`, `path`, `partitioned`; `maxAge` and `expires` are `absoluteTimeoutMs`, and the cookie is always HttpOnly',
  store: 'the store is always Redis: pass `redis` (an ioredis client) and `keyPrefix`',
  rolling:
    'every request that presents the session slides its idle expiry (`idleTimeoutMs`, at most every `touchAfterMs`); there is no switch',
  cookiePrefix: 'cookies are `<id>.<signature>`; name the cookie with `cookieName`',
  idGenerator: 'session ids are always 256 random bits, issued by the server',
}

const DOMAIN =
  /^\.?(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/
/** Printable ASCII but space and `;` (RFC 6265 path-value), at most 1024 characters. */
const COOKIE_PATH = /^\/[\x21-\x3A\x3C-\x7E]{0,1023}$/

const MINUTE = 60_000
const HOUR = 60 * MINUTE

/** The timeouts, read alike by the plugin and the store (a store of its own, `new SessionStore`). */
const TIMEOUTS = {
  idleTimeoutMs: option.integer({
    min: 1,
    default: 30 * MINUTE,
    defaultText: '30 min',
    doc: 'idle expiry, slid by the requests that present the session',
  }),
  absoluteTimeoutMs: option.integer({
    min: 1,
    default: 8 * HOUR,
    defaultText: '8 h',
    doc: "lifetime from login (or from an anonymous session's first change) regardless of activity; at least `idleTimeoutMs`",
  }),
  maxIdleTimeoutMs: option.integer({
    min: 1,
    defaultText: '`idleTimeoutMs`',
    doc: 'the longest idle timeout a login may give its session ([Per-session lifetime](#per-session-lifetime-remember-me)); at least `idleTimeoutMs`',
  }),
  maxAbsoluteTimeoutMs: option.integer({
    min: 1,
    defaultText: '`absoluteTimeoutMs`',
    doc: 'the longest lifetime a login may give its session; at least `absoluteTimeoutMs` and `maxIdleTimeoutMs`',
  }),
  touchAfterMs: option.integer({
    min: 0,
    defaultText: '`idleTimeoutMs / 20`',
    doc: 'a request slides the idle expiry only if this instance last did so for that session at least this long ago: a session expires between `idleTimeoutMs - touchAfterMs` and `idleTimeoutMs` after its last request, and most requests write nothing to Redis; 0 slides it on every request; below `idleTimeoutMs`. A session given a shorter idle timeout at login is slid after the same share of its own (`touchAfterMs × its idle / idleTimeoutMs`)',
  }),
}

const KEY_PREFIX = option.string({ default: 'sess:', doc: 'prefix of every key' })

/** The L1's bounds when it is on without saying them. */
export const L1_DEFAULTS: L1Settings = Object.freeze({ maxEntries: 10_000, ttlMs: 5_000 })
const L1_KEYS = ['maxEntries', 'ttlMs']

/** `l1`: false, true (the defaults) or `{ maxEntries?, ttlMs? }`; read to the settings or false. */
function l1Option(defaultValue: L1Settings | false, defaultText: string, doc: string) {
  return option.custom<L1Settings | false, boolean | Partial<L1Settings>>({
    type: 'boolean | { maxEntries?, ttlMs? }',
    default: defaultValue,
    defaultText,
    doc,
    read(value, fail) {
      if (value === false) return false
      if (value === true) return L1_DEFAULTS
      if (typeof value !== 'object' || value === null || Array.isArray(value))
        fail(`\`l1\` must be true, false or { maxEntries?, ttlMs? }, got ${describeValue(value)}`)
      const given = value as Record<string, unknown>
      const unknown = Object.keys(given).find((key) => !L1_KEYS.includes(key))
      if (unknown !== undefined) fail(`\`l1\` takes maxEntries and ttlMs only, got \`${unknown}\``)
      const read = (key: keyof L1Settings) => {
        const v = given[key]
        if (v === undefined) return L1_DEFAULTS[key]
        if (!Number.isSafeInteger(v) || (v as number) < 1)
          fail(`\`l1.${key}\` must be an integer of at least 1, got ${describeValue(v)}`)
        return v as number
      }
      return Object.freeze({ maxEntries: read('maxEntries'), ttlMs: read('ttlMs') })
    },
  })
}

/** The rules across the timeouts, the plugin's and the store's. */
function checkTimeouts(o: SettingsOf<typeof TIMEOUTS>, fail: Fail): void {
  if (o.absoluteTimeoutMs < o.idleTimeoutMs)
    fail('`absoluteTimeoutMs` must be an integer no smaller than `idleTimeoutMs`')
  const maxIdle = o.maxIdleTimeoutMs ?? o.idleTimeoutMs
  if (maxIdle < o.idleTimeoutMs)
    fail(
      `\`maxIdleTimeoutMs\` must be an integer no smaller than \`idleTimeoutMs\` (${o.idleTimeoutMs}), got ${maxIdle}`,
    )
  const maxAbsolute = o.maxAbsoluteTimeoutMs ?? o.absoluteTimeoutMs
  if (maxAbsolute < o.absoluteTimeoutMs || maxAbsolute < maxIdle)
    fail(
      `\`maxAbsoluteTimeoutMs\` must be an integer no smaller than \`absoluteTimeoutMs\` (${o.absoluteTimeoutMs}) and \`maxIdleTimeoutMs\` (${maxIdle}), got ${maxAbsolute}`,
    )
  if (o.touchAfterMs !== undefined && o.touchAfterMs >= o.idleTimeoutMs)
    fail('`touchAfterMs` must be an integer from 0 to below `idleTimeoutMs`')
}

/** A `SessionStore`'s options (`new SessionStore(redis, options)`): the plugin's timeouts and key prefix, and a clock. */
export const SESSION_STORE_OPTIONS = declareOptions(
  'session store',
  {
    keyPrefix: KEY_PREFIX,
    ...TIMEOUTS,
    now: option.function<() => number>({
      default: Date.now,
      defaultText: '`Date.now`',
      doc: "this process's clock in ms: the absolute lifetime and `touchAfterMs` are read on it",
    }),
    l1: l1Option(
      false,
      '`false`',
      "a local cache of loaded sessions, as the plugin's ([L1](#l1-sessions-without-a-round-trip)); it opens a subscriber connection: call `store.close()` when done. Every store publishes its changes whatever this says",
    ),
  },
  { check: checkTimeouts },
)

export type SessionStoreOptions = OptionsOf<typeof SESSION_STORE_OPTIONS>
export type SessionStoreSettings = SettingsOf<typeof SESSION_STORE_OPTIONS>

/** The session plugin's options, declared once: how each is read, its default and its docs row. */
export const SESSION_OPTIONS = declareOptions(
  'session plugin',
  {
    secrets: option.required(
      option.custom<string[]>({
        type: 'string[]',
        doc: '32+ characters each; the first signs, all verify (rotation)',
        read(value, fail) {
          if (!Array.isArray(value) || value.length === 0)
            fail(`\`secrets\` must be a non-empty array of strings, got ${describeValue(value)}`)
          if ((value as unknown[]).some((s) => typeof s !== 'string' || s.length < 32))
            fail('every secret in `secrets` must be a string of at least 32 characters')
          return value as string[]
        },
      }),
    ),
    redis: option.redisClient({
      defaultText: '`app.redis` (the [redis plugin](redis.md))',
      doc: 'an ioredis `Redis` or `Cluster`; never closed by this plugin',
    }),
    cookieName: option.custom<string>({
      type: 'string',
      default: 'sid',
      doc: '1-32 letters, digits, `_` or `-`; the name gets a prefix with `secure: true` (see [Cookie](#cookie))',
      read(value, fail) {
        if (typeof value !== 'string' || !/^[A-Za-z0-9_-]{1,32}$/.test(value))
          fail('`cookieName` must be 1-32 letters, digits, _ or -')
        return value as string
      },
    }),
    secure: option.oneOf([true, false, 'auto'] as const, {
      default: false,
      doc: "`true`: `Secure` cookie (turn on behind HTTPS and in production); `'auto'`: `Secure` when the request came over HTTPS",
    }),
    sameSite: option.oneOf(['lax', 'strict', 'none'] as const, {
      default: 'lax',
      defaultText: '`lax`',
      doc: "`strict`, or `none` (needs `secure`: `true` or `'auto'`)",
    }),
    domain: option.custom<string>({
      type: 'string',
      defaultText: 'none (this host only)',
      doc: "the cookie's `Domain`, e.g. `example.com` to share the session with subdomains",
      read(value, fail) {
        if (typeof value !== 'string' || !DOMAIN.test(value))
          fail('`domain` must be a host name such as example.com')
        return value as string
      },
    }),
    path: option.custom<string>({
      type: 'string',
      default: '/',
      doc: "the cookie's `Path`",
      read(value, fail) {
        if (typeof value !== 'string' || !COOKIE_PATH.test(value))
          fail('`path` must start with / and hold no spaces, semicolons or control characters')
        return value as string
      },
    }),
    partitioned: option.boolean({
      default: false,
      doc: 'the `Partitioned` attribute (CHIPS), for a session inside a third-party frame; needs `secure`',
    }),
    saveUninitialized: option.boolean({
      default: false,
      doc: '`true`: anonymous sessions, stored on their first change (see [Anonymous sessions](#anonymous-sessions))',
    }),
    ...TIMEOUTS,
    keyPrefix: KEY_PREFIX,
    l1: l1Option(
      L1_DEFAULTS,
      '`{ maxEntries: 10000, ttlMs: 5000 }`',
      'a per-instance cache of loaded sessions: a session loaded less than `ttlMs` ago is answered without Redis while the invalidation channel is subscribed ([L1](#l1-sessions-without-a-round-trip)); `true` for the defaults, `false` for none',
    ),
    connectTimeoutMs: option.integer({
      min: 0,
      default: DEFAULT_CONNECT_TIMEOUT_MS,
      defaultText: '5 000',
      doc: 'how long registration waits for Redis to be ready (shared with every plugin on the same client); past it the boot goes on with a warning naming the address, and required routes answer 503 until Redis answers. `0`: do not wait',
    }),
  },
  {
    hints: HINTS,
    check(o, fail) {
      checkTimeouts(o, fail)
      if (o.sameSite === 'none' && o.secure === false)
        fail("`sameSite: 'none'` requires `secure` (true or 'auto')")
      if (o.partitioned && o.secure === false) fail("`partitioned` requires `secure` (true or 'auto')")
    },
  },
)

export type SessionPluginOptions = OptionsOf<typeof SESSION_OPTIONS>

/** The plugin's settings: the options read, the maxima resolved to their defaults. */
export type ValidOptions = Omit<
  SettingsOf<typeof SESSION_OPTIONS>,
  'maxIdleTimeoutMs' | 'maxAbsoluteTimeoutMs'
> & {
  readonly maxIdleTimeoutMs: number
  readonly maxAbsoluteTimeoutMs: number
}

export function validateOptions(options: SessionPluginOptions): ValidOptions {
  if (typeof options !== 'object' || options === null)
    SESSION_OPTIONS.checker.fail(
      `options are required (an object with \`secrets\`), got ${describeValue(options)}`,
    )
  const settings = SESSION_OPTIONS.read(options)
  return Object.freeze({
    ...settings,
    maxIdleTimeoutMs: settings.maxIdleTimeoutMs ?? settings.idleTimeoutMs,
    maxAbsoluteTimeoutMs: settings.maxAbsoluteTimeoutMs ?? settings.absoluteTimeoutMs,
  })
}

/** The store's options among the plugin's settings. */
export function storeOptions(settings: ValidOptions): SessionStoreOptions {
  const {
    keyPrefix,
    idleTimeoutMs,
    absoluteTimeoutMs,
    maxIdleTimeoutMs,
    maxAbsoluteTimeoutMs,
    touchAfterMs,
    l1,
  } = settings
  return {
    keyPrefix,
    idleTimeoutMs,
    absoluteTimeoutMs,
    maxIdleTimeoutMs,
    maxAbsoluteTimeoutMs,
    touchAfterMs,
    l1: l1 === false ? false : { ...l1 },
  }
}
