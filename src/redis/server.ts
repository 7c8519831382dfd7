import type { FastifyInstance } from 'fastify'
import {
  type AnyRedisClient,
  isCluster,
  pluginRedis,
  type RedisClient,
  redisAddress,
  sentBy,
} from './client.ts'
import { RedisServerError } from './errors.ts'
import { withTimeout } from './timeout.ts'

/**
 * Keeps the last connection error a client reports. ioredis rejects a failed connect with a
 * generic message ("Connection is closed.", "None of startup nodes is available"); the socket's
 * or the node's own error says why (ECONNREFUSED, "cluster support disabled").
 */
function lastConnectionError(client: RedisClient): { get(): Error | undefined; stop(): void } {
  let last: Error | undefined
  const onError = (err: Error & { lastNodeError?: Error }) => {
    last = err.lastNodeError ?? err
  }
  client.on('error', onError)
  client.on('node error', onError)
  return {
    get: () => last,
    stop() {
      client.off('error', onError)
      client.off('node error', onError)
    },
  }
}

/**
 * Resolves once the client is ready: connects a lazy client, else waits for its connection. A
 * failure names the connection's last error, which is also its `cause`.
 */
export async function connectRedis(client: RedisClient): Promise<void> {
  if (client.status === 'ready') return
  const lastError = lastConnectionError(client)
  try {
    if (client.status === 'wait') await client.connect()
    else
      await new Promise<void>((resolve, reject) => {
        client.once('ready', resolve)
        client.once('end', () => reject(new Error('Redis connection ended before it was ready')))
      })
  } catch (err) {
    const cause = lastError.get()
    if (cause && cause !== err) throw new Error(`${(err as Error).message} (${cause.message})`, { cause })
    throw err
  } finally {
    lastError.stop()
  }
}

/** How long a plugin waits at registration for its client to be ready, unless told (`connectTimeoutMs`). */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5000

/** One boot wait per client, shared by every plugin on it: true once ready, false when it gave up. */
const bootWaits = new WeakMap<RedisClient, Promise<boolean>>()

/**
 * Waits (boundedly) at registration for the plugin's client to be ready, connecting a lazy one, so
 * the first requests are decided by Redis and not by the failure policy. The wait is shared by
 * every plugin on the client: four plugins on a Redis that is down wait once, not four times. A
 * Redis that stays away does not stop the boot: the warning names the address and the last error,
 * and each plugin runs on its failure policy until Redis answers. `timeoutMs` 0: do not wait.
 */
export async function awaitRedisAtBoot(
  app: FastifyInstance,
  client: RedisClient,
  plugin: string,
  timeoutMs = DEFAULT_CONNECT_TIMEOUT_MS,
): Promise<boolean> {
  if (client.status === 'ready') return true
  let wait = bootWaits.get(client)
  if (!wait) {
    wait = waitForReady(app, client, plugin, timeoutMs)
    bootWaits.set(client, wait)
  }
  return wait
}

async function waitForReady(
  app: FastifyInstance,
  client: RedisClient,
  plugin: string,
  timeoutMs: number,
): Promise<boolean> {
  const connecting = connectRedis(client)
  if (timeoutMs === 0) {
    connecting.catch(() => {})
    return false
  }
  const lastError = lastConnectionError(client)
  try {
    await withTimeout(connecting, timeoutMs, () => {
      throw new Error(`not ready within ${timeoutMs} ms`)
    })
    return true
  } catch (err) {
    connecting.catch(() => {})
    const cause = lastError.get() ?? (err as Error)
    const address = redisAddress(client)
    const reason = (err as Error).message.includes(cause.message)
      ? (err as Error).message
      : `${(err as Error).message}; last error: ${cause.message}`
    app.log.warn(
      { err: cause, address, status: client.status },
      `${plugin} plugin: Redis at ${address} is not ready at boot (${reason}); every plugin on this client follows its failure policy until it is`,
    )
    return false
  } finally {
    lastError.stop()
  }
}

/** The oldest Redis the scripts run on (they use `PEXPIRE ... NX`, new in 7.0). */
export const MIN_REDIS_VERSION = '7.0.0'

export interface RedisServerInfo {
  version: string
  /** `maxmemory-policy`, from CONFIG GET or, where CONFIG is not allowed, from INFO. */
  evictionPolicy: string | undefined
}

