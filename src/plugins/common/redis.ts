import type { FastifyInstance } from 'fastify'
import type { RedisClient } from '../../lua/index.ts'

export type { RedisClient }

declare module 'fastify' {
  interface FastifyInstance {
    /** Set by the redis plugin; every Redis-backed plugin uses it unless given `redis`. */
    redis: RedisClient
  }
}

/** The client a Redis-backed plugin uses: its `redis` option, else the redis plugin's decorator. */
export function pluginRedis(
  app: FastifyInstance,
  plugin: string,
  option: RedisClient | undefined,
): RedisClient {
  const client = option ?? (app.hasDecorator('redis') ? app.redis : undefined)
  if (!client || typeof (client as { sendCommand?: unknown }).sendCommand !== 'function')
    throw new Error(`${plugin} plugin: pass \`redis\` (an ioredis client) or register the redis plugin first`)
  return client
}

/** Resolves once the client is ready: connects a lazy client, else waits for its connection. */
export async function connectRedis(client: RedisClient): Promise<void> {
  if (client.status === 'ready') return
  if (client.status === 'wait') await client.connect()
  else
    await new Promise<void>((resolve, reject) => {
      client.once('ready', resolve)
      client.once('end', () => reject(new Error('Redis connection ended before it was ready')))
    })
}

/** How long a plugin waits at registration for a client that is still connecting. */
const BOOT_WAIT_MS = 5000

/**
 * Waits (boundedly) at registration for the plugin's client to be ready, connecting a lazy one, so
 * the first requests are decided by Redis and not by the failure policy. A Redis that stays away
 * does not stop the boot: the plugin says so and runs on its failure policy until Redis answers.
 */
export async function awaitRedisAtBoot(
  app: FastifyInstance,
  client: RedisClient,
  plugin: string,
): Promise<void> {
  if (client.status === 'ready') return
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not ready within ${BOOT_WAIT_MS} ms`)), BOOT_WAIT_MS)
  })
  try {
    await Promise.race([connectRedis(client), timeout])
  } catch (err) {
    app.log.warn(
      { err, status: client.status },
      `${plugin} plugin: Redis is not ready at boot; its failure policy applies until it is`,
    )
  } finally {
    clearTimeout(timer)
  }
}
