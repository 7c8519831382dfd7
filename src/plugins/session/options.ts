import { type AnyRedisClient, describeValue } from '../../redis/client.ts'
import { DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import { optionChecker, optionKeys } from '../common/options.ts'

export interface SessionPluginOptions {
  /** Signing secrets, each at least 32 characters; the first signs, all verify (rotation). */
  secrets: string[]
  /** Any ioredis Redis or Cluster; defaults to the redis plugin's `app.redis`. Never closed by this plugin. */
  redis?: AnyRedisClient
  /**
   * Cookie name. With `secure: true` it gets the `__Host-` prefix (`Path=/`, no `Domain`), or
   * `__Secure-` when `domain` or another `path` is set; no prefix otherwise. Default `sid`.
   */
  cookieName?: string
  /**
   * Sends the cookie with Secure (turn on behind HTTPS and in production). `'auto'`: Secure when
   * the request came over HTTPS (`request.protocol === 'https'`), and the name has no prefix. Default false.
   */
  secure?: boolean | 'auto'
  /** Default `'lax'`. `'none'` needs `secure` (true or 'auto'; under 'auto' a plain HTTP response gets Lax). */
  sameSite?: 'lax' | 'strict' | 'none'
  /** The cookie's Domain attribute (sent to subdomains too). Default none: this host only. */
  domain?: string
  /** The cookie's Path attribute. Default `/`. */
  path?: string
  /** The Partitioned attribute (CHIPS), for a session inside a third-party frame; needs `secure`. Default false. */
  partitioned?: boolean
  /**
   * True: a request without a session gets an anonymous one (no principal), stored in Redis and
   * sent as a cookie as soon as something is set on it; an untouched one is never stored. Default
   * false: `request.session` is null until login.
   */
  saveUninitialized?: boolean
  /** Idle expiry, slid on every request that presents the session. Default 30 minutes. */
  idleTimeoutMs?: number
  /** Lifetime from login regardless of activity. Default 8 hours. */
  absoluteTimeoutMs?: number
  /**
   * Longest idle timeout a login may give its session (`reply.regenerateSession`'s `lifetime`, e.g.
   * "remember me"). Default `idleTimeoutMs`: no login may ask for more.
   */
  maxIdleTimeoutMs?: number
  /** Longest lifetime a login may give its session. Default `absoluteTimeoutMs`: no login may ask for more. */
  maxAbsoluteTimeoutMs?: number
  /**
   * A request slides the idle expiry only when this instance last did so for that session at least
   * this long ago, so most requests write nothing to Redis; a session then expires between
   * `idleTimeoutMs - touchAfterMs` and `idleTimeoutMs` after its last request. 0 slides it on every
   * request. Default `idleTimeoutMs / 20` (90 s of the default 30 minutes). A session given a
   * shorter idle timeout at login is slid after the same share of its own.
   */
  touchAfterMs?: number
  /** Prepended to every session and index key. Default `sess:`. */
  keyPrefix?: string
  /** How long registration waits for Redis to be ready (0: do not wait). Default 5000. */
  connectTimeoutMs?: number
}

export interface ValidOptions {
  secrets: string[]
  cookieName: string
  secure: boolean | 'auto'
  sameSite: 'lax' | 'strict' | 'none'
  domain: string | undefined
  path: string
  partitioned: boolean
  saveUninitialized: boolean
  idleTimeoutMs: number
  absoluteTimeoutMs: number
  maxIdleTimeoutMs: number
  maxAbsoluteTimeoutMs: number
  touchAfterMs: number | undefined
  keyPrefix: string
  connectTimeoutMs: number
}

const PLUGIN_OPTIONS = optionKeys<SessionPluginOptions>({
  secrets: true,
  redis: true,
  cookieName: true,
  secure: true,
  sameSite: true,
  domain: true,
  path: true,
  partitioned: true,
  saveUninitialized: true,
  idleTimeoutMs: true,
  absoluteTimeoutMs: true,
  maxIdleTimeoutMs: true,
  maxAbsoluteTimeoutMs: true,
  touchAfterMs: true,
  keyPrefix: true,
  connectTimeoutMs: true,
})

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

/** A wrong value as the message shows it: a number as written, anything else by its type. */
const shown = (value: unknown) => (typeof value === 'number' ? String(value) : describeValue(value))

const DOMAIN =
  /^\.?(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/
/** Printable ASCII but space and `;` (RFC 6265 path-value), at most 1024 characters. */
const COOKIE_PATH = /^\/[\x21-\x3A\x3C-\x7E]{0,1023}$/

export function validateOptions(options: SessionPluginOptions): ValidOptions {
  const check = optionChecker('session plugin', HINTS)
  const fail = check.fail
  if (typeof options !== 'object' || options === null)
    fail(`options are required (an object with \`secrets\`), got ${describeValue(options)}`)
  check.known(options, PLUGIN_OPTIONS)
  if (!Array.isArray(options.secrets) || options.secrets.length === 0)
    fail(`\`secrets\` must be a non-empty array of strings, got ${describeValue(options.secrets)}`)
  if (options.secrets.some((s) => typeof s !== 'string' || s.length < 32)) {
    fail('every secret in `secrets` must be a string of at least 32 characters')
  }
  const idleTimeoutMs = options.idleTimeoutMs ?? 30 * 60_000
  const absoluteTimeoutMs = options.absoluteTimeoutMs ?? 8 * 3_600_000
  if (!Number.isSafeInteger(idleTimeoutMs) || idleTimeoutMs <= 0)
    fail(`\`idleTimeoutMs\` must be a positive integer, got ${shown(idleTimeoutMs)}`)
  if (!Number.isSafeInteger(absoluteTimeoutMs) || absoluteTimeoutMs < idleTimeoutMs) {
    fail('`absoluteTimeoutMs` must be an integer no smaller than `idleTimeoutMs`')
  }
  const maxIdleTimeoutMs = options.maxIdleTimeoutMs ?? idleTimeoutMs
  if (!Number.isSafeInteger(maxIdleTimeoutMs) || maxIdleTimeoutMs < idleTimeoutMs)
    fail(
      `\`maxIdleTimeoutMs\` must be an integer no smaller than \`idleTimeoutMs\` (${idleTimeoutMs}), got ${shown(maxIdleTimeoutMs)}`,
    )
  const maxAbsoluteTimeoutMs = options.maxAbsoluteTimeoutMs ?? absoluteTimeoutMs
  if (
    !Number.isSafeInteger(maxAbsoluteTimeoutMs) ||
    maxAbsoluteTimeoutMs < absoluteTimeoutMs ||
    maxAbsoluteTimeoutMs < maxIdleTimeoutMs
  )
    fail(
      `\`maxAbsoluteTimeoutMs\` must be an integer no smaller than \`absoluteTimeoutMs\` (${absoluteTimeoutMs}) and \`maxIdleTimeoutMs\` (${maxIdleTimeoutMs}), got ${shown(maxAbsoluteTimeoutMs)}`,
    )
  // Its default lives in the store (SessionStore is usable on its own).
  const touchAfterMs = options.touchAfterMs
  if (
    touchAfterMs !== undefined &&
    (!Number.isSafeInteger(touchAfterMs) || touchAfterMs < 0 || touchAfterMs >= idleTimeoutMs)
  )
    fail('`touchAfterMs` must be an integer from 0 to below `idleTimeoutMs`')
  const secure = options.secure ?? false
  if (secure !== true && secure !== false && secure !== 'auto') fail("`secure` must be true, false or 'auto'")
  const sameSite = options.sameSite ?? 'lax'
  if (sameSite !== 'lax' && sameSite !== 'strict' && sameSite !== 'none')
    fail("`sameSite` must be 'lax', 'strict' or 'none'")
  if (sameSite === 'none' && secure === false) fail("`sameSite: 'none'` requires `secure` (true or 'auto')")
  const partitioned = options.partitioned ?? false
  if (typeof partitioned !== 'boolean') fail('`partitioned` must be a boolean')
  if (partitioned && secure === false) fail("`partitioned` requires `secure` (true or 'auto')")
  const domain = options.domain
  if (domain !== undefined && (typeof domain !== 'string' || !DOMAIN.test(domain)))
    fail('`domain` must be a host name such as example.com')
  const path = options.path ?? '/'
  if (typeof path !== 'string' || !COOKIE_PATH.test(path))
    fail('`path` must start with / and hold no spaces, semicolons or control characters')
  const saveUninitialized = options.saveUninitialized ?? false
  if (typeof saveUninitialized !== 'boolean') fail('`saveUninitialized` must be a boolean')
  const cookieName = options.cookieName ?? 'sid'
  if (typeof cookieName !== 'string' || !/^[A-Za-z0-9_-]{1,32}$/.test(cookieName))
    fail('`cookieName` must be 1-32 letters, digits, _ or -')
  const keyPrefix = options.keyPrefix ?? 'sess:'
  if (typeof keyPrefix !== 'string') fail(`\`keyPrefix\` must be a string, got ${describeValue(keyPrefix)}`)
  const connectTimeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS
  if (!Number.isSafeInteger(connectTimeoutMs) || connectTimeoutMs < 0)
    fail(
      `\`connectTimeoutMs\` must be a whole number of milliseconds, 0 or more, got ${shown(connectTimeoutMs)}`,
    )
  return {
    secrets: options.secrets,
    secure,
    sameSite,
    domain,
    path,
    partitioned,
    saveUninitialized,
    cookieName,
    idleTimeoutMs,
    absoluteTimeoutMs,
    maxIdleTimeoutMs,
    maxAbsoluteTimeoutMs,
    touchAfterMs,
    keyPrefix,
    connectTimeoutMs,
  }
}
