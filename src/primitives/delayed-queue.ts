import {
  channels,
  type DelayedQueueChannelContext as Traced,
  tracing,
} from '../plugins/common/diagnostics.ts'
import {
  type Lifecycle,
  LifecycleStatus,
  type StopOptions,
  type StopResult,
} from '../plugins/common/lifecycle.ts'
import { bridgeOpenTelemetry } from '../plugins/common/otel.ts'
import { type AnyRedisClient, checkRedisClient } from '../redis/client.ts'
import { callScript, codes, defineScript, ignored, integer } from '../redis/scripts.ts'
import { InvalidArgumentError, shown } from './checks.ts'
import { type Consumer, startConsumer } from './delayed-queue/consume.ts'
import {
  type ConsumeOptions,
  type DelayedQueueOptions,
  type DelayedQueueTask,
  resolveQueueOptions,
} from './delayed-queue/options.ts'

export type { Lifecycle, LifecycleHealth, StopOptions, StopResult } from '../plugins/common/lifecycle.ts'
export type { Consumer } from './delayed-queue/consume.ts'
export type { ConsumeOptions, DelayedQueueOptions, DelayedQueueTask } from './delayed-queue/options.ts'

// A delayed job queue on Redis. Each instance schedules into its own sorted set (no two movers race
// over one set: no lock needed), moves what is due into one shared ready list, and workers take from
// it with an atomic move into their instance's processing list. A watchdog returns what stays taken
// too long; a live instance (its heartbeat has a TTL) adopts the sets of one whose heartbeat is gone.

/** The keys of one queue: all in the slot of the hash tag `{<name>}`. */
export interface DelayedQueueKeys {
  ready: string
  instances: string
  delayed(instanceId: string): string
  processing(instanceId: string): string
  taken(instanceId: string): string
  heartbeat(instanceId: string): string
}

export interface DelayedQueueStopResult extends StopResult {
  /**
   * Ids handed back to ready; null when the hand-back did not happen (the deadline passed first, or
   * Redis could not be reached: `health().lastError` says which error, and the ids come back after
   * the visibility timeout).
   */
  handedBack: number | null
}

/**
 * A delayed queue and its background work (`Lifecycle`): `start()` runs the heartbeat, mover,
 * watchdog and adoption on (unref'd) timers; `health()` gives their state and latest error.
 */
export interface DelayedQueue extends Lifecycle {
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
  /**
   * Stops the timers and this queue's consumers (waiting for the items in hand), then hands back:
   * this instance's processing ids return to ready and its heartbeat is deleted, so a live instance
   * adopts its delayed set at its next adoption round. Never rejects: resolves with whether it
   * stopped within `deadlineMs` and how many ids it handed back.
   */
  stop(options?: StopOptions): Promise<DelayedQueueStopResult>
  /** Takes, runs `handler`, acknowledges; a throwing handler's id is nacked with a backoff. */
  consume(handler: (id: string) => unknown, options?: ConsumeOptions): Consumer
}

const MAX_ROUNDS = 100

