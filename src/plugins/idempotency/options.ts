import type { FastifyReply, FastifyRequest } from 'fastify'
import { DEFAULT_CONNECT_TIMEOUT_MS } from '../../redis/server.ts'
import {
  declareOptions,
  type Fail,
  type OptionsOf,
  option,
  type SettingsOf,
  shown,
} from '../common/options.ts'
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

export const DEFAULT_REPLAY_HEADERS = [
  'content-type',
  'content-language',
  'content-location',
  'location',
  'etag',
  'last-modified',
]

const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/
const OF_THE_REQUEST = 'a function of the request'
const OF_THE_REQUEST_AND_REPLY = 'a function of the request and the reply'

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

/** What the plugin and makeIdempotent share, read alike (see `checkRetention` for the rule across them). */
export const STORE_OPTIONS = {
  allowEviction: option.boolean({
    default: false,
    doc: 'boot on a Redis whose `maxmemory-policy` may evict (anything but `noeviction`); only for routes with a guard of their own (see [Boot checks](#boot-checks))',
  }),
  leaseMs: option.integer({
    min: 100,
    max: 60_000,
    default: 10_000,
    doc: 'exclusive claim, renewed every `leaseMs / 3` while the handler runs',
  }),
  retentionMs: option.integer({
    min: 1,
    default: 24 * 3_600_000,
    defaultText: '24 h',
    doc: 'how long a completed response is replayed; must exceed `leaseMs`',
  }),
  onRedisError: option.oneOf(['closed', 'open'] as const, {
    default: 'closed',
    doc: "when Redis fails: `'closed'` answers 503 with `Retry-After`; `'open'` runs the handler, for routes with their own guard (a unique constraint in the database)",
  }),
  keyPrefix: option.string({ default: 'idem:', doc: 'prefix of every key' }),
}

/** A size cap in bytes (`maxResponseBytes`, makeIdempotent's `maxResultBytes`). */
export const byteCap = (doc: string) =>
  option.integer({ min: 1, max: 16 * 1024 * 1024, default: 64 * 1024, defaultText: '64 KiB', doc })

/** The rule across the shared options: a record is kept longer than a claim is exclusive. */
export function checkRetention(
  { leaseMs, retentionMs }: { leaseMs: number; retentionMs: number },
  fail: Fail,
) {
  if (retentionMs <= leaseMs)
    fail(`\`retentionMs\` must be an integer larger than \`leaseMs\` (${leaseMs}), got ${shown(retentionMs)}`)
}

function readHeaderName(value: unknown, fail: Fail, name: string): string {
  if (typeof value !== 'string' || !HEADER_NAME.test(value))
    fail(`\`${name}\` must be a valid HTTP header name of 1-64 characters, got ${shown(value)}`)
  return value as string
}

/** Lower-cased, since headers are compared case-insensitively; Set-Cookie belongs to one response. */
function readReplayHeaders(value: unknown, fail: Fail, name: string): readonly string[] {
  if (!Array.isArray(value) || value.some((h) => typeof h !== 'string' || !HEADER_NAME.test(h)))
    fail(`\`${name}\` must be an array of header names, got ${shown(value)}`)
  const headers = (value as string[]).map((h) => h.toLowerCase())
  if (headers.includes('set-cookie'))
    fail(`\`${name}\` must not include Set-Cookie: a cookie belongs to one response`)
  return headers
}

