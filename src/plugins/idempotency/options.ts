import type { FastifyRequest } from 'fastify'
import type { RedisClient } from '../../lua/index.ts'

export type WhenStoreUnavailable = 'reject' | 'proceed'

export interface IdempotencyPluginOptions {
  /** Defaults to the `redis` decorator of the app. Use a Redis without eviction (noeviction or volatile-*). */
  redis?: RedisClient
  /** Request header carrying the key. Default `Idempotency-Key`. */
  headerName?: string
  /** 400 when an opted-in route gets no key. Default true; a route may override it. */
  required?: boolean
  /** Who may share a key; default the session principal (else the client IP) + method + route pattern. */
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
   * When Redis fails: 'reject' answers 503 (default, safe for any handler); 'proceed' runs the
   * handler, for routes with their own guard such as a unique constraint in the database.
   */
  whenStoreUnavailable?: WhenStoreUnavailable
  keyPrefix?: string
}

export interface IdempotencyRouteConfig {
  required?: boolean
  whenStoreUnavailable?: WhenStoreUnavailable
}

export type ResolvedOptions = Required<Omit<IdempotencyPluginOptions, 'redis'>>

export const DEFAULT_REPLAY_HEADERS = [
  'content-type',
  'content-language',
  'content-location',
  'location',
  'etag',
  'last-modified',
]

const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/
const UNAVAILABLE = ['reject', 'proceed']

const fail = (message: string): never => {
  throw new Error(`idempotency plugin: ${message}`)
}

const isInteger = (value: unknown, min: number, max: number) =>
  Number.isSafeInteger(value) && (value as number) >= min && (value as number) <= max

function defaultScope(request: FastifyRequest): string {
  const principal = (request as { session?: { principal?: string } | null }).session?.principal
  const who = principal ? `principal:${principal}` : `ip:${request.ip}`
  return `${who}\n${request.method}\n${request.routeOptions.url}`
}

export function resolveOptions(options: IdempotencyPluginOptions): ResolvedOptions {
  const headerName = options.headerName ?? 'Idempotency-Key'
  if (typeof headerName !== 'string' || !HEADER_NAME.test(headerName))
    fail('`headerName` must be a valid HTTP header name of 1-64 characters')
  const leaseMs = options.leaseMs ?? 10_000
  if (!isInteger(leaseMs, 100, 60_000)) fail('`leaseMs` must be an integer from 100 to 60000')
  const retentionMs = options.retentionMs ?? 24 * 3_600_000
  if (!isInteger(retentionMs, leaseMs + 1, Number.MAX_SAFE_INTEGER))
    fail('`retentionMs` must be an integer larger than `leaseMs`')
  const maxResponseBytes = options.maxResponseBytes ?? 64 * 1024
  if (!isInteger(maxResponseBytes, 1, 16 * 1024 * 1024))
    fail('`maxResponseBytes` must be an integer from 1 to 16777216')
  const replayHeaders = options.replayHeaders ?? DEFAULT_REPLAY_HEADERS
  if (
    !Array.isArray(replayHeaders) ||
    replayHeaders.some((h) => typeof h !== 'string' || !HEADER_NAME.test(h))
  )
    fail('`replayHeaders` must be an array of header names')
  if (replayHeaders.some((h) => h.toLowerCase() === 'set-cookie'))
    fail('`replayHeaders` must not include Set-Cookie: a cookie belongs to one response')
  const whenStoreUnavailable = options.whenStoreUnavailable ?? 'reject'
  if (!UNAVAILABLE.includes(whenStoreUnavailable))
    fail("`whenStoreUnavailable` must be 'reject' or 'proceed'")
  if (options.scope !== undefined && typeof options.scope !== 'function') fail('`scope` must be a function')
  if (options.required !== undefined && typeof options.required !== 'boolean')
    fail('`required` must be a boolean')
  return {
    headerName,
    required: options.required ?? true,
    scope: options.scope ?? defaultScope,
    retentionMs,
    leaseMs,
    maxResponseBytes,
    replayHeaders: replayHeaders.map((h) => h.toLowerCase()),
    whenStoreUnavailable,
    keyPrefix: options.keyPrefix ?? 'idem:',
  }
}

/** Route-level `config.idempotency`: true for the plugin defaults, or an object overriding them. */
export function resolveRouteConfig(
  config: unknown,
  defaults: ResolvedOptions,
  route: string,
): Required<IdempotencyRouteConfig> | null {
  if (config === undefined || config === false) return null
  if (config === true)
    return { required: defaults.required, whenStoreUnavailable: defaults.whenStoreUnavailable }
  const routeConfig = config as IdempotencyRouteConfig
  if (typeof config !== 'object' || config === null)
    fail(`${route}: config.idempotency must be a boolean or an object`)
  if (routeConfig.required !== undefined && typeof routeConfig.required !== 'boolean')
    fail(`${route}: config.idempotency.required must be a boolean`)
  if (
    routeConfig.whenStoreUnavailable !== undefined &&
    !UNAVAILABLE.includes(routeConfig.whenStoreUnavailable)
  )
    fail(`${route}: config.idempotency.whenStoreUnavailable must be 'reject' or 'proceed'`)
  return {
    required: routeConfig.required ?? defaults.required,
    whenStoreUnavailable: routeConfig.whenStoreUnavailable ?? defaults.whenStoreUnavailable,
  }
}