// The queue's scripts (src/lua/delayed-queue-*.lua).
const SCHEDULE = defineScript({
  name: 'delayedQueueSchedule',
  keys: ['delayed', 'instances'],
  args: ['id', 'dueAt', 'instance'],
  reply: codes({ scheduled: 1, alreadyScheduled: 0 }),
})
const REMOVE = defineScript({
  name: 'delayedQueueRemove',
  keys: ['ready', '...delayedSets'],
  args: ['id'],
  reply: integer,
})
const MOVE = defineScript({
  name: 'delayedQueueMove',
  keys: ['delayed', 'ready'],
  args: ['batch'],
  reply: integer,
})
const TAKE = defineScript({
  name: 'delayedQueueTake',
  keys: ['ready', 'processing', 'taken', 'instances'],
  args: ['instance'],
  reply: (raw) => raw as string | null,
})
const ACK = defineScript({
  name: 'delayedQueueAck',
  keys: ['processing', 'taken'],
  args: ['id'],
  reply: codes({ acknowledged: 1, notTaken: 0 }),
})
const NACK = defineScript({
  name: 'delayedQueueNack',
  keys: ['processing', 'taken', 'delayed', 'instances'],
  args: ['id', 'delayMs', 'instance'],
  reply: codes({ rescheduled: 1, notTaken: 0 }),
})
const RETURN_STUCK = defineScript({
  name: 'delayedQueueReturnStuck',
  keys: ['processing', 'taken', 'ready'],
  args: ['visibilityTimeoutMs', 'batch'],
  reply: integer,
})
const HEARTBEAT = defineScript({
  name: 'delayedQueueHeartbeat',
  keys: ['heartbeat', 'instances'],
  args: ['ttlMs', 'instance'],
  reply: ignored,
})
const ADOPT_STATUS = codes({ alive: -1, more: 0, done: 1 })
const ADOPT = defineScript({
  name: 'delayedQueueAdopt',
  keys: ['heartbeat', 'delayed', 'processing', 'taken', 'adopterDelayed', 'ready', 'instances'],
  args: ['orphan', 'batch', 'adopter'],
  reply: (raw) => {
    const [status, adopted] = raw as [number, number]
    return { status: ADOPT_STATUS(status), adopted: integer(adopted) }
  },
})
const HAND_BACK = defineScript({
  name: 'delayedQueueHandBack',
  keys: ['processing', 'taken', 'ready', 'heartbeat'],
  args: [],
  reply: integer,
})

