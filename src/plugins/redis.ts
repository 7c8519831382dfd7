import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Cluster, Redis } from 'ioredis'
import { defineScripts, type RedisClient } from '../lua/index.ts'

export type { RedisClient }

export interface RedisConnectionOptions {
  url?: string
  clusterNodes?: Array<{ host: string; port: number }>
  /** Bound on every command, scripts included; a slow Redis fails as fast as a dead one. */
  commandTimeoutMs?: number
  connectTimeoutMs?: number
}

export interface RedisPluginOptions extends RedisConnectionOptions {
  /** Use this client instead of creating one; the caller then owns it and closes it. */
  client?: RedisClient
}

declare module 'fastify' {
  interface FastifyInstance {
    redis: RedisClient
  }
}

/**
 * No offline queue: while Redis is unreachable every command fails at once instead of waiting
 * (and a queued INCR cannot run twice after a reconnect). Reconnects keep being retried quickly.
 */
export function createRedisClient(options: RedisConnectionOptions): RedisClient {
  const common = {
    enableOfflineQueue: false,
    commandTimeout: options.commandTimeoutMs ?? 500,
    connectTimeout: options.connectTimeoutMs ?? 2000,
    maxRetriesPerRequest: 0,
    lazyConnect: true,
  }
  const client: RedisClient = options.clusterNodes?.length
    ? new Cluster(options.clusterNodes, {
        enableOfflineQueue: false,
        lazyConnect: true,
        clusterRetryStrategy: (times) => Math.min(times * 100, 1000),
        redisOptions: {
          commandTimeout: common.commandTimeout,
          connectTimeout: common.connectTimeout,
          maxRetriesPerRequest: 0,
        },
      })
    : new Redis(options.url ?? 'redis://127.0.0.1:6379', {
        ...common,
        retryStrategy: (times) => Math.min(times * 50, 1000),
      })
  defineScripts(client)
  // Errors surface on the commands that hit them; an unhandled 'error' event would crash the process.
  client.on('error', () => {})
  return client
}

export async function connectRedis(client: RedisClient): Promise<void> {
  if (client.status === 'ready') return
  if (client.status === 'wait') await client.connect()
  else
    await new Promise<void>((resolve, reject) => {
      client.once('ready', resolve)
      client.once('end', () => reject(new Error('Redis connection ended before it was ready')))
    })
}

async function redisPlugin(app: FastifyInstance, options: RedisPluginOptions) {
  const owned = !options.client
  const client = options.client ?? createRedisClient(options)
  if (!owned) defineScripts(client)
  try {
    await connectRedis(client)
  } catch (err) {
    client.disconnect()
    throw new Error(
      `Redis is unreachable at ${options.url ?? 'its configured address'}: ${(err as Error).message}`,
    )
  }
  app.decorate<RedisClient>('redis', client)
  if (owned) app.addHook('onClose', async () => void (await client.quit().catch(() => client.disconnect())))
}

export default fp(redisPlugin, { name: 'redis', fastify: '5.x' })
