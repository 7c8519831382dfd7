import type { FastifyReply, FastifyRequest } from 'fastify'
import type { PrincipalFunction } from '../common/principal.ts'
import type { RedisClient } from '../common/redis.ts'

/** When Redis cannot be asked: 'closed' answers 503; 'open' runs the handler on its own guard. */
export type IdempotencyFailureMode = 'closed' | 'open'

/**
 * Where the key comes from when the request has no key header (a client that cannot send one: an
 * HTML form, a webhook sender): e.g. a body field. null or undefined: no key. Asked only when the
 * header is absent; its value is checked like the header's.
 */
export type IdempotencyKeySource = (request: FastifyRequest) => string | null | undefined

/** What onReplay is told about the replay it precedes. */
export interface IdempotencyReplay {
  /** The decoded key. */
  key: string
  fingerprint: string
  /** The status the stored response had (a not-kept replay is sent as 410). */
  status: number
  /** False when the response was over `maxResponseBytes`: the replay is a 410 problem. */
  kept: boolean
}

/**
 * Called before a replay is sent, with the stored status and headers already on the reply: to log,
 * count, or add a header. It must not send. What it throws (or rejects with) is logged and the
 * replay is sent all the same.
 */
export type IdempotencyReplayHook = (
  request: FastifyRequest,
  reply: FastifyReply,
  replay: IdempotencyReplay,
) => void | Promise<void>

export interface IdempotencyPluginOptions {
  /**
   * Any ioredis Redis or Cluster; defaults to the redis plugin's `app.redis`. Never closed by this
   * plugin. Use a Redis without eviction (noeviction or volatile-*).
   */
  redis?: RedisClient
  /**
   * Who the caller is; default: this suite's session plugin if registered, else nobody. With one of
   * them, a key from a caller without a principal is refused (401) unless the route is `anonymous`.
   */
  principal?: PrincipalFunction
  /** Request header carrying the key. Default `Idempotency-Key`. */
  headerName?: string
  /** The key from the request when the header is absent (e.g. a body field); a route may set its own. */
  keyFrom?: IdempotencyKeySource
  /** Called before each replay is sent (log, add a header); a route may set its own. */
  onReplay?: IdempotencyReplayHook
  /** 400 when an opted-in route gets no key. Default true; a route may override it. */
  required?: boolean
  /**
   * Who may share a key; default the principal (else the client IP) + method + route pattern. A
   * scope of your own decides alone: no caller is refused for lacking a principal.
   */
  scope?: (request: FastifyRequest) => string
  /** How long a completed response is kept for replays. Default 24 h. */
  retentionMs?: number
  /** How long a claim stays exclusive without renewal; renewed every third of it while the handler runs. Default 10 s. */
  leaseMs?: number
  /** Larger responses are sent but not kept; a replay then answers 410. Default 64 KiB. */
  maxResponseBytes?: number
  /** Response headers stored and replayed (case-insensitive); Set-Cookie is refused. */
  replayHeaders?: string[]
  /**
   * When Redis fails: 'closed' answers 503 (default, safe for any handler); 'open' runs the
   * handler, for routes with their own guard such as a unique constraint in the database.
   */
  onRedisError?: IdempotencyFailureMode
  /** Prepended to every record key. Default `idem:`. */
  keyPrefix?: string
}

export interface IdempotencyRouteConfig {
  required?: boolean
  onRedisError?: IdempotencyFailureMode
  /**
   * Accept keys from callers without a principal, scoped by client IP (callers behind one NAT or
   * proxy then share keys). Default false: when the app knows principals (the `principal` option or
   * the session plugin), a key without one is refused with 401.
   */
  anonymous?: boolean
  /** This route's key source when the header is absent; replaces the plugin-wide `keyFrom`. */
  keyFrom?: IdempotencyKeySource
  /** This route's replay hook; replaces the plugin-wide `onReplay`. */
  onReplay?: IdempotencyReplayHook
}

export type ResolvedOptions = Required<
  Omit<IdempotencyPluginOptions, 'redis' | 'principal' | 'scope' | 'keyFrom' | 'onReplay'>
> & {
  scope: ((request: FastifyRequest) => string) | null
  keyFrom: IdempotencyKeySource | null
  onReplay: IdempotencyReplayHook | null
}

export interface ResolvedRouteConfig {
  required: boolean
  onRedisError: IdempotencyFailureMode
  anonymous: boolean
  keyFrom: IdempotencyKeySource | null
  onReplay: IdempotencyReplayHook | null
}

/** Options the plugin and makeIdempotent share, checked alike. */
export interface StoreOptions {
  leaseMs?: number
  retentionMs?: number
  onRedisError?: IdempotencyFailureMode
  keyPrefix?: string
}

export const DEFAULT_REPLAY_HEADERS = [
  'content-type',
  'content-language',
  'content-location',
  'location',
  'etag',
  'last-modified',
]

const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/
const FAILURE_MODES = ['closed', 'open']

type Fail = (message: string) => never

/** A thrower whose messages start with `label` ("idempotency plugin", "makeIdempotent"). */
export const failWith =
  (label: string): Fail =>
  (message) => {
    throw new Error(`${label}: ${message}`)
  }

const fail = failWith('idempotency plugin')

const isInteger = (value: unknown, min: number, max: number) =>
  Number.isSafeInteger(value) && (value as number) >= min && (value as number) <= max