export function createDelayedQueue(client: AnyRedisClient, options: DelayedQueueOptions): DelayedQueue {
  void bridgeOpenTelemetry()
  const redis = checkRedisClient('delayed queue', client)
  const settings = resolveQueueOptions(options)
  const { name, instanceId, visibilityTimeoutMs, heartbeatTtlMs, batch } = settings
  const status = new LifecycleStatus()
  const onError: typeof settings.onError = (err, task) => {
    status.failed(err)
    settings.onError(err, task)
  }

  const base = `${settings.keyPrefix}{${name}}`
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
    const reply = await callScript(
      redis,
      SCHEDULE,
      { delayed: keys.delayed(instanceId), instances: keys.instances },
      { id, dueAt: Math.floor(due), instance: instanceId },
    )
    return reply === 'scheduled'
  }

  async function remove(id: string): Promise<boolean> {
    if (typeof id !== 'string' || id.length === 0)
      throw new InvalidArgumentError(`delayed queue: \`id\` must be a non-empty string, got ${shown(id)}`)
    const delayedSets = (await instances()).map((instance) => keys.delayed(instance))
    const removed = await callScript(redis, REMOVE, { ready: keys.ready, delayedSets }, { id })
    return removed > 0
  }

  function move(): Promise<number> {
    return callScript(redis, MOVE, { delayed: keys.delayed(instanceId), ready: keys.ready }, { batch })
  }

  function take(): Promise<string | null> {
    return callScript(
      redis,
      TAKE,
      {
        ready: keys.ready,
        processing: keys.processing(instanceId),
        taken: keys.taken(instanceId),
        instances: keys.instances,
      },
      { instance: instanceId },
    )
  }

  async function ack(id: string): Promise<boolean> {
    const reply = await callScript(
      redis,
      ACK,
      { processing: keys.processing(instanceId), taken: keys.taken(instanceId) },
      { id },
    )
    return reply === 'acknowledged'
  }

  async function nack(id: string, delayMs = 0): Promise<boolean> {
    if (!Number.isFinite(delayMs) || delayMs < 0)
      throw new InvalidArgumentError(
        `delayed queue: \`delayMs\` must be a non-negative number, got ${shown(delayMs)}`,
      )
    const reply = await callScript(
      redis,
      NACK,
      {
        processing: keys.processing(instanceId),
        taken: keys.taken(instanceId),
        delayed: keys.delayed(instanceId),
        instances: keys.instances,
      },
      { id, delayMs: Math.floor(delayMs), instance: instanceId },
    )
    return reply === 'rescheduled'
  }

  async function instances(): Promise<string[]> {
    const members = await redis.smembers(keys.instances)
    return members.includes(instanceId) ? members : [...members, instanceId]
  }

  async function returnStuck(): Promise<number> {
    let returned = 0
    for (const instance of await instances()) {
      for (let round = 0; round < MAX_ROUNDS; round++) {
        const returnedNow = await callScript(
          redis,
          RETURN_STUCK,
          { processing: keys.processing(instance), taken: keys.taken(instance), ready: keys.ready },
          { visibilityTimeoutMs, batch },
        )
        returned += returnedNow
        if (returnedNow === 0) break
      }
    }
    return returned
  }

  async function heartbeat(): Promise<void> {
    await callScript(
      redis,
      HEARTBEAT,
      { heartbeat: keys.heartbeat(instanceId), instances: keys.instances },
      { ttlMs: heartbeatTtlMs, instance: instanceId },
    )
  }

  async function adoptOrphans(): Promise<number> {
    let adopted = 0
    for (const orphan of await instances()) {
      if (orphan === instanceId) continue
      for (let round = 0; round < MAX_ROUNDS; round++) {
        const reply = await callScript(
          redis,
          ADOPT,
          {
            heartbeat: keys.heartbeat(orphan),
            delayed: keys.delayed(orphan),
            processing: keys.processing(orphan),
            taken: keys.taken(orphan),
            adopterDelayed: keys.delayed(instanceId),
            ready: keys.ready,
            instances: keys.instances,
          },
          { orphan, batch, adopter: instanceId },
        )
        adopted += reply.adopted
        if (reply.status !== 'more') break
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

  async function start(): Promise<void> {
    if (started) return
    started = true
    status.state = 'running'
    stopping = undefined
    every('heartbeat', Math.max(1, Math.floor(heartbeatTtlMs / 3)), heartbeat)
    every('move', settings.moveIntervalMs, moveAllDue)
    every('watchdog', settings.watchdogIntervalMs, returnStuck)
    every('adopt', settings.adoptIntervalMs, adoptOrphans)
  }

  async function stop(options?: StopOptions): Promise<DelayedQueueStopResult> {
    let handedBack: number | null = null
    const { stopped } = await status.stopWithin(
      stopAndHandBack().then((n) => {
        handedBack = n
      }),
      options,
    )
    return { stopped, handedBack }
  }

  function stopAndHandBack(): Promise<number> {
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
      return callScript(
        redis,
        HAND_BACK,
        {
          processing: keys.processing(instanceId),
          taken: keys.taken(instanceId),
          ready: keys.ready,
          heartbeat: keys.heartbeat(instanceId),
        },
        {},
      )
    })()
    // Shared only while it runs: a later stop() hands back again (ids taken since, failed hand-backs).
    const current = stopping
    const settled = () => {
      if (stopping === current) stopping = undefined
    }
    current.then(settled, settled)
    return current
  }

  // Each operation traced on the delayed-queue channel: whether it scheduled, took or settled its entry.
  const traceOp = <A extends unknown[], R>(operation: Traced['operation'], run: (...args: A) => Promise<R>) =>
    tracing(
      channels.delayedQueue,
      (): Traced => ({ queue: name, operation, count: 0 }),
      run,
      (c, r) => {
        c.count = r === null || r === false ? 0 : 1
      },
    )
  const ops = {
    schedule: traceOp('schedule', schedule),
    take: traceOp('take', take),
    ack: traceOp('ack', ack),
    nack: traceOp('nack', nack),
  }

  function consume(handler: (id: string) => unknown, consumeOptions: ConsumeOptions = {}): Consumer {
    const started = startConsumer(
      { take: ops.take, ack: ops.ack, nack: ops.nack, onError },
      handler,
      consumeOptions,
    )
    const consumer: Consumer = {
      async stop() {
        await started.stop()
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
    ...ops,
    remove,
    move,
    returnStuck,
    heartbeat,
    adoptOrphans,
    start,
    stop,
    health: () => status.health(),
    consume,
  }
}
