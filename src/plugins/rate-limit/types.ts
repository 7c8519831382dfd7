import type { FastifyReply, FastifyRequest } from 'fastify'
import type { PrincipalFunction } from '../common/principal.ts'
import type { Duration } from './duration.ts'
import type { KeyFunction } from './keys.ts'
import type { Algorithm, Quota, RateLimitScript } from './protocol.ts'

// The shapes the plugin's parts share: the options a user writes (the plugin's, a policy's), a
// policy as checked, and a decision about a request. They refer to one another (a policy's
// onExceeded gets a decision, a decision names its policy), so they live in one module that
// imports no other part of the plugin but the script protocol below it.
//
// The parts import one way only, each from those listed before it: protocol, types, options,
// policy, policies, override-store, overrides, asked, groups, memory-keyspace, memory-windows and memory-buckets, memory,
// outcome, fallback, leases, buffered, engine, responses, settlements, context, api, hooks, index (and the leaves errors,
// duration, keys and metrics, which import no other part). test/boundaries.test.ts fails on any
// circle of imports inside a folder.

/** What a policy does while Redis cannot answer: allow, answer 503, or limit in this process. */
export type FailureMode = 'open' | 'closed' | 'local'

export interface RateLimitPolicy {
  /** Names the policy in headers, problems, metrics and its Redis key: 1-64 of A-Z a-z 0-9 _ . - */
  name: string
  algorithm: Algorithm
  /**
   * Cost units allowed per window; for the token bucket, its capacity (the burst). A function of the
   * request sets it per request (per-plan quotas), sync or async (resolved once per request, with
   * every other policy's, before the one store call); its result is checked on every request.
   */
  limit: number | LimitFunction
  /**
   * Window (GCRA: period); every algorithm except the token bucket. Milliseconds or a duration
   * string ('10s', '1 minute'), or a function of the request returning milliseconds.
   */
  windowMs?: Duration | ((request: FastifyRequest) => number)
  /** Token bucket only: tokens added per second. */
  refillPerSecond?: number
  /**
   * Concurrency only: the longest a request holds its slot (default 60 s). A slot is given back when
   * the response ends or the client goes away; one whose instance died comes back after this long.
   */
  leaseMs?: Duration
  /**
   * Whose quota a request uses: 'ip' (default) or a function, sync or async (resolved once per
   * request, before the store call); null or undefined skips the policy.
   */
  key?: 'ip' | KeyFunction | AsyncKeyFunction
  /** Units a request consumes (default 1). */
  cost?: number | ((request: FastifyRequest) => number)
  /** 'preHandler' for keys read from the parsed, validated body. Default 'onRequest'. */
  hook?: 'onRequest' | 'preHandler'
  /** Count a request only if its response is a failure (default predicate: status >= 400). */
  countOnlyFailures?: boolean | ((reply: FastifyReply) => boolean)
  /**
   * Reserve, then reconcile: `cost` is reserved at admission (an estimate), and the actual cost
   * settles it when the response ends: a function of (request, reply) called then, or `true` for a
   * route that calls `app.rateLimiter.settle(request, name, actual)` itself. What was reserved and
   * not used is given back; more is charged (token bucket and GCRA: as debt the next requests of
   * the key pay; the windowed algorithms: only while their window has room).
   */
  settle?: true | SettleFunction
  /** The unit the policy counts (`'bytes'`, `'tokens'`), advertised as `qu` in RateLimit-Policy. */
  quotaUnit?: string
  /**
   * Buffered mode: this instance admits requests from a lease of the remaining quota and talks to
   * Redis once per lease and per sync, not per request (`true`: the defaults). Fixed window, token
   * bucket and GCRA; see "Buffered mode" in docs/rate-limit.md for its error bounds. Default: exact.
   */
  sync?: boolean | SyncOptions
  /**
   * Shadow (dry-run) mode: the policy decides and counts as if it enforced, and never refuses,
   * delays or bans: a request it would refuse goes on, counted as `would_reject` in
   * rate_limit_decisions_total and logged. `{ headers: true }` also sends its RateLimit headers.
   * Removing it makes the policy enforce. Default: enforce.
   */
  shadow?: boolean | ShadowOptions
  /** Default 'open'. */
  onRedisError?: FailureMode
  /** With onRedisError 'local': this process's share of the limit, in (0, 1]. Default 1. */
  localShare?: number
  /** Token bucket and GCRA: wait up to this long for the next slot instead of rejecting. */
  maxDelayMs?: Duration
  /** Requests for which this policy is skipped: client IPs, or a predicate. */
  allowList?: AllowList
  /** Once a key goes over its limit, reject it for this long (kept in the store: every instance honours it). */
  blockMs?: Duration
  /**
   * Fixed window only: once `after` requests were rejected (429) in a window, every request of
   * the key is rejected with 403 until the window ends; `onBanReach` is called once per ban.
   */
  ban?: BanOptions
  /**
   * Fixed window only: the k-th rejected request of a window sets the window to end
   * `windowMs * 2^(k-1)` from now (at most about 24.8 days, or windowMs if longer).
   */
  exponentialBackoff?: boolean
  /** Fixed window only: every rejected request restarts the window (a full `windowMs` from now). */
  continueExceeding?: boolean
  /** Called when this policy rejects a request (429); for logging or alerting. Overrides the plugin's. */
  onExceeded?: ExceededHandler
  /** Builds the body of this policy's 429 (status and headers stay). Overrides the plugin's. */
  errorResponse?: ErrorResponseBuilder
}

