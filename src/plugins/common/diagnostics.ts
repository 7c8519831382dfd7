import { type TracingChannel, tracingChannel } from 'node:diagnostics_channel'
import type { FastifyRequest } from 'fastify'

// What each plugin and primitive decided, published on `node:diagnostics_channel` tracing channels
// (docs/observability.md#tracing-channels): a tracer, an APM agent or a test subscribes by name
// and needs nothing of this package. Each operation is traced as Node traces one: `start` before it
// runs, `asyncEnd` once it settled (the context's fields then hold what was decided), `error` if it
// threw (`context.error`). With no subscriber, nothing is built: one `hasSubscribers` check.

/** The channel names, the public interface (`diagnostics_channel.tracingChannel(name)`). */
export const CHANNELS = {
  rateLimit: 'fastify-redis-gateway:rate-limit',
  idempotency: 'fastify-redis-gateway:idempotency',
  cache: 'fastify-redis-gateway:cache',
  session: 'fastify-redis-gateway:session',
  lock: 'fastify-redis-gateway:lock',
  delayedQueue: 'fastify-redis-gateway:delayed-queue',
  feed: 'fastify-redis-gateway:feed',
} as const

/** One policy's decision for a request. */
export interface RateLimitDecisionInfo {
  policy: string
  algorithm: string
  /** `allowed`, `rejected`, or `would_reject` (a shadow policy that would have refused). */
  outcome: 'allowed' | 'rejected' | 'would_reject'
  /** Units left; null when nothing true can be said (decided without Redis). */
  remaining: number | null
  limit: number
  /** ms until more quota (the RateLimit header's `t`). */
  resetMs: number
  shadow: boolean
}

/** A request checked against its route's rate-limit policies (the plugin's hook). */
export interface RateLimitChannelContext {
  request: FastifyRequest
  /** Every policy that applied; empty until the check settled. */
  decisions: RateLimitDecisionInfo[]
  /** The policy that refused the request (429 or 403), or null. */
  rejected: string | null
  /** Decided without Redis, by the policies' onRedisError. */
  degraded: boolean
  /** How long the request is held before it goes on (token bucket or GCRA with maxDelayMs). */
  delayMs: number
  error?: unknown
}

/** A request with an Idempotency-Key, once its record was claimed, replayed or refused. */
export interface IdempotencyChannelContext {
  request: FastifyRequest
  /** `claimed` (this request runs), `replayed`, `mismatched` (422), `conflicted` (409), `unavailable`; null until settled. */
  outcome: 'claimed' | 'replayed' | 'mismatched' | 'conflicted' | 'unavailable' | null
  /** A claim taken over from an owner whose lease ended. */
  takeover: boolean
  /** A conflict: ms until the request in flight's lease ends (the 409's Retry-After). */
  retryAfterMs: number | null
  error?: unknown
}

/** One cache read (`getOrLoad`, a route's cached GET). */
export interface CacheChannelContext {
  /** The cache's namespace (the part of the key before the first `:`). */
  name: string
  key: string
  /**
   * `hit` (Redis), `l1` (this process), `stale` (served past the soft TTL), `miss`, or `shared` (it
   * joined a read of the same key already in flight in this process); null if it failed first.
   */
  usage: 'hit' | 'l1' | 'stale' | 'miss' | 'shared' | null
  /** The loader ran for this read. */
  loaded: boolean
  /** The read waited for another caller's load (the key's lease). */
  leaseWait: boolean
  error?: unknown
}

/** A request's session, once the presented one was loaded (or found missing, forged, ended by a logout, expired). */
export interface SessionChannelContext {
  request: FastifyRequest
  /** As `request.sessionDecision`: none, anonymous, found, slid, forged, ended, expired, unavailable; null until settled. */
  decision: string | null
  error?: unknown
}

/** A lock acquisition (`acquire`, `withLock`). */
export interface LockChannelContext {
  name: string
  acquired: boolean
  /** The fencing token of the acquisition, or null. */
  fence: number | null
  error?: unknown
}

/** A delayed-queue operation. */
export interface DelayedQueueChannelContext {
  queue: string
  operation: 'schedule' | 'take' | 'ack' | 'nack'
  /** 1 when it scheduled, took or settled its entry; 0 when there was none (already scheduled, nothing ready, not taken). */
  count: number
  error?: unknown
}

/** A feed operation: a publication (with its fan-out mode) or a read. */
export interface FeedChannelContext {
  operation: 'publish' | 'read'
  /** The producer published to, or the reader read for. */
  id: string
  /** A publication: `push` (fanned out to followers' feeds) or `pull` (read from the producer's timeline); null for a read. */
  mode: 'push' | 'pull' | null
  /** A read: the items of the page; 0 for a publication. */
  count: number
  error?: unknown
}

export const channels = {
  rateLimit: tracingChannel<unknown, RateLimitChannelContext>(CHANNELS.rateLimit),
  idempotency: tracingChannel<unknown, IdempotencyChannelContext>(CHANNELS.idempotency),
  cache: tracingChannel<unknown, CacheChannelContext>(CHANNELS.cache),
  session: tracingChannel<unknown, SessionChannelContext>(CHANNELS.session),
  lock: tracingChannel<unknown, LockChannelContext>(CHANNELS.lock),
  delayedQueue: tracingChannel<unknown, DelayedQueueChannelContext>(CHANNELS.delayedQueue),
  feed: tracingChannel<unknown, FeedChannelContext>(CHANNELS.feed),
}

/**
 * Runs `operation`, traced on `channel` when anyone subscribes: `start` with the context `begin`
 * builds, `fill` writing what the result says into it before `asyncEnd`. With no subscriber it is
 * `operation()` and nothing more.
 */
export function traced<C extends object, R>(
  channel: TracingChannel<unknown, C>,
  begin: () => C,
  operation: () => Promise<R>,
  fill: (context: C, result: R) => void,
): Promise<R> {
  if (!channel.hasSubscribers) return operation()
  const context = begin()
  return channel.tracePromise(async () => {
    const result = await operation()
    fill(context, result)
    return result
  }, context)
}

/** `run` as a function traced on `channel` at each call (see `traced`). */
export function tracing<A extends unknown[], C extends object, R>(
  channel: TracingChannel<unknown, C>,
  begin: () => C,
  run: (...args: A) => Promise<R>,
  fill: (context: C, result: R) => void,
): (...args: A) => Promise<R> {
  return (...args) => traced(channel, begin, () => run(...args), fill)
}
