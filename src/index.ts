// The public entry: every plugin usable on its own in any Fastify 5 app, with its option types.
export type { Database, Queryable } from './db/database.ts'
export { HttpProblem } from './errors.ts'
export {
  type CacheApi,
  type CachePluginOptions,
  default as cachePlugin,
  type GetOrLoadOptions,
} from './plugins/cache/index.ts'
export {
  default as idempotencyPlugin,
  type IdempotencyPluginOptions,
  type IdempotencyRouteConfig,
} from './plugins/idempotency/index.ts'
export { default as metricsPlugin, type MetricsPluginOptions } from './plugins/metrics.ts'
export { default as postgresPlugin, type PostgresPluginOptions } from './plugins/postgres.ts'
export {
  type Algorithm,
  default as rateLimitPlugin,
  keyBy,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
  type RouteRateLimit,
} from './plugins/rate-limit/index.ts'
export {
  batchWrites,
  createRedisClient,
  default as redisPlugin,
  type RedisClient,
  type RedisPluginOptions,
} from './plugins/redis.ts'
export {
  default as sessionPlugin,
  type SessionPluginOptions,
  type SessionRecord,
  SessionStore,
} from './plugins/session/index.ts'
