import type { FastifyInstance } from 'fastify'
import type { Cluster, Command, Redis } from 'ioredis'
import { RedisClientError, RedisServerError } from './errors.ts'
import { withTimeout } from './timeout.ts'

/** Any ioredis client a user created: a single node or a Cluster. */
export type RedisClient = Redis | Cluster

/**
 * A client of a package with the ioredis API under its own types: iovalkey's `Redis` and `Cluster`
 * (its classes are not assignable to ioredis's, which have members of their own). What `isRedisClient`
 * checks at run time, plus the methods every caller of the library relies on.
 */
export interface IoredisCompatibleClient {
  readonly status: string
  sendCommand(...args: never[]): unknown
  call(...args: never[]): unknown
  duplicate(...args: never[]): unknown
}

/** What a plugin's `redis` option and a primitive accept: an ioredis client or an iovalkey one. */
export type AnyRedisClient = RedisClient | IoredisCompatibleClient

export const isCluster = (redis: RedisClient): redis is Cluster =>
  'nodes' in redis && typeof redis.nodes === 'function'

declare module 'fastify' {
  interface FastifyInstance {
    /** Set by the redis plugin; every Redis-backed plugin uses it unless given `redis`. */
    redis: RedisClient
  }
}

/** What a value is, for an error message: `a string ('redis://…')`, `an object (Object)`, `undefined`. */
export function describeValue(value: unknown): string {
  if (value === null || value === undefined) return String(value)
  if (typeof value === 'string') return `a string ('${value.length > 60 ? `${value.slice(0, 60)}…` : value}')`
  if (typeof value === 'object') return `an object (${value.constructor?.name ?? 'no prototype'})`
  return `a ${typeof value}`
}

/** An ioredis client (Redis or Cluster, ioredis 5 or 6, or iovalkey): it sends commands and has a status. */
export function isRedisClient(value: unknown): value is RedisClient {
  const client = value as { sendCommand?: unknown; status?: unknown } | null
  return typeof client?.sendCommand === 'function' && typeof client.status === 'string'
}

/**
 * `redis`, checked to be an ioredis client or an iovalkey one (the same API), typed as ioredis's;
 * else a RedisClientError naming `owner` and what it got, then `hint`.
 */
export function checkRedisClient(owner: string, redis: unknown, hint = ''): RedisClient {
  if (!isRedisClient(redis))
    throw new RedisClientError(
      `${owner}: \`redis\` must be an ioredis client (new Redis() or new Cluster()), got ${describeValue(redis)}${hint}`,
    )
  return redis
}

/** The client a Redis-backed plugin uses: its `redis` option, else the redis plugin's decorator. */
export function pluginRedis(
  app: FastifyInstance,
  plugin: string,
  option: AnyRedisClient | undefined,
): RedisClient {
  if (option !== undefined) {
    const hint =
      typeof option === 'string'
        ? ': create the client yourself (`new Redis(url)`) or register the redis plugin with `{ url }`'
        : ''
    return checkRedisClient(`${plugin} plugin`, option, hint)
  }
  if (app.hasDecorator('redis') && isRedisClient(app.redis)) return app.redis
  throw new RedisClientError(
    `${plugin} plugin: no Redis client: pass \`redis\` (an ioredis client) or register the redis plugin before this one`,
  )
}

/** Where a client connects, for messages: `127.0.0.1:6379`, a socket path, or a cluster's seed nodes. */
export function redisAddress(client: RedisClient): string {
  if (isCluster(client)) {
    const nodes = (
      client as unknown as { startupNodes?: Array<string | number | { host?: string; port?: number }> }
    ).startupNodes
    const seeds = (nodes ?? []).map((node) =>
      typeof node === 'object' ? `${node.host ?? '127.0.0.1'}:${node.port ?? 6379}` : String(node),
    )
    return `cluster ${seeds.join(', ') || '(no startup nodes)'}`
  }
  const options = client.options
  return options.path ? options.path : `${options.host ?? '127.0.0.1'}:${options.port ?? 6379}`
}

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

/** Clients whose commands `boundCommands` bounds, with the bound in ms. */
const commandBounds = new WeakMap<object, number>()

/** How long a client lets a command wait for its reply: ioredis's `commandTimeout` or `boundCommands`'s; undefined: forever. */
export function commandTimeoutOf(client: RedisClient): number | undefined {
  const options = client.options as { commandTimeout?: number; redisOptions?: { commandTimeout?: number } }
  return (
    commandBounds.get(rawClient(client)) ?? options.commandTimeout ?? options.redisOptions?.commandTimeout
  )
}

