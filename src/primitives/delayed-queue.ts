import { randomBytes } from 'node:crypto'
import { runScript } from '../lua/index.ts'
import { type OptionChecker, optionChecker, optionKeys } from '../plugins/common/options.ts'
import { type AnyRedisClient, checkRedisClient } from '../plugins/common/redis.ts'
import { checkedOptions, InvalidArgumentError, shown } from './checks.ts'

// A delayed job queue on Redis. Each instance schedules into its own sorted set (no two movers ever
// race over one set, so no lock is needed), moves what is due into one shared ready list, and
// workers take from it with an atomic move into their instance's processing list. A watchdog returns
// what stays taken too long; a heartbeat with a TTL says an instance lives, and a live instance adopts
// the sets of one whose heartbeat is gone. Every key of a queue carries the hash tag `{<name>}`.

export interface DelayedQueueOptions {
  /** The queue's name; every instance of one queue uses the same name (and keyPrefix). */
  name: string
  /**
   * This instance's id (default: random). A stable id (a pod or host name) lets a restarted instance
   * carry on with its own delayed set; two live processes must never share one.
   */
  instanceId?: string
  /** Prefix of every key (default `dq:`). */
  keyPrefix?: string
  /** A taken id not acknowledged within this many ms goes back to ready (default 30 000). */
  visibilityTimeoutMs?: number
  /** Heartbeat key TTL (default 15 000); the heartbeat is refreshed every third of it. */
  heartbeatTtlMs?: number
  /** How often `start()` moves due ids to ready (default 1000). */
  moveIntervalMs?: number
  /** How often `start()` runs the watchdog (default half the visibility timeout, at most 5000). */
  watchdogIntervalMs?: number
  /** How often `start()` looks for orphaned instances (default `heartbeatTtlMs`). */
  adoptIntervalMs?: number
  /** Ids per script call (mover, watchdog, adoption), 1 to 1000 (default 100). */
  batch?: number
  /** Called with the errors of background work (timers and consumers), which never throws. */
  onError?: (error: unknown, task: DelayedQueueTask) => void
}

export type DelayedQueueTask =
  | 'move'
  | 'heartbeat'
  | 'watchdog'
  | 'adopt'
  | 'take'
  | 'ack'
  | 'nack'
  | 'retryDelay'

export interface ConsumeOptions {
  /** Items handled at once by this consumer (default 1). */
  concurrency?: number
  /** Pause when nothing is ready, or after a failed take, in ms (default 100). */
  pollMs?: number
  /**
   * Delay before a failed item is due again, by its failed attempt number in this process (1, 2, ...):
   * default 1 s doubling up to 60 s.
   */
  retryDelayMs?: (attempt: number, id: string, error: unknown) => number
}

export interface Consumer {
  /** Stops taking; resolves once the items in hand have been handled and acknowledged (or nacked). */
  stop(): Promise<void>
}

/** The keys of one queue (all in the slot of the hash tag `{<name>}`). */
export interface DelayedQueueKeys {
  ready: string
  instances: string
  delayed(instanceId: string): string
  processing(instanceId: string): string
  taken(instanceId: string): string
  heartbeat(instanceId: string): string
}

export interface DelayedQueue {
  readonly name: string
  readonly instanceId: string
  readonly keys: DelayedQueueKeys
  /**
   * Schedules `id` for `dueAt` (epoch ms of this process's clock, or a Date) in this instance's
   * delayed set; false when the id is already there (its first due time stays: nobody can postpone it).
   */
  schedule(id: string, dueAt: number | Date): Promise<boolean>
  /**
   * Unschedules a waiting `id`: removes it from every registered instance's delayed set and from the
   * ready list (one script); false when it was not waiting. A taken id is left to its handler.
   */
  remove(id: string): Promise<boolean>
  /** Moves up to `batch` due ids of this instance's set to ready (one script); the number moved. */
  move(): Promise<number>
  /** Takes the next ready id into this instance's processing list, or null when none is ready. */
  take(): Promise<string | null>
  /** Acknowledges a taken id; false when it was no longer taken (it was returned and will come again). */
  ack(id: string): Promise<boolean>
  /** Gives a taken id back, due again `delayMs` from now (Redis clock); false when it was no longer taken. */
  nack(id: string, delayMs?: number): Promise<boolean>
  /** The watchdog, once: ids taken longer than the visibility timeout, in any instance, go back to ready. */
  returnStuck(): Promise<number>
  /** Refreshes this instance's heartbeat and registration. */
  heartbeat(): Promise<void>
  /** Adopts every registered instance whose heartbeat is gone; the number of ids adopted. */
  adoptOrphans(): Promise<number>
  /** Runs the heartbeat, mover, watchdog and adoption on (unref'd) timers. */
  start(): void
  /**
   * Stops the timers and this queue's consumers (waiting for the items in hand), then hands back:
   * this instance's processing ids return to ready and its heartbeat is deleted, so a live instance
   * adopts its delayed set at its next adoption round. Resolves with the number of ids handed back.
   */
  stop(): Promise<number>
  /** Takes, runs `handler`, acknowledges; a throwing handler's id is nacked with a backoff. */
  consume(handler: (id: string) => unknown, options?: ConsumeOptions): Consumer
}

