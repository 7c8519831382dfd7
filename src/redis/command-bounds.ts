import type { Command, Redis } from 'ioredis'
import { type RedisClient, rawClient } from './client.ts'

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
 *
 * The verdict waits for the socket: Node runs due timers before it reads sockets, so after the
 * process was starved or its event loop blocked (a loaded machine, a long synchronous task), a
 * reply that came in time would lose to its own timeout. The timer only schedules the sweep
 * (`setImmediate`, which runs after the pending reads), and only what is still unanswered then fails.
 */
export function boundCommands(client: Redis, ms: number): void {
  const commands: BoundCommand[] = []
  const deadlines: number[] = []
  let head = 0
  // The timer for the oldest command's deadline, or the sweep it scheduled; null: none pending.
  let timer: NodeJS.Timeout | NodeJS.Immediate | null = null
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
    timer = setImmediate(afterReads)
  }
  const afterReads = () => {
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
