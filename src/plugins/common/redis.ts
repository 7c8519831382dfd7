import type { FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
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

/** Clients whose commands `boundCommands` bounds, with the bound in ms. */
const commandBounds = new WeakMap<object, number>()

/** How long a client lets a command wait for its reply: ioredis's `commandTimeout` or `boundCommands`'s; undefined: forever. */
export function commandTimeoutOf(client: RedisClient): number | undefined {
  const options = client.options as { commandTimeout?: number; redisOptions?: { commandTimeout?: number } }
  return commandBounds.get(client) ?? options.commandTimeout ?? options.redisOptions?.commandTimeout
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
  const send = client.sendCommand
  client.sendCommand = function (this: Redis, command, stream) {
    const now = performance.now()
    // Replies arrive in order: most of the front is answered by the time the next command leaves.
    if (head < commands.length && settled(commands[head]!)) sweep(now)
    commands.push(command as unknown as BoundCommand)
    deadlines.push(now + ms)
    if (timer === null) arm(ms)
    return send.call(this, command, stream as never)
  } as typeof client.sendCommand
  commandBounds.set(client, ms)
}
