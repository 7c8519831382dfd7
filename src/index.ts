// The package root: every plugin by name, its option types, and the helpers a Fastify app needs.
// Each plugin is also the default export of its own subpath (`fastify-redis-gateway/rate-limit`, ...).
export {
  type CacheApi,
  CacheKeyInvalidError,
  type CacheKeyPart,
  type CacheLoadErrorMode,
  CacheLoadTimeoutError,
  type CachePluginOptions,
  type CacheRouteConfig,
  type CacheSetOptions,
  CacheTagInvalidError,
  CacheUnavailableError,
  CacheValueNotJsonError,
  cacheKey,
  default as cache,
  type GetOrLoadOptions,
} from './plugins/cache/index.ts'
// What each plugin and primitive decided, on node:diagnostics_channel tracing channels (docs/observability.md).
export {
  type CacheChannelContext,
  CHANNELS,
  channels,
  type DelayedQueueChannelContext,
  type FeedChannelContext,
  type IdempotencyChannelContext,
  type LockChannelContext,
  type RateLimitChannelContext,
  type RateLimitDecisionInfo,
  type SessionChannelContext,
} from './plugins/common/diagnostics.ts'
export {
  GatewayError,
  InvalidOptionError,
  RedisClientError,
  RedisConnectionError,
  RedisServerError,
  RouteNotProtectedError,
  UnknownOptionError,
} from './plugins/common/errors.ts'
// One lifecycle for every long-running part: the primitives' workers implement it, and so can an
// application's own (docs/lifecycle.md).
export {
  type CloseWithOptions,
  closeWith,
  type Lifecycle,
  type LifecycleHealth,
  type LifecycleState,
  LifecycleStatus,
  type StopOptions,
  type StopResult,
} from './plugins/common/lifecycle.ts'
// Names this package's Redis scripts on @opentelemetry/instrumentation-ioredis's spans (docs/observability.md).
export { ioredisRequestHook } from './plugins/common/otel.ts'
export { HttpProblem, PROBLEM_CONTENT_TYPE, type ProblemBody, sendProblem } from './plugins/common/problem.ts'
export {
  default as idempotency,
  type IdempotencyContext,
  IdempotencyError,
  type IdempotencyErrorCode,
  type IdempotencyFailureMode,
  IdempotencyFingerprintTooLargeError,
  IdempotencyInFlightError,
  IdempotencyKeyInvalidError,
  IdempotencyKeyMismatchError,
  type IdempotencyKeySource,
  type IdempotencyLogger,
  type IdempotencyOutcome,
  type IdempotencyPluginOptions,
  type IdempotencyReplay,
  type IdempotencyReplayHook,
  IdempotencyResultNotKeptError,
  type IdempotencyRouteConfig,
  IdempotencyStoreUnavailableError,
  type IdempotentFunction,
  idempotencyKeyMismatch,
  type MakeIdempotentOptions,
  makeIdempotent,
} from './plugins/idempotency/index.ts'
export { default as metrics, type MetricsApi, type MetricsPluginOptions } from './plugins/metrics/index.ts'
export {
  type Algorithm,
  type AllowList,
  clientAddress,
  type Decision,
  default as rateLimit,
  type ErrorResponseBuilder,
  type ExceededHandler,
  type FailureMode,
  type KeyFunction,
  keyBy,
  type LeaseReport,
  MAX_OVERRIDES,
  type Override,
  type OverrideChange,
  type OverrideInput,
  type OverrideNote,
  overrideKeys,
  type PrincipalFunction,
  RateLimitArgumentError,
  type RateLimitDecorator,
  RateLimitError,
  RateLimitNoPolicyError,
  type RateLimitOverrides,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
  RateLimitPolicyConflictError,
  type RateLimitResult,
  RateLimitUnknownPolicyError,
  type RouteRateLimit,
  type SettleFunction,
  type ShadowOptions,
  type SyncOptions,
} from './plugins/rate-limit/index.ts'
export {
  type AnyRedisClient,
  batchWrites,
  boundCommands,
  createRedisClient,
  default as redis,
  type RedisClient,
  type RedisConnectionOptions,
  type RedisPluginOptions,
} from './plugins/redis/index.ts'
export {
  default as session,
  requireSession,
  type Session,
  type SessionDecision,
  SessionFieldNameError,
  SessionHandleError,
  type SessionInfo,
  type SessionLifetime,
  SessionLifetimeError,
  SessionNotRegisteredError,
  type SessionPluginOptions,
  SessionPrincipalError,
  type SessionRecord,
  SessionTooLargeError,
  type SessionValue,
  SessionValueError,
  sessionCookieName,
  sessionHandle,
} from './plugins/session/index.ts'
// A Bloom filter on plain Redis (also the named exports of `fastify-redis-gateway/bloom`).
export {
  BLOOM_MAX_BATCH,
  BLOOM_MAX_ITEM_LENGTH,
  type BloomAnswer,
  type BloomFilter,
  type BloomFilterOptions,
  BloomRebuildError,
  type BloomRebuildOptions,
  type BloomRebuildResult,
  type BloomShardKeys,
  bloomSize,
  createBloomFilter,
} from './primitives/bloom.ts'
// What a primitive's call throws for a positional argument it cannot use (a TypeError with a code).
export { InvalidArgumentError } from './primitives/checks.ts'
// Primitives for use outside Fastify: a lock with fencing tokens and a delayed job queue (each also
// the named exports of its subpath, `fastify-redis-gateway/lock` and `fastify-redis-gateway/delayed-queue`).
export {
  type ConsumeOptions,
  type Consumer,
  createDelayedQueue,
  type DelayedQueue,
  type DelayedQueueKeys,
  type DelayedQueueOptions,
  type DelayedQueueStopResult,
  type DelayedQueueTask,
} from './primitives/delayed-queue.ts'
// A news feed with hybrid fan-out (also the named exports of `fastify-redis-gateway/feed`).
export {
  createFeed,
  type FanoutLag,
  type FanoutStats,
  type FanoutWorker,
  type FanoutWorkerOptions,
  type Feed,
  FeedFollowLimitError,
  type FeedItem,
  type FeedOptions,
  type FeedPage,
  type FeedReadOptions,
  FeedRebuildError,
  type FeedSource,
  FeedSourceError,
  type ProducerKeys,
  type ReaderKeys,
} from './primitives/feed.ts'
// A leaderboard fed by at-least-once events (also the named exports of `fastify-redis-gateway/leaderboard`).
export {
  createLeaderboard,
  type Leaderboard,
  type LeaderboardAddOptions,
  type LeaderboardEntry,
  type LeaderboardItem,
  type LeaderboardOptions,
} from './primitives/leaderboard.ts'
export {
  createLock,
  type Lock,
  type LockHandle,
  type LockHolder,
  LockLostError,
  LockNotAcquiredError,
  type LockOptions,
  type WithLockOptions,
} from './primitives/lock.ts'
// Counting without a hot key (also the named exports of `fastify-redis-gateway/sharded-counter`).
export {
  createShardedCounter,
  type ShardedCounter,
  type ShardedCounterItem,
  type ShardedCounterOptions,
  type ShardedCounterTotals,
} from './primitives/sharded-counter.ts'
// A consumer-group runtime for Redis Streams (also the named exports of `fastify-redis-gateway/stream-consumer`).
export {
  type AppendEachOnceOptions,
  type AppendJsonEntriesOptions,
  type AppendOnceEntry,
  type AppendOnceOptions,
  appendEachOnce,
  appendJsonEntries,
  appendOnce,
  createStreamConsumer,
  type StreamConsumer,
  type StreamConsumerOptions,
  type StreamEntry,
} from './primitives/stream-consumer.ts'
