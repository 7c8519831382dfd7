// The package root: every plugin by name, its option types, and the helpers a Fastify app needs.
// Each plugin is also the default export of its own subpath (`fastify-redis-gateway/rate-limit`, ...).
export {
  type CacheApi,
  type CachePluginOptions,
  default as cache,
  type GetOrLoadOptions,
} from './plugins/cache/index.ts'
export {
  default as idempotency,
  type IdempotencyContext,
  type IdempotencyFailureMode,
  type IdempotencyPluginOptions,
  type IdempotencyRouteConfig,
  idempotencyKeyMismatch,
} from './plugins/idempotency/index.ts'
export { default as metrics, type MetricsApi, type MetricsPluginOptions } from './plugins/metrics/index.ts'
export {
  type Algorithm,
  type AllowList,
  type Decision,
  default as rateLimit,
  type FailureMode,
  type KeyFunction,
  keyBy,
  type PrincipalFunction,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
  type RouteRateLimit,
} from './plugins/rate-limit/index.ts'
export {
  batchWrites,
  createRedisClient,
  default as redis,
  type RedisClient,
  type RedisConnectionOptions,
  type RedisPluginOptions,
} from './plugins/redis/index.ts'
export {
  default as session,
  type SessionPluginOptions,
  type SessionRecord,
} from './plugins/session/index.ts'
export { HttpProblem, PROBLEM_CONTENT_TYPE, type ProblemBody, sendProblem } from './plugins/shared/problem.ts'
