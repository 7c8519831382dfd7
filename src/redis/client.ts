import type { FastifyInstance } from 'fastify'
import type { Cluster, Command, Redis } from 'ioredis'
import { RedisClientError } from './errors.ts'

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

/** A plugin's `redis` option, checked: a URL string gets the way to pass one instead. */
export function checkRedisOption(owner: string, option: unknown): RedisClient {
  const hint =
    typeof option === 'string'
      ? ': create the client yourself (`new Redis(url)`) or register the redis plugin with `{ url }`'
      : ''
  return checkRedisClient(owner, option, hint)
}

/** The client a Redis-backed plugin uses: its `redis` option, else the redis plugin's decorator. */
export function pluginRedis(
  app: FastifyInstance,
  plugin: string,
  option: AnyRedisClient | undefined,
): RedisClient {
  if (option !== undefined) return checkRedisOption(`${plugin} plugin`, option)
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
