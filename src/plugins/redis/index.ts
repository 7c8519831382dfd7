import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Cluster, Redis } from 'ioredis'
import { corkForTurn } from '../../redis/batching.ts'
import { type AnyRedisClient, type RedisClient, redisAddress } from '../../redis/client.ts'
import { beforeEachCommand, boundCommands } from '../../redis/command-bounds.ts'
import { connectRedis } from '../../redis/server.ts'
import { RedisConnectionError } from '../common/errors.ts'
import {
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_CONNECT_TIMEOUT_MS,
  REDIS_OPTIONS,
  type RedisConnectionOptions,
  type RedisPluginOptions,
} from './options.ts'

export type { AnyRedisClient, RedisClient, RedisConnectionOptions, RedisPluginOptions }
export { boundCommands, connectRedis }

/**
 * No offline queue: while Redis is unreachable every command fails at once instead of waiting
 * (and a queued INCR cannot run twice after a reconnect). Reconnects keep being retried quickly.
 */
export function createRedisClient(options: RedisConnectionOptions): RedisClient {
  const commandTimeout = options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS
  const connectTimeout = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS
  const client: RedisClient = options.clusterNodes?.length
    ? new Cluster(options.clusterNodes, {
        enableOfflineQueue: false,
        lazyConnect: true,
        clusterRetryStrategy: (times) => Math.min(times * 100, 1000),
        redisOptions: { commandTimeout, connectTimeout, maxRetriesPerRequest: 0 },
      })
    : new Redis(options.url ?? 'redis://127.0.0.1:6379', {
        enableOfflineQueue: false,
        connectTimeout,
        maxRetriesPerRequest: 0,
        lazyConnect: true,
        retryStrategy: (times) => Math.min(times * 50, 1000),
      })
  if (client instanceof Redis) {
    // The command timeout with one timer per client, not ioredis's per command (boundCommands).
    boundCommands(client, commandTimeout)
    if (options.batchWrites !== false) batchWrites(client)
  }
  // Errors surface on the commands that hit them; an unhandled 'error' event would crash the process.
  client.on('error', () => {})
  return client
}

/**
 * Commands sent in the same event-loop turn leave in one write (`corkForTurn`, which the library's
 * script calls use on any client): the commands of all the requests that arrived together go out
 * in one writev, and Redis reads them in one read, instead of a write syscall per command on each
 * side. Each command keeps its own reply, in order, and nothing waits beyond the current turn. A
 * loopback write costs more CPU than a cached read's other work (docs/redis.md, "Write batching").
 * Cluster clients route each command to its node's socket and are left as they are.
 */
export function batchWrites(client: Redis): void {
  beforeEachCommand(client, () => corkForTurn(client))
}

async function redisPlugin(app: FastifyInstance, options: RedisPluginOptions) {
  const settings = REDIS_OPTIONS.read(options)
  const owned = !settings.redis
  const client = settings.redis ?? createRedisClient(settings)
  try {
    await connectRedis(client)
  } catch (err) {
    if (owned) client.disconnect()
    const address = redisAddress(client)
    throw new RedisConnectionError(
      `redis plugin: Redis at ${address} is unreachable: ${(err as Error).message}`,
      address,
      {
        cause: (err as Error).cause ?? err,
      },
    )
  }
  app.decorate<RedisClient>('redis', client)
  if (owned) app.addHook('onClose', async () => void (await client.quit().catch(() => client.disconnect())))
}

export default fp(redisPlugin, { name: 'fastify-redis-gateway/redis', fastify: '5.x' })