export const IDEMPOTENCY_OPTIONS = declareOptions(
  'idempotency plugin',
  {
    redis: option.redisClient({
      defaultText: '`app.redis` (the [redis plugin](redis.md))',
      doc: 'an ioredis `Redis` or `Cluster`, never closed by this plugin; one that may evict any key is refused (see [Boot checks](#boot-checks))',
    }),
    allowEviction: STORE_OPTIONS.allowEviction,
    connectTimeoutMs: option.integer({
      min: 0,
      default: DEFAULT_CONNECT_TIMEOUT_MS,
      doc: 'how long registration waits for the client to be ready; 0: not at all (see [Boot checks](#boot-checks))',
    }),
    principal: option.function<PrincipalFunction>({
      type: OF_THE_REQUEST,
      defaultText: "the session plugin's principal, if registered",
      doc: '`(request) => string, null or undefined`: who the caller is, for the default scope; with a principal source, keys from callers without a principal are refused (see [Anonymous callers](#anonymous-callers))',
    }),
    headerName: option.custom({
      type: 'header name',
      default: 'Idempotency-Key',
      read: readHeaderName,
      doc: 'request header carrying the key',
    }),
    keyFrom: option.function<IdempotencyKeySource>({
      type: OF_THE_REQUEST,
      doc: '`(request) => string, null or undefined`: the key when the header is absent, e.g. a body field (see [The key from the request](#the-key-from-the-request-keyfrom))',
    }),
    onReplay: option.function<IdempotencyReplayHook>({
      type: OF_THE_REQUEST_AND_REPLY,
      doc: '`(request, reply, replay) => void or a promise`: called before each replay is sent (see [Before a replay](#before-a-replay-onreplay))',
    }),
    required: option.boolean({
      default: true,
      doc: '400 when an opted-in route gets no key (a route may say `{ required: false }`)',
    }),
    scope: option.function<(request: FastifyRequest) => string>({
      type: OF_THE_REQUEST,
      defaultText: 'principal if there is one, else the client IP; plus the method and the route pattern',
      doc: '`(request) => string`: who may share a key; a scope of your own decides alone (nobody is refused for lacking a principal)',
    }),
    retentionMs: STORE_OPTIONS.retentionMs,
    leaseMs: STORE_OPTIONS.leaseMs,
    maxResponseBytes: byteCap('larger responses are sent but not kept (a replay answers 410)'),
    replayHeaders: option.custom<readonly string[], string[]>({
      type: 'header names',
      default: DEFAULT_REPLAY_HEADERS,
      defaultText: DEFAULT_REPLAY_HEADERS.map((h) => `\`${h}\``).join(', '),
      read: readReplayHeaders,
      doc: 'response headers stored and replayed (any case); `Set-Cookie` is refused',
    }),
    onRedisError: STORE_OPTIONS.onRedisError,
    keyPrefix: STORE_OPTIONS.keyPrefix,
  },
  { hints: IDEMPOTENCY_HINTS, check: checkRetention },
)

/** A route's `config.idempotency` object; what it leaves out is the plugin's. */
export const ROUTE_OPTIONS = declareOptions(
  'idempotency plugin',
  {
    required: option.boolean({ defaultText: "the plugin's", doc: '400 when the route gets no key' }),
    onRedisError: option.oneOf(['closed', 'open'] as const, {
      defaultText: "the plugin's",
      doc: "when Redis fails: `'closed'` answers 503; `'open'` runs the handler",
    }),
    anonymous: option.boolean({
      default: false,
      doc: 'accept keys from callers without a principal, scoped by client IP (callers behind one NAT or proxy then share keys)',
    }),
    keyFrom: option.function<IdempotencyKeySource>({
      type: OF_THE_REQUEST,
      defaultText: "the plugin's",
      doc: "this route's key source when the header is absent",
    }),
    onReplay: option.function<IdempotencyReplayHook>({
      type: OF_THE_REQUEST_AND_REPLY,
      defaultText: "the plugin's",
      doc: "this route's replay hook",
    }),
  },
  { hints: IDEMPOTENCY_HINTS },
)

export type IdempotencyPluginOptions = OptionsOf<typeof IDEMPOTENCY_OPTIONS>
export type IdempotencyRouteConfig = OptionsOf<typeof ROUTE_OPTIONS>
export type ResolvedOptions = SettingsOf<typeof IDEMPOTENCY_OPTIONS>

export interface ResolvedRouteConfig {
  required: boolean
  onRedisError: IdempotencyFailureMode
  anonymous: boolean
  keyFrom: IdempotencyKeySource | undefined
  onReplay: IdempotencyReplayHook | undefined
}

/** The principal if there is one, else the client IP; then method and route pattern. */
export function defaultScope(request: FastifyRequest, who: string | null | undefined): string {
  return `${who ? `principal:${who}` : `ip:${request.ip}`}\n${request.method}\n${request.routeOptions.url}`
}

/** The plugin's options, read: frozen, defaults applied. */
export const resolveOptions = (options: unknown): ResolvedOptions => IDEMPOTENCY_OPTIONS.read(options)

/** Route-level `config.idempotency`: true for the plugin defaults, or an object overriding them. */
export function resolveRouteConfig(
  config: unknown,
  defaults: ResolvedOptions,
  route: string,
): ResolvedRouteConfig | null {
  if (config === undefined || config === false) return null
  if (config !== true && (typeof config !== 'object' || config === null || Array.isArray(config)))
    ROUTE_OPTIONS.checker.fail(
      `route ${route}: \`config.idempotency\` must be true, false or an object, got ${shown(config)}`,
    )
  const own = ROUTE_OPTIONS.read(config === true ? {} : config, `route ${route}: config.idempotency`)
  return {
    required: own.required ?? defaults.required,
    onRedisError: own.onRedisError ?? defaults.onRedisError,
    anonymous: own.anonymous,
    keyFrom: own.keyFrom ?? defaults.keyFrom,
    onReplay: own.onReplay ?? defaults.onReplay,
  }
}
