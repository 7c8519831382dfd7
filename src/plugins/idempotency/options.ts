import type { FastifyReply, FastifyRequest } from 'fastify'
import { type AnyRedisClient, describeValue } from '../../redis/client.ts'
import { DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import { type OptionChecker, optionChecker, optionKeys } from '../common/options.ts'
import type { PrincipalFunction } from '../common/principal.ts'

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
   * plugin. A Redis that may evict (any maxmemory-policy but noeviction) is refused unless `allowEviction`.
   */
  redis?: AnyRedisClient
  /**
   * Boot on a Redis whose maxmemory-policy may evict (anything but noeviction): an evicted record lets a retry run the
   * handler again, so only for routes with a guard of their own. Default false.
   */
  allowEviction?: boolean
  /** How long registration waits for Redis to be ready (0: not at all). Default 5000. */
  connectTimeoutMs?: number
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

const PLUGIN_OPTIONS = optionKeys<IdempotencyPluginOptions>({
  redis: true,
  allowEviction: true,
  connectTimeoutMs: true,
  principal: true,
  headerName: true,
  keyFrom: true,
  onReplay: true,
  required: true,
  scope: true,
  retentionMs: true,
  leaseMs: true,
  maxResponseBytes: true,
  replayHeaders: true,
  onRedisError: true,
  keyPrefix: true,
})

const ROUTE_OPTIONS = optionKeys<IdempotencyRouteConfig>({
  required: true,
  onRedisError: true,
  anonymous: true,
  keyFrom: true,
  onReplay: true,
})

/** Names other idempotency libraries use, with what to write here instead. */
export const IDEMPOTENCY_HINTS = {
  ttl: '`retentionMs` is how long a result is kept (milliseconds)',
  expiresAfterSeconds: '`retentionMs` is how long a result is kept (milliseconds)',
  header: '`headerName` is the request header carrying the key',
  idempotencyKeyHeader: '`headerName` is the request header carrying the key',
  persistenceStore: 'The store is always Redis: pass `redis` (an ioredis client)',
  store: 'The store is always Redis: pass `redis` (an ioredis client)',
  throwOnNoIdempotencyKey: '`required` (default true) refuses a call or request without a key',
  eventKeyJmesPath:
    '`keyOf(...args)` returns the key of a call; a request has the header or `keyFrom(request)`',
  payloadValidationJmesPath:
    "`fingerprintOf(...args)` is what a call's key is bound to; a request's key is bound to the whole request",
}

const pluginCheck: OptionChecker = optionChecker('idempotency plugin', IDEMPOTENCY_HINTS)

/** A value as a message shows it: a number or a boolean as written, anything else by its type. */
export const shown = (value: unknown) =>
  typeof value === 'number' || typeof value === 'boolean' ? String(value) : describeValue(value)

const isInteger = (value: unknown, min: number, max: number) =>
  Number.isSafeInteger(value) && (value as number) >= min && (value as number) <= max

/** The principal if there is one, else the client IP; then method and route pattern. */
export function defaultScope(request: FastifyRequest, who: string | null | undefined): string {
  return `${who ? `principal:${who}` : `ip:${request.ip}`}\n${request.method}\n${request.routeOptions.url}`
}

/** The lease, the retention, the failure mode and the key prefix, with their defaults. */
export function resolveStoreOptions(options: StoreOptions, check: OptionChecker): Required<StoreOptions> {
  const leaseMs = options.leaseMs ?? 10_000
  if (!isInteger(leaseMs, 100, 60_000))
    check.fail(`\`leaseMs\` must be an integer from 100 to 60000, got ${shown(leaseMs)}`)
  const retentionMs = options.retentionMs ?? 24 * 3_600_000
  if (!isInteger(retentionMs, leaseMs + 1, Number.MAX_SAFE_INTEGER))
    check.fail(
      `\`retentionMs\` must be an integer larger than \`leaseMs\` (${leaseMs}), got ${shown(retentionMs)}`,
    )
  const onRedisError = options.onRedisError ?? 'closed'
  if (!FAILURE_MODES.includes(onRedisError))
    check.fail(`\`onRedisError\` must be 'closed' or 'open', got ${shown(onRedisError)}`)
  const keyPrefix = options.keyPrefix ?? 'idem:'
  if (typeof keyPrefix !== 'string') check.fail(`\`keyPrefix\` must be a string, got ${shown(keyPrefix)}`)
  return { leaseMs, retentionMs, onRedisError, keyPrefix }
}

/** A size cap in bytes (`maxResponseBytes`, `maxResultBytes`): 64 KiB by default, at most 16 MiB. */
export function resolveByteCap(value: number | undefined, name: string, check: OptionChecker): number {
  const bytes = value ?? 64 * 1024
  if (!isInteger(bytes, 1, 16 * 1024 * 1024))
    check.fail(`\`${name}\` must be an integer from 1 to 16777216, got ${shown(bytes)}`)
  return bytes
}

/** `allowEviction`, false unless it is true. */
export function resolveAllowEviction(value: unknown, check: OptionChecker): boolean {
  if (value !== undefined && typeof value !== 'boolean')
    check.fail(`\`allowEviction\` must be a boolean, got ${shown(value)}`)
  return value === true
}

export function resolveOptions(options: IdempotencyPluginOptions): ResolvedOptions {
  if (typeof options !== 'object' || options === null)
    pluginCheck.fail(`options must be an object, got ${describeValue(options)}`)
  pluginCheck.known(options, PLUGIN_OPTIONS)
  const headerName = options.headerName ?? 'Idempotency-Key'
  if (typeof headerName !== 'string' || !HEADER_NAME.test(headerName))
    pluginCheck.fail(
      `\`headerName\` must be a valid HTTP header name of 1-64 characters, got ${shown(headerName)}`,
    )
  const { leaseMs, retentionMs, onRedisError, keyPrefix } = resolveStoreOptions(options, pluginCheck)
  const maxResponseBytes = resolveByteCap(options.maxResponseBytes, 'maxResponseBytes', pluginCheck)
  const replayHeaders = options.replayHeaders ?? DEFAULT_REPLAY_HEADERS
  if (
    !Array.isArray(replayHeaders) ||
    replayHeaders.some((h) => typeof h !== 'string' || !HEADER_NAME.test(h))
  )
    pluginCheck.fail(`\`replayHeaders\` must be an array of header names, got ${shown(replayHeaders)}`)
  if (replayHeaders.some((h) => h.toLowerCase() === 'set-cookie'))
    pluginCheck.fail('`replayHeaders` must not include Set-Cookie: a cookie belongs to one response')
  for (const name of ['scope', 'principal', 'keyFrom'] as const) {
    if (options[name] !== undefined && typeof options[name] !== 'function')
      pluginCheck.fail(`\`${name}\` must be a function of the request, got ${shown(options[name])}`)
  }
  if (options.onReplay !== undefined && typeof options.onReplay !== 'function')
    pluginCheck.fail(
      `\`onReplay\` must be a function of the request and the reply, got ${shown(options.onReplay)}`,
    )
  if (options.required !== undefined && typeof options.required !== 'boolean')
    pluginCheck.fail(`\`required\` must be a boolean, got ${shown(options.required)}`)
  const connectTimeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS
  if (!isInteger(connectTimeoutMs, 0, Number.MAX_SAFE_INTEGER))
    pluginCheck.fail(
      `\`connectTimeoutMs\` must be a whole number of milliseconds, 0 or more, got ${shown(connectTimeoutMs)}`,
    )
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
    connectTimeoutMs,
    allowEviction: resolveAllowEviction(options.allowEviction, pluginCheck),
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
  const where = `route ${route}: \`config.idempotency`
  if (typeof config !== 'object' || config === null)
    pluginCheck.fail(`${where}\` must be true, false or an object, got ${shown(config)}`)
  pluginCheck.known(config, ROUTE_OPTIONS, `route ${route}: config.idempotency`)
  const routeConfig = config as IdempotencyRouteConfig
  for (const name of ['required', 'anonymous'] as const) {
    if (routeConfig[name] !== undefined && typeof routeConfig[name] !== 'boolean')
      pluginCheck.fail(`${where}.${name}\` must be a boolean, got ${shown(routeConfig[name])}`)
  }
  if (routeConfig.onRedisError !== undefined && !FAILURE_MODES.includes(routeConfig.onRedisError))
    pluginCheck.fail(
      `${where}.onRedisError\` must be 'closed' or 'open', got ${shown(routeConfig.onRedisError)}`,
    )
  if (routeConfig.keyFrom !== undefined && typeof routeConfig.keyFrom !== 'function')
    pluginCheck.fail(
      `${where}.keyFrom\` must be a function of the request, got ${shown(routeConfig.keyFrom)}`,
    )
  if (routeConfig.onReplay !== undefined && typeof routeConfig.onReplay !== 'function')
    pluginCheck.fail(
      `${where}.onReplay\` must be a function of the request and the reply, got ${shown(routeConfig.onReplay)}`,
    )
  return {
    required: routeConfig.required ?? defaults.required,
    onRedisError: routeConfig.onRedisError ?? defaults.onRedisError,
    anonymous: routeConfig.anonymous ?? false,
    keyFrom: routeConfig.keyFrom ?? defaults.keyFrom,
    onReplay: routeConfig.onReplay ?? defaults.onReplay,
  }
}
