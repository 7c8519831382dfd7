import { randomBytes } from 'node:crypto'
import { type AddressInfo, createConnection, createServer, type Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'
import type { RedisClient } from '../../src/redis/client.ts'
import { connectRedis } from '../../src/redis/server.ts'

// Helpers for every suite, on Redis alone: settings, key prefixes and scans, a TCP proxy. The demo
// gateway's helpers (Postgres, customers, logins) are in ./gateway.ts. Tests read their own settings
// here; the gateway itself only reads the environment in src/config.ts.
export const TEST_REDIS_URL = process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
export const TEST_SECRET = 'test-secret-0123456789-abcdefghijklmnop'

/** Connection options for a second client of the Redis the suites run on (a cluster under test:cluster). */
export function testRedisConnection(): {
  url?: string
  clusterNodes?: Array<{ host: string; port: number }>
} {
  const nodes = process.env.REDIS_CLUSTER_NODES
  if (!nodes) return { url: TEST_REDIS_URL }
  return {
    clusterNodes: nodes.split(',').map((node) => {
      const [host, port] = node.split(':') as [string, string]
      return { host, port: Number(port) }
    }),
  }
}

export const uniquePrefix = (label = 't') => `${label}${randomBytes(4).toString('hex')}:`

export function cookieHeader(setCookie: string | string[] | undefined): string {
  const first = Array.isArray(setCookie) ? setCookie[0] : setCookie
  if (!first) throw new Error('no Set-Cookie in response')
  return first.split(';')[0]!
}

/** Listens on a free loopback port for tests that need real HTTP and real concurrency. */
export async function listen(app: FastifyInstance): Promise<string> {
  return app.listen({ port: 0, host: '127.0.0.1' })
}

/**
 * Runs `fn` on a client of its own, connected to the same Redis as `redis`, with a 30 s command
 * bound, and closes it after. A suite's client carries the plugins' short command timer (500 ms by
 * default), which a loaded machine overruns: its checks and cleanups then failed with "Command timed
 * out" although Redis was fine.
 */
export async function withOwnClient<T>(
  redis: RedisClient,
  fn: (client: RedisClient) => Promise<T>,
): Promise<T> {
  const bound = 30_000
  const client: RedisClient =
    'nodes' in redis
      ? redis.duplicate(undefined, {
          lazyConnect: true,
          redisOptions: { ...redis.options.redisOptions, commandTimeout: bound },
        })
      : redis.duplicate({ lazyConnect: true, commandTimeout: bound })
  client.on('error', () => {})
  try {
    await connectRedis(client)
    return await fn(client)
  } finally {
    client.disconnect()
  }
}

async function scanOn(client: RedisClient, prefix: string): Promise<string[]> {
  const keys: string[] = []
  const nodes = 'nodes' in client ? client.nodes('master') : [client]
  for (const node of nodes) {
    let cursor = '0'
    do {
      const [next, batch] = await node.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
      cursor = next
      keys.push(...batch)
    } while (cursor !== '0')
  }
  return keys
}

/** Every key under a prefix (SCAN, never KEYS), on a client of its own (`withOwnClient`). */
export async function scanKeys(redis: RedisClient, prefix: string): Promise<string[]> {
  return withOwnClient(redis, (client) => scanOn(client, prefix))
}

/**
 * A suite's closing check: the keys under `prefix` that carry no TTL (PTTL -1; a key that expired
 * between SCAN and PTTL is what a TTL is for). With `remove`, every key under the prefix is then
 * deleted. On a client of its own (`withOwnClient`).
 */
export async function keysWithoutTtl(
  redis: RedisClient,
  prefix: string,
  { remove = false }: { remove?: boolean } = {},
): Promise<string[]> {
  return withOwnClient(redis, async (client) => {
    const keys = await scanOn(client, prefix)
    const ttls = await Promise.all(keys.map((key) => client.pttl(key)))
    // One DEL per key: on a Cluster the keys of different identities live in different slots.
    if (remove) await Promise.all(keys.map((key) => client.del(key)))
    return keys.filter((_, i) => ttls[i] === -1)
  })
}

/** Deletes every key under a prefix, on a client of its own (`withOwnClient`): a suite's cleanup. */
export async function deleteKeys(redis: RedisClient, prefix: string): Promise<void> {
  await withOwnClient(redis, async (client) => {
    await Promise.all((await scanOn(client, prefix)).map((key) => client.del(key)))
  })
}

export interface TcpProxy {
  port: number
  /** Drops every open connection and refuses new ones until restore(). */
  cut(): void
  restore(): void
  /** Adds this much latency to each chunk in both directions (0 to remove). */
  delay(ms: number): void
  /** Holds every chunk in both directions, connections left open: a network gone silent (no FIN). */
  freeze(): void
  /** Delivers what was held, in order, and relays again. */
  thaw(): void
  close(): Promise<void>
}

/** A loopback TCP proxy the test controls, to cut or slow Postgres or Redis traffic. */
export async function startTcpProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<TcpProxy> {
  const sockets = new Set<Socket>()
  let down = false
  let latency = 0
  let held: Array<() => void> | null = null
  const relay = (from: Socket, to: Socket) =>
    from.on('data', (chunk) => {
      if (held) held.push(() => to.write(chunk))
      else if (latency === 0) to.write(chunk)
      else {
        from.pause()
        setTimeout(() => {
          to.write(chunk)
          from.resume()
        }, latency)
      }
    })
  const server = createServer((client) => {
    if (down) return client.destroy()
    const upstream = createConnection({ host: targetHost, port: targetPort })
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on('close', () => sockets.delete(s))
      s.on('error', () => {
        client.destroy()
        upstream.destroy()
      })
    }
    relay(client, upstream)
    relay(upstream, client)
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const address = server.address() as AddressInfo
  return {
    port: address.port,
    cut() {
      down = true
      for (const s of sockets) s.destroy()
    },
    restore() {
      down = false
    },
    delay(ms) {
      latency = ms
    },
    freeze() {
      held ??= []
    },
    thaw() {
      const writes = held ?? []
      held = null
      for (const write of writes) write()
    },
    close() {
      down = true
      for (const s of sockets) s.destroy()
      return new Promise((resolve) => server.close(() => resolve()))
    },
  }
}