/** The principal if there is one, else the client IP; then method and route pattern. */
export function defaultScope(request: FastifyRequest, who: string | null | undefined): string {
  return `${who ? `principal:${who}` : `ip:${request.ip}`}\n${request.method}\n${request.routeOptions.url}`
}

/** The lease, the retention, the failure mode and the key prefix, with their defaults. */
export function resolveStoreOptions(options: StoreOptions, fail: Fail): Required<StoreOptions> {
  const leaseMs = options.leaseMs ?? 10_000
  if (!isInteger(leaseMs, 100, 60_000)) fail('`leaseMs` must be an integer from 100 to 60000')
  const retentionMs = options.retentionMs ?? 24 * 3_600_000
  if (!isInteger(retentionMs, leaseMs + 1, Number.MAX_SAFE_INTEGER))
    fail('`retentionMs` must be an integer larger than `leaseMs`')
  const onRedisError = options.onRedisError ?? 'closed'
  if (!FAILURE_MODES.includes(onRedisError)) fail("`onRedisError` must be 'closed' or 'open'")
  const keyPrefix = options.keyPrefix ?? 'idem:'
  if (typeof keyPrefix !== 'string') fail('`keyPrefix` must be a string')
  return { leaseMs, retentionMs, onRedisError, keyPrefix }
}

/** A size cap in bytes (`maxResponseBytes`, `maxResultBytes`): 64 KiB by default, at most 16 MiB. */
export function resolveByteCap(value: number | undefined, name: string, fail: Fail): number {
  const bytes = value ?? 64 * 1024
  if (!isInteger(bytes, 1, 16 * 1024 * 1024)) fail(`\`${name}\` must be an integer from 1 to 16777216`)
  return bytes
}

export function resolveOptions(options: IdempotencyPluginOptions): ResolvedOptions {
  const headerName = options.headerName ?? 'Idempotency-Key'
  if (typeof headerName !== 'string' || !HEADER_NAME.test(headerName))
    fail('`headerName` must be a valid HTTP header name of 1-64 characters')
  const { leaseMs, retentionMs, onRedisError, keyPrefix } = resolveStoreOptions(options, fail)
  const maxResponseBytes = resolveByteCap(options.maxResponseBytes, 'maxResponseBytes', fail)
  const replayHeaders = options.replayHeaders ?? DEFAULT_REPLAY_HEADERS
  if (
    !Array.isArray(replayHeaders) ||
    replayHeaders.some((h) => typeof h !== 'string' || !HEADER_NAME.test(h))
  )
    fail('`replayHeaders` must be an array of header names')
  if (replayHeaders.some((h) => h.toLowerCase() === 'set-cookie'))
    fail('`replayHeaders` must not include Set-Cookie: a cookie belongs to one response')
  if (options.scope !== undefined && typeof options.scope !== 'function') fail('`scope` must be a function')
  if (options.principal !== undefined && typeof options.principal !== 'function')
    fail('`principal` must be a function of the request')
  if (options.required !== undefined && typeof options.required !== 'boolean')
    fail('`required` must be a boolean')
  if (options.keyFrom !== undefined && typeof options.keyFrom !== 'function')
    fail('`keyFrom` must be a function of the request')
  if (options.onReplay !== undefined && typeof options.onReplay !== 'function')
    fail('`onReplay` must be a function of the request and the reply')
  return {
    headerName,
    required: options.required ?? true,
    scope: options.scope ?? null,
    retentionMs,
    leaseMs,
    maxResponseBytes,
    replayHeaders: replayHeaders.map((h) => h.toLowerCase()),
    onRedisError,
    keyPrefix,
    keyFrom: options.keyFrom ?? null,
    onReplay: options.onReplay ?? null,
  }
}

/** Route-level `config.idempotency`: true for the plugin defaults, or an object overriding them. */
export function resolveRouteConfig(
  config: unknown,
  defaults: ResolvedOptions,
  route: string,
): ResolvedRouteConfig | null {
  if (config === undefined || config === false) return null
  if (config === true)
    return {
      required: defaults.required,
      onRedisError: defaults.onRedisError,
      anonymous: false,
      keyFrom: defaults.keyFrom,
      onReplay: defaults.onReplay,
    }
  const routeConfig = config as IdempotencyRouteConfig
  if (typeof config !== 'object' || config === null)
    fail(`${route}: config.idempotency must be a boolean or an object`)
  if (routeConfig.required !== undefined && typeof routeConfig.required !== 'boolean')
    fail(`${route}: config.idempotency.required must be a boolean`)
  if (routeConfig.onRedisError !== undefined && !FAILURE_MODES.includes(routeConfig.onRedisError))
    fail(`${route}: config.idempotency.onRedisError must be 'closed' or 'open'`)
  if (routeConfig.anonymous !== undefined && typeof routeConfig.anonymous !== 'boolean')
    fail(`${route}: config.idempotency.anonymous must be a boolean`)
  if (routeConfig.keyFrom !== undefined && typeof routeConfig.keyFrom !== 'function')
    fail(`${route}: config.idempotency.keyFrom must be a function of the request`)
  if (routeConfig.onReplay !== undefined && typeof routeConfig.onReplay !== 'function')
    fail(`${route}: config.idempotency.onReplay must be a function of the request and the reply`)
  return {
    required: routeConfig.required ?? defaults.required,
    onRedisError: routeConfig.onRedisError ?? defaults.onRedisError,
    anonymous: routeConfig.anonymous ?? false,
    keyFrom: routeConfig.keyFrom ?? defaults.keyFrom,
    onReplay: routeConfig.onReplay ?? defaults.onReplay,
  }
}