const MAX_ROUNDS = 100

const QUEUE_OPTIONS = optionKeys<DelayedQueueOptions>({
  name: true,
  instanceId: true,
  keyPrefix: true,
  visibilityTimeoutMs: true,
  heartbeatTtlMs: true,
  moveIntervalMs: true,
  watchdogIntervalMs: true,
  adoptIntervalMs: true,
  batch: true,
  onError: true,
})
const CONSUME_OPTIONS = optionKeys<ConsumeOptions>({ concurrency: true, pollMs: true, retryDelayMs: true })

function positiveInt(
  check: OptionChecker,
  value: unknown,
  option: string,
  min = 1,
  max = Number.MAX_SAFE_INTEGER,
) {
  if (!Number.isInteger(value) || (value as number) < min || (value as number) > max)
    check.fail(`\`${option}\` must be an integer from ${min} to ${max}, got ${shown(value)}`)
  return value as number
}

function nonEmpty(check: OptionChecker, value: unknown, option: string): string {
  if (typeof value !== 'string' || value.length === 0)
    check.fail(`\`${option}\` must be a non-empty string, got ${shown(value)}`)
  return value
}

function functionOrUndefined<T>(check: OptionChecker, value: T | undefined, option: string, of: string) {
  if (value !== undefined && typeof value !== 'function')
    check.fail(`\`${option}\` must be a function of ${of}, got ${shown(value)}`)
  return value
}

const defaultRetryDelay = (attempt: number) => Math.min(60_000, 1000 * 2 ** Math.min(attempt - 1, 16))