const serverInfos = new WeakMap<RedisClient, Promise<RedisServerInfo | undefined>>()

/** Version and eviction policy of the server (a Cluster's first master), read once per client. */
export function redisServerInfo(client: RedisClient): Promise<RedisServerInfo | undefined> {
  let info = serverInfos.get(client)
  if (!info) {
    info = readServerInfo(client)
    serverInfos.set(client, info)
  }
  return info
}

async function readServerInfo(client: RedisClient): Promise<RedisServerInfo | undefined> {
  const node = isCluster(client) ? client.nodes('master')[0] : client
  if (!node) return undefined
  const field = (text: string, name: string) => new RegExp(`^${name}:(.*?)\\r?$`, 'm').exec(text)?.[1]
  let server: string
  try {
    server = await node.info('server')
  } catch {
    return undefined
  }
  const version = field(server, 'redis_version') ?? '0.0.0'
  let evictionPolicy: string | undefined
  try {
    evictionPolicy = ((await node.config('GET', 'maxmemory-policy')) as string[])[1]
  } catch {
    evictionPolicy = await node.info('memory').then(
      (memory) => field(memory, 'maxmemory_policy'),
      () => undefined,
    )
  }
  return { version, evictionPolicy }
}

const olderThan = (version: string, minimum: string) => {
  const a = version.split('.').map(Number)
  const b = minimum.split('.').map(Number)
  for (let i = 0; i < 3; i++) if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) < (b[i] ?? 0)
  return false
}

/** What a plugin does about a server that may evict any key: refuse to boot, warn once, or accept. */
export type EvictionCheck = 'refuse' | 'warn' | 'allow'

/**
 * Checks the server a plugin is handed, once it is connected: older than MIN_REDIS_VERSION is a
 * boot error; an eviction policy other than `noeviction` (which may evict the plugin's records under memory
 * pressure and undo its guarantee in silence) is refused or warned about. A client not ready at
 * boot is checked when it first is, and what it finds then is logged as an error.
 */
export async function checkRedisServer(
  app: FastifyInstance,
  client: RedisClient,
  plugin: string,
  eviction: EvictionCheck,
  fix = '',
): Promise<void> {
  const problem = async (): Promise<RedisServerError | string | null> => {
    const info = await redisServerInfo(client)
    if (!info) return null
    const address = redisAddress(client)
    if (olderThan(info.version, MIN_REDIS_VERSION))
      return new RedisServerError(
        'FRG_REDIS_VERSION',
        `${plugin} plugin: Redis at ${address} is version ${info.version}; this library needs ${MIN_REDIS_VERSION} or later`,
      )
    // volatile-* evicts only keys with a TTL, but every record, counter and session here has one.
    if (eviction === 'allow' || info.evictionPolicy === undefined || info.evictionPolicy === 'noeviction')
      return null
    const message = `${plugin} plugin: Redis at ${address} has maxmemory-policy ${info.evictionPolicy}, which may evict this plugin's keys (they all have a TTL) under memory pressure; use noeviction (or a Redis of its own)`
    if (eviction === 'warn') return message
    return new RedisServerError('FRG_REDIS_EVICTION_POLICY', `${message}${fix}`)
  }
  if (client.status !== 'ready') {
    client.once('ready', () => {
      problem().then(
        (found) =>
          found &&
          app.log.error(
            { code: typeof found === 'string' ? undefined : found.code },
            String(typeof found === 'string' ? found : found.message),
          ),
        () => {},
      )
    })
    return
  }
  const found = await problem()
  if (typeof found === 'string') app.log.warn(found)
  else if (found) throw found
}

/**
 * The client a Redis-backed plugin runs on, ready for its first request: `pluginRedis`, then the
 * shared boot wait, then the server check; the plugin's view of it (`sentBy`). Every plugin boots its client this one way.
 */
export async function bootPluginRedis(
  app: FastifyInstance,
  plugin: string,
  settings: {
    redis: AnyRedisClient | undefined
    connectTimeoutMs: number | undefined
    eviction: EvictionCheck
    fix?: string
  },
): Promise<RedisClient> {
  const client = pluginRedis(app, plugin, settings.redis)
  await awaitRedisAtBoot(app, client, plugin, settings.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS)
  await checkRedisServer(app, client, plugin, settings.eviction, settings.fix)
  return sentBy(client, plugin)
}