/** How a buffered policy leases its quota. */
export interface SyncOptions {
  /**
   * How often an instance returns the unused part of its idle leases and renews its heartbeat
   * (default 250 ms); a crashed instance stops counting toward the others' shares after three.
   */
  intervalMs?: Duration
  /** Most units one lease takes (default 100): the most one instance may hold unused per key. */
  batch?: number
}

/** How a shadow policy shows itself. */
export interface ShadowOptions {
  /** Send its RateLimit-Policy and RateLimit headers, as an enforcing policy does (default false). */
  headers?: boolean
}

/** A buffered policy's settings, checked. */
export interface SyncSettings {
  intervalMs: number
  batch: number
}

/** The actual cost of a request, known when its response ended (or was cut): a whole number, 0 or more. */
export type SettleFunction = (request: FastifyRequest, reply: FastifyReply) => number

/** A per-request limit: a positive whole number, or a promise of one. */
export type LimitFunction = (request: FastifyRequest) => number | Promise<number>

/** A key function that looks the identity up (a database, a cache): null or undefined skips the policy. */
export type AsyncKeyFunction = (
  request: FastifyRequest,
  principal: PrincipalFunction,
) => Promise<string | null | undefined>

/** Called once per ban with the banned request and its key (the identity); what it throws is logged. */
export type BanHandler = (request: FastifyRequest, key: string) => void | Promise<void>

export interface BanOptions {
  /** Rejections (429) in a window after which the key gets 403 until the window ends; 0: the first rejection is a 403. */
  after: number
  onBanReach?: BanHandler
}

/** Called with the rejected request and the violated policy's decision; what it throws is logged. */
export type ExceededHandler = (request: FastifyRequest, decision: Decision) => void | Promise<void>

/**
 * Returns the body of a 429: a string is sent as text/plain, anything else as JSON
 * (application/json). It may be async; if it throws, the default problem body is sent.
 */
export type ErrorResponseBuilder = (request: FastifyRequest, decision: Decision) => unknown

export type AllowList = readonly string[] | ((request: FastifyRequest) => boolean)

/** A validated policy with everything precomputed that the hot path needs. */
export interface Policy {
  name: string
  algorithm: Algorithm
  script: RateLimitScript
  /** The limit; for a per-request limit, 0 (see `limitFn`). */
  limit: number
  limitFn: LimitFunction | null
  /** The window ms; for a per-request window, 0 (see `windowFn`). */
  windowMs: number
  windowFn: ((request: FastifyRequest) => number) | null
  /** A per-request limit or window: arguments, header and key are made per request. */
  dynamic: boolean
  refillPerSecond: number
  key: KeyFunction | AsyncKeyFunction
  cost: number | ((request: FastifyRequest) => number)
  hook: 'onRequest' | 'preHandler'
  isFailure: ((reply: FastifyReply) => boolean) | null
  /** Reserve, then reconcile: 'route' settles through app.rateLimiter.settle; null: the cost is final. */
  settle: SettleFunction | 'route' | null
  quotaUnit: string | null
  /** Buffered mode's settings; null: exact (every request decided by Redis). */
  sync: SyncSettings | null
  /** Shadow mode (never refuses); null: the policy enforces. */
  shadow: Required<ShadowOptions> | null
  onRedisError: FailureMode
  /** Share of the quota the `'local'` fallback enforces; null: a buffered policy's, 1 / the live instances. */
  localShare: number | null
  maxDelayMs: number
  allow: ((request: FastifyRequest) => boolean) | null
  /** 0: no blocks. */
  blockMs: number
  /** Rejections before a ban; -1: no ban. */
  banAfter: number
  onBanReach: BanHandler | null
  exponentialBackoff: boolean
  continueExceeding: boolean
  /** Fixed window: ban, exponentialBackoff or continueExceeding (its rejections are counted). */
  penalised: boolean
  onExceeded: ExceededHandler | null
  errorResponse: ErrorResponseBuilder | null
  /** The RateLimit-Policy item, e.g. `"ip";q=100;w=2` (static policies). */
  header: string
  /** Window in whole seconds as advertised in headers and problems (static policies). */
  windowSec: number
  /** The quota its script is called with (static policies). */
  quota: Quota
}

/**
 * The quota of one request under a policy, with its header item. A per-request window is part of
 * the key: `quota.windowMs` is the window asked for (the token bucket: 0).
 */
export interface Resolved {
  header: string
  quota: Quota
}

/** What the engine says about one policy for one request. */
export interface Decision {
  policy: Policy
  allowed: boolean
  /** Null when nothing true can be said (Redis down, policy open). */
  remaining: number | null
  resetMs: number
  retryMs: number
  /** The limit applied to this request (per-request limits; the local share when decided locally). */
  limit: number
  /** The RateLimit-Policy item actually enforced (a local limiter advertises its share). */
  header: string
  /** The policy's `ban` applies: the key is rejected with 403 until its window ends. */
  isBanned: boolean
}

/** A route's `config.rateLimits`: policies (or names of `namedPolicies`), or false for none at all. */
export type RouteRateLimit = false | string | RateLimitPolicy | Array<string | RateLimitPolicy>
