import { declareOptions, type OptionsOf, option, shown } from '../common/options.ts'

/** How long a command may go unanswered before it fails, by default. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 500
/** How long a connection attempt may take, by default. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 2000

/** The redis plugin's options, declared once: types, checks, defaults and docs/redis.md's table. */
export const REDIS_OPTIONS = declareOptions('redis plugin', {
  redis: option.redisClient({
    doc: 'use this client (`Redis` or `Cluster`) and leave it open on close',
    defaultText: 'none',
  }),
  url: option.custom<string>({
    type: 'redis:// or rediss:// URL',
    default: 'redis://127.0.0.1:6379',
    doc: 'without `redis`: the server to connect to',
    read(value, fail, name) {
      let protocol = ''
      try {
        protocol = new URL(value as string).protocol
      } catch {}
      if (typeof value === 'string' && (protocol === 'redis:' || protocol === 'rediss:')) return value
      return fail(`\`${name}\` must be a redis:// or rediss:// URL, got ${shown(value)}`)
    },
  }),
  clusterNodes: option.custom<Array<{ host: string; port: number }>>({
    type: 'array of { host, port }',
    doc: 'without `redis`: `[{ host, port }, ...]` of a Redis Cluster instead of `url`',
    read(value, fail, name) {
      const nodes = value as Array<{ host?: unknown; port?: unknown } | null>
      if (
        Array.isArray(nodes) &&
        nodes.every((node) => typeof node?.host === 'string' && Number.isInteger(node.port))
      )
        return value as Array<{ host: string; port: number }>
      return fail(`\`${name}\` must be an array of { host, port }, got ${shown(value)}`)
    },
  }),
  commandTimeoutMs: option.integer({
    min: 1,
    default: DEFAULT_COMMAND_TIMEOUT_MS,
    doc: 'bound on every command, scripts included: a slow Redis fails as fast as a dead one',
  }),
  connectTimeoutMs: option.integer({
    min: 1,
    default: DEFAULT_CONNECT_TIMEOUT_MS,
    doc: 'bound on a connection attempt',
  }),
  batchWrites: option.boolean({
    default: true,
    doc: 'commands sent in one event-loop turn leave in one write ([below](#write-batching))',
  }),
})

/** The redis plugin's options (see docs/redis.md). */
export type RedisPluginOptions = OptionsOf<typeof REDIS_OPTIONS>
/** What `createRedisClient` connects with: the plugin's options but a client. */
export type RedisConnectionOptions = Omit<RedisPluginOptions, 'redis'>
