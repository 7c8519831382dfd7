export type { Database, Queryable } from './db/database.ts'
export { HttpProblem } from './errors.ts'
export { default as postgresPlugin, type PostgresPluginOptions } from './plugins/postgres.ts'
export {
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