export function createDelayedQueue(client: AnyRedisClient, options: DelayedQueueOptions): DelayedQueue {
  const redis = checkRedisClient('delayed queue', client)
  const check = optionChecker('delayed queue')
  checkedOptions(check, options, QUEUE_OPTIONS)
  const name = nonEmpty(check, options.name, 'name')
  const instanceId = nonEmpty(check, options.instanceId ?? randomBytes(8).toString('hex'), 'instanceId')
  const keyPrefix = options.keyPrefix ?? 'dq:'
  if (typeof keyPrefix !== 'string') check.fail(`\`keyPrefix\` must be a string, got ${shown(keyPrefix)}`)
  const visibilityTimeoutMs = positiveInt(check, options.visibilityTimeoutMs ?? 30_000, 'visibilityTimeoutMs')
  const heartbeatTtlMs = positiveInt(check, options.heartbeatTtlMs ?? 15_000, 'heartbeatTtlMs', 3)
  const moveIntervalMs = positiveInt(check, options.moveIntervalMs ?? 1000, 'moveIntervalMs')
  const watchdogIntervalMs = positiveInt(
    check,
    options.watchdogIntervalMs ?? Math.max(1, Math.min(5000, Math.floor(visibilityTimeoutMs / 2))),
    'watchdogIntervalMs',
  )
  const adoptIntervalMs = positiveInt(check, options.adoptIntervalMs ?? heartbeatTtlMs, 'adoptIntervalMs')
  const batch = positiveInt(check, options.batch ?? 100, 'batch', 1, 1000)
  const report =
    functionOrUndefined(check, options.onError, 'onError', 'the error and the task') ?? (() => {})
  // A throwing onError must not break the timers or the consumers.
  const onError = (error: unknown, task: DelayedQueueTask) => {
    try {
      report(error, task)
    } catch {}
  }

  const base = `${keyPrefix}{${name}}`
  const keys: DelayedQueueKeys = {
    ready: `${base}:ready`,
    instances: `${base}:instances`,
    delayed: (id) => `${base}:delayed:${id}`,
    processing: (id) => `${base}:processing:${id}`,
    taken: (id) => `${base}:taken:${id}`,
    heartbeat: (id) => `${base}:heartbeat:${id}`,
  }

  async function schedule(id: string, dueAt: number | Date): Promise<boolean> {
    if (typeof id !== 'string' || id.length === 0)
      throw new InvalidArgumentError(`delayed queue: \`id\` must be a non-empty string, got ${shown(id)}`)
    const due = dueAt instanceof Date ? dueAt.getTime() : dueAt
    if (typeof due !== 'number' || !Number.isFinite(due))
      throw new InvalidArgumentError(
        `delayed queue: \`dueAt\` must be epoch ms or a Date, got ${shown(dueAt)}`,
      )
    const added = await runScript<number>(
      redis,
      'delayedQueueSchedule',
      [keys.delayed(instanceId), keys.instances],
      [id, Math.floor(due), instanceId],
    )
    return added === 1
  }

  async function remove(id: string): Promise<boolean> {
    if (typeof id !== 'string' || id.length === 0)
      throw new InvalidArgumentError(`delayed queue: \`id\` must be a non-empty string, got ${shown(id)}`)
    const delayedSets = (await instances()).map((instance) => keys.delayed(instance))
    const removed = await runScript<number>(redis, 'delayedQueueRemove', [keys.ready, ...delayedSets], [id])
    return removed > 0
  }

  function move(): Promise<number> {
    return runScript<number>(redis, 'delayedQueueMove', [keys.delayed(instanceId), keys.ready], [batch])
  }

  function take(): Promise<string | null> {
    return runScript<string | null>(
      redis,
      'delayedQueueTake',
      [keys.ready, keys.processing(instanceId), keys.taken(instanceId), keys.instances],
      [instanceId],
    )
  }

  async function ack(id: string): Promise<boolean> {
    const done = await runScript<number>(
      redis,
      'delayedQueueAck',
      [keys.processing(instanceId), keys.taken(instanceId)],
      [id],
    )
    return done === 1
  }

  async function nack(id: string, delayMs = 0): Promise<boolean> {
    if (!Number.isFinite(delayMs) || delayMs < 0)
      throw new InvalidArgumentError(
        `delayed queue: \`delayMs\` must be a non-negative number, got ${shown(delayMs)}`,
      )
    const done = await runScript<number>(
      redis,
      'delayedQueueNack',
      [keys.processing(instanceId), keys.taken(instanceId), keys.delayed(instanceId), keys.instances],
      [id, Math.floor(delayMs), instanceId],
    )
    return done === 1
  }

  async function instances(): Promise<string[]> {
    const members = await redis.smembers(keys.instances)
    return members.includes(instanceId) ? members : [...members, instanceId]
  }

  async function returnStuck(): Promise<number> {
    let returned = 0
    for (const instance of await instances()) {
      for (let round = 0; round < MAX_ROUNDS; round++) {
        const n = await runScript<number>(
          redis,
          'delayedQueueReturnStuck',
          [keys.processing(instance), keys.taken(instance), keys.ready],
          [visibilityTimeoutMs, batch],
        )
        returned += n
        if (n === 0) break
      }
    }
    return returned
  }

  async function heartbeat(): Promise<void> {
    await runScript(
      redis,
      'delayedQueueHeartbeat',
      [keys.heartbeat(instanceId), keys.instances],
      [heartbeatTtlMs, instanceId],
    )
  }

  async function adoptOrphans(): Promise<number> {
    let adopted = 0
    for (const orphan of await instances()) {
      if (orphan === instanceId) continue
      for (let round = 0; round < MAX_ROUNDS; round++) {
        const [status, n] = await runScript<[number, number]>(
          redis,
          'delayedQueueAdopt',
          [
            keys.heartbeat(orphan),
            keys.delayed(orphan),
            keys.processing(orphan),
            keys.taken(orphan),
            keys.delayed(instanceId),
            keys.ready,
            keys.instances,
          ],
          [orphan, batch, instanceId],
        )
        adopted += n
        if (status !== 0) break
      }
    }
    return adopted
  }

  // Background work: each task on its own chain of unref'd timeouts (a run never overlaps the next).
  interface Task {
    active: boolean
    timer?: NodeJS.Timeout
    running?: Promise<void>
  }
  const tasks = new Map<DelayedQueueTask, Task>()
  const consumers = new Set<Consumer>()
  let started = false
  let stopping: Promise<number> | undefined

  function every(task: DelayedQueueTask, intervalMs: number, work: () => Promise<unknown>) {
    const state: Task = { active: true }
    tasks.set(task, state)
    const run = () => {
      state.running = work()
        .then(
          () => {},
          (err) => onError(err, task),
        )
        .finally(() => {
          state.running = undefined
          if (state.active) state.timer = setTimeout(run, intervalMs).unref()
        })
    }
    run()
  }

  async function moveAllDue(): Promise<void> {
    for (let round = 0; round < MAX_ROUNDS && started; round++) {
      if ((await move()) < batch) return
    }
  }

  function start(): void {
    if (started) return
    started = true
    stopping = undefined
    every('heartbeat', Math.max(1, Math.floor(heartbeatTtlMs / 3)), heartbeat)
    every('move', moveIntervalMs, moveAllDue)
    every('watchdog', watchdogIntervalMs, returnStuck)
    every('adopt', adoptIntervalMs, adoptOrphans)
  }

  function stop(): Promise<number> {
    stopping ??= (async () => {
      started = false
      const stopped = [...tasks.values()]
      tasks.clear()
      for (const task of stopped) {
        task.active = false
        clearTimeout(task.timer)
      }
      await Promise.all([...consumers].map((consumer) => consumer.stop()))
      await Promise.all(stopped.map((task) => task.running))
      return runScript<number>(redis, 'delayedQueueHandBack', [
        keys.processing(instanceId),
        keys.taken(instanceId),
        keys.ready,
        keys.heartbeat(instanceId),
      ])
    })()
    // A failed hand-back (Redis unreachable) may be retried by calling stop() again.
    stopping.catch(() => {
      stopping = undefined
    })
    return stopping
  }

  function consume(handler: (id: string) => unknown, consumeOptions: ConsumeOptions = {}): Consumer {
    if (typeof handler !== 'function')
      throw new InvalidArgumentError(
        `delayed queue: \`handler\` must be a function of the id, got ${shown(handler)}`,
      )
    const consumeCheck = optionChecker('delayed queue consume')
    checkedOptions(consumeCheck, consumeOptions, CONSUME_OPTIONS)
    const concurrency = positiveInt(consumeCheck, consumeOptions.concurrency ?? 1, 'concurrency')
    const pollMs = positiveInt(consumeCheck, consumeOptions.pollMs ?? 100, 'pollMs')
    const retryDelayMs =
      functionOrUndefined(
        consumeCheck,
        consumeOptions.retryDelayMs,
        'retryDelayMs',
        'the attempt, the id and the error',
      ) ?? defaultRetryDelay
    // Failed attempts per id in this process (an id that fails here again backs off longer).
    const attempts = new Map<string, number>()
    let halted = false
    const wakers = new Set<() => void>()
    const pause = () =>
      new Promise<void>((resolve) => {
        const timer = setTimeout(done, pollMs)
        function done() {
          clearTimeout(timer)
          wakers.delete(done)
          resolve()
        }
        wakers.add(done)
      })

    async function handle(id: string) {
      let failed = false
      let error: unknown
      try {
        await handler(id)
      } catch (err) {
        failed = true
        error = err
      }
      if (!failed) {
        attempts.delete(id)
        await ack(id).catch((err) => onError(err, 'ack'))
        return
      }
      const attempt = (attempts.get(id) ?? 0) + 1
      attempts.delete(id)
      attempts.set(id, attempt)
      if (attempts.size > 10_000) attempts.delete(attempts.keys().next().value!)
      let delay = 0
      try {
        delay = Math.max(0, Number(retryDelayMs(attempt, id, error)) || 0)
      } catch (err) {
        onError(err, 'retryDelay')
      }
      await nack(id, delay).catch((err) => onError(err, 'nack'))
    }

    async function worker() {
      while (!halted) {
        let id: string | null
        try {
          id = await take()
        } catch (err) {
          onError(err, 'take')
          await pause()
          continue
        }
        if (id === null) await pause()
        else await handle(id)
      }
    }

    const running = Promise.all(Array.from({ length: concurrency }, worker))
    const consumer: Consumer = {
      async stop() {
        halted = true
        for (const wake of [...wakers]) wake()
        await running
        consumers.delete(consumer)
      },
    }
    consumers.add(consumer)
    return consumer
  }

  return {
    name,
    instanceId,
    keys,
    schedule,
    remove,
    move,
    take,
    ack,
    nack,
    returnStuck,
    heartbeat,
    adoptOrphans,
    start,
    stop,
    consume,
  }
}