/** The fields of an ioredis command that `boundCommands` reads (ioredis 5 has no `isSettled`). */
interface BoundCommand {
  isResolved?: boolean
  isSettled?: boolean
  reject(err: Error): void
}

/**
 * Fails every command still without a reply `ms` after it was sent, with ioredis's own error
 * ("Command timed out"), as its `commandTimeout` option does, but with one timer per client instead
 * of one per command. ioredis's way costs a setTimeout and a clearTimeout per command, and its
 * `delete` of the timer field turns every command into a slow dictionary-mode object: on a cached
 * read through every plugin that is about 5 % of the server's CPU. Replies come in the order
 * commands were sent, so the oldest unanswered command is the next to expire: the client keeps its
 * commands in flight in a queue and a single timer is set for the oldest one's deadline.
 */
export function boundCommands(client: Redis, ms: number): void {
  const commands: BoundCommand[] = []
  const deadlines: number[] = []
  let head = 0
  let timer: NodeJS.Timeout | null = null
  const settled = (command: BoundCommand) => command.isResolved === true || command.isSettled === true
  /** Drops answered commands from the front (and fails expired ones); compacts the arrays now and then. */
  const sweep = (now: number) => {
    while (head < commands.length) {
      const command = commands[head]!
      if (!settled(command)) {
        if (deadlines[head]! > now) break
        command.reject(new Error('Command timed out'))
      }
      commands[head] = undefined as never
      head++
    }
    if (head === commands.length) {
      commands.length = 0
      deadlines.length = 0
      head = 0
    } else if (head > 1024 && head * 2 > commands.length) {
      commands.splice(0, head)
      deadlines.splice(0, head)
      head = 0
    }
  }
  const onTimer = () => {
    timer = null
    const now = performance.now()
    sweep(now)
    if (head < commands.length) arm(deadlines[head]! - now)
  }
  const arm = (delay: number) => {
    timer = setTimeout(onTimer, Math.max(1, Math.ceil(delay)))
    timer.unref()
  }
  beforeEachCommand(client, (command) => {
    const now = performance.now()
    // Replies arrive in order: most of the front is answered by the time the next command leaves.
    if (head < commands.length && settled(commands[head]!)) sweep(now)
    commands.push(command as unknown as BoundCommand)
    deadlines.push(now + ms)
    if (timer === null) arm(ms)
  })
  commandBounds.set(client, ms)
}

/**
 * Runs `beforeSend` on every command the client sends (each script call, each command of a
 * pipeline) just before it leaves: the one way this library hooks into a client's commands
 * (command timeouts, write batching, metrics).
 */
export function beforeEachCommand(client: RedisClient, beforeSend: (command: Command) => void): void {
  // On the client itself: a plugin's view (`sentBy`) hands its commands to the client's sendCommand.
  client = rawClient(client)
  const send = client.sendCommand as (this: RedisClient, ...args: unknown[]) => unknown
  client.sendCommand = function (this: RedisClient, command: Command, ...rest: unknown[]) {
    beforeSend(command)
    return send.call(this, command, ...rest)
  } as typeof client.sendCommand
}

/** Set on a command by a plugin's view of a client (`sentBy`): the plugin that sent it. */
export const SENT_BY = Symbol('sentBy')

/** The clients behind the views `sentBy` made. */
const viewed = new WeakMap<object, RedisClient>()

/** The client itself, for a view `sentBy` made of it; any other client as it is. */
export function rawClient<T extends RedisClient>(client: T): T {
  return (viewed.get(client) as T | undefined) ?? client
}

/**
 * `client` as `plugin` uses it: the same client, whose commands carry the plugin's name (SENT_BY)
 * so that metrics label each command by the plugin that sent it, also when several plugins share
 * one client. A Proxy rather than a label on the client: every other member is the client's own
 * (its state, events, `duplicate()`, a Cluster's routing, writes to its fields), and its methods run
 * with the view as `this`, so the commands they build (calls, scripts, each command of a pipeline)
 * leave through the view's `sendCommand`. A command already named (a view of a view) keeps the
 * innermost caller's name.
 */
export function sentBy<T extends RedisClient>(client: T, plugin: string): T {
  const raw = rawClient(client)
  const send = (command: Command & { [SENT_BY]?: string }, ...rest: unknown[]) => {
    command[SENT_BY] ??= plugin
    // Looked up at each call: a hook installed on the client later (metrics at onReady) applies.
    return Reflect.apply(client.sendCommand, client, [command, ...rest])
  }
  const view = new Proxy(client, {
    get: (target, property, receiver) =>
      property === 'sendCommand' ? send : Reflect.get(target, property, receiver),
  })
  viewed.set(view, raw)
  return view
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
