import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Cluster, Redis } from 'ioredis'
import { corkForTurn } from '../../redis/batching.ts'
import {
  type AnyRedisClient,
  describeValue,
  isRedisClient,
  type RedisClient,
  redisAddress,
} from '../../redis/client.ts'
import { beforeEachCommand, boundCommands } from '../../redis/command-bounds.ts'
import { connectRedis } from '../../redis/server.ts'
import { RedisConnectionError } from '../common/errors.ts'
import { optionChecker, optionKeys } from '../common/options.ts'

export type { AnyRedisClient, RedisClient }
export { boundCommands, connectRedis }

export interface RedisConnectionOptions {
  url?: string
  clusterNodes?: Array<{ host: string; port: number }>
  /** Bound on every command, scripts included; a slow Redis fails as fast as a dead one. */
  commandTimeoutMs?: number
  connectTimeoutMs?: number
  /** Commands sent in one event-loop turn leave in one write (see `batchWrites`). Default true. */
  batchWrites?: boolean
}

export interface RedisPluginOptions extends RedisConnectionOptions {
  /** Use this client (an ioredis or iovalkey Redis or Cluster) instead of creating one; the caller then closes it. */
  redis?: AnyRedisClient
}

/**
 * No offline queue: while Redis is unreachable every command fails at once instead of waiting
 * (and a queued INCR cannot run twice after a reconnect). Reconnects keep being retried quickly.
 */
export function createRedisClient(options: RedisConnectionOptions): RedisClient {
  const commandTimeout = options.commandTimeoutMs ?? 500
  const connectTimeout = options.connectTimeoutMs ?? 2000
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

const PLUGIN_OPTIONS = optionKeys<RedisPluginOptions>({
  url: true,
  clusterNodes: true,
  commandTimeoutMs: true,
  connectTimeoutMs: true,
  batchWrites: true,
  redis: true,
})

function checkOptions(options: RedisPluginOptions): void {
  const check = optionChecker('redis plugin')
  check.known(options, PLUGIN_OPTIONS)
  if (options.redis !== undefined && !isRedisClient(options.redis))
    check.fail(
      `\`redis\` must be an ioredis client, got ${describeValue(options.redis)} (a URL goes in \`url\`)`,
    )
  if (options.url !== undefined) {
    let protocol = ''
    try {
      protocol = new URL(options.url).protocol
    } catch {}
    if (protocol !== 'redis:' && protocol !== 'rediss:')
      check.fail(`\`url\` must be a redis:// or rediss:// URL, got ${describeValue(options.url)}`)
  }
  if (
    options.clusterNodes !== undefined &&
    (!Array.isArray(options.clusterNodes) ||
      options.clusterNodes.some((node) => typeof node?.host !== 'string' || !Number.isInteger(node.port)))
  )
    check.fail('`clusterNodes` must be an array of { host, port }')
  for (const name of ['commandTimeoutMs', 'connectTimeoutMs'] as const) {
    const value = options[name]
    if (value !== undefined && !(Number.isSafeInteger(value) && value > 0))
      check.fail(`\`${name}\` must be a positive whole number of milliseconds, got ${describeValue(value)}`)
  }
  if (options.batchWrites !== undefined && typeof options.batchWrites !== 'boolean')
    check.fail('`batchWrites` must be a boolean')
}

async function redisPlugin(app: FastifyInstance, options: RedisPluginOptions) {
  checkOptions(options)
  const owned = !options.redis
  // Checked above (checkOptions): an ioredis client, or an iovalkey one with the same API.
  const client = (options.redis as RedisClient | undefined) ?? createRedisClient(options)
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
