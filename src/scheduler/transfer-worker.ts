import type { FastifyBaseLogger } from 'fastify'
import {
  type Consumer,
  createDelayedQueue,
  type DelayedQueue,
  type Lifecycle,
  LifecycleStatus,
  type RedisClient,
} from 'fastify-redis-gateway'
import { Gauge, Histogram, type Registry } from 'prom-client'
import type { Database } from '../db/database.ts'
import { type DescribeRefusal, executeScheduledTransfer, type ScheduledRun } from '../ledger/ledger.ts'
import { queuedIds } from './queue-presence.ts'
import { dueCount, markRunning, type NotDue, pendingSchedules } from './store.ts'

export interface TransferWorkerOptions {
  redis: RedisClient
  db: Database
  log: FastifyBaseLogger
  /** This gateway's key prefix; the queue's keys are `<prefix>dq:{scheduled-transfers}:...`. */
  keyPrefix: string
  instanceId: string
  /** Schedules run at once by this instance (default 4). */
  concurrency?: number
  /** A taken schedule not acknowledged within this long is handed to another worker (default 30 s). */
  visibilityTimeoutMs?: number
  /** The queue's heartbeat TTL: a dead instance's schedules are adopted after it (default 15 s). */
  heartbeatTtlMs?: number
  /** How often due schedules move to the ready list (default 1 s). */
  moveIntervalMs?: number
  /** How often the reconciler compares Postgres with the queue (default 30 s). */
  reconcileIntervalMs?: number
  /** Schedules due within this long are checked by the reconciler (default twice its interval). */
  reconcileHorizonMs?: number
  /** Delay before a run that failed transiently is tried again (default 1 s doubling up to 60 s). */
  retryDelayMs?: (attempt: number) => number
  /** Whether a scheduled transfer also writes its outbox event, as POST /transfers does (default true). */
  outbox?: boolean
  /** How a refused run is recorded on its schedule (insufficient funds, ...): the HTTP layer's problem. */
  describeRefusal: DescribeRefusal
  /** Called after each run (completed, failed or skipped): cache invalidation, tests. */
  onRun?: (scheduleId: number, run: ScheduledRun) => unknown
  /** The registry its metrics go to (the metrics plugin's); without it they are not registered. */
  registry?: Registry
}

/**
 * The worker's lifecycle: `start()` runs the queue's timers, its consumer and the reconciler;
 * `stop()` stops the consumer and the reconciler, then hands back what this instance had taken;
 * `health()` has the latest error of the queue or the reconciler.
 */
export interface TransferWorker extends Lifecycle {
  readonly queue: DelayedQueue
  /** Puts a schedule into the queue (this instance's delayed set); re-adding keeps its first due time. */
  schedule(scheduleId: number, runAt: Date): Promise<boolean>
  /** Takes a schedule out of the queue (a cancelled one); false when it was not waiting there. */
  unschedule(scheduleId: number): Promise<boolean>
  /**
   * Runs one schedule (what the consumer does with a delivered id); exported for tests. `not-due`:
   * its runAt is ahead by Postgres's clock, nothing was done.
   */
  run(scheduleId: number): Promise<ScheduledRun | 'finished' | NotDue>
  /** One reconciler round: re-queues pending schedules the queue lacks; the number re-queued. */
  reconcile(): Promise<number>
}

const RECONCILE_BATCH = 1000
/** Lateness of a run, seconds: a mover tick, a busy consumer, a retry's backoff, a backlog. */
const LATENESS_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]

/** How late each run started, by outcome; and the schedules due and not finished (one Postgres count). */
function createMetrics(db: Database, registry: Registry | undefined) {
  const registers = registry ? [registry] : []
  new Gauge({
    name: 'scheduled_transfers_due',
    help: 'Scheduled transfers past their due time and not finished yet (scheduled or running), across all instances',
    registers,
    async collect() {
      // Postgres unreachable: the last value stays (the scrape does not fail).
      await dueCount(db).then(
        (n) => this.set(n),
        () => {},
      )
    },
  })
  return new Histogram({
    name: 'scheduled_transfers_lateness_seconds',
    help: 'How long after its due time a scheduled transfer started running, by outcome (completed, failed, skipped, error)',
    labelNames: ['outcome'] as const,
    buckets: LATENESS_BUCKETS,
    registers,
  })
}

/**
 * Runs scheduled transfers from the delayed queue. Postgres holds every schedule; the queue only
 * says when to look. A delivered id is marked running once due by Postgres's clock (one delivered
 * early goes back into the queue), then executed bound to its row (a duplicate delivery moves
 * nothing); a transient error throws, so the queue nacks it with a backoff. The reconciler
 * re-queues what Postgres has pending and Redis lacks (a flush, a restart, a lost write).
 */
export function createTransferWorker(options: TransferWorkerOptions): TransferWorker {
  const { redis, db, log } = options
  const reconcileIntervalMs = options.reconcileIntervalMs ?? 30_000
  const reconcileHorizonMs = options.reconcileHorizonMs ?? 2 * reconcileIntervalMs
  const queue = createDelayedQueue(redis, {
    name: 'scheduled-transfers',
    keyPrefix: `${options.keyPrefix}dq:`,
    instanceId: options.instanceId,
    visibilityTimeoutMs: options.visibilityTimeoutMs ?? 30_000,
    heartbeatTtlMs: options.heartbeatTtlMs ?? 15_000,
    moveIntervalMs: options.moveIntervalMs ?? 1000,
    onError: (err, task) => log.warn({ err, task }, 'scheduled transfers: queue error'),
  })
  const status = new LifecycleStatus()
  const lateness = createMetrics(db, options.registry)
  let consumer: Consumer | undefined
  let timer: NodeJS.Timeout | undefined
  let reconciling: Promise<unknown> | undefined

  async function run(scheduleId: number): Promise<ScheduledRun | 'finished' | NotDue> {
    const marked = await markRunning(db, scheduleId)
    if (marked === 'finished' || marked.status === 'not-due') return marked
    let outcome: ScheduledRun
    try {
      outcome = await executeScheduledTransfer(db, scheduleId, {
        outbox: options.outbox ?? true,
        describeRefusal: options.describeRefusal,
      })
    } catch (err) {
      // Thrown to be retried: a run of its own, and the retry another.
      lateness.observe({ outcome: 'error' }, marked.lateSeconds)
      throw err
    }
    lateness.observe({ outcome: outcome.status }, marked.lateSeconds)
    if (outcome.status === 'failed')
      log.info({ scheduleId, failure: outcome.failure }, 'scheduled transfer failed')
    try {
      await options.onRun?.(scheduleId, outcome)
    } catch (err) {
      log.warn({ err, scheduleId }, 'scheduled transfers: after-run hook failed')
    }
    return outcome
  }

  async function reconcile(): Promise<number> {
    const pending = await pendingSchedules(db, reconcileHorizonMs, RECONCILE_BATCH)
    const present = await queuedIds(
      redis,
      queue,
      pending.map((p) => p.id),
    )
    let added = 0
    for (const { id, runAt } of pending) {
      if (present.has(id)) continue
      if (await queue.schedule(id, runAt)) added++
    }
    if (added > 0) log.warn({ added }, 'scheduled transfers: re-queued schedules the queue had lost')
    return added
  }

  const reconcileTick = () => {
    if (reconciling) return
    reconciling = reconcile()
      .catch((err) => {
        status.failed(err)
        log.warn({ err }, 'scheduled transfers: reconcile failed')
      })
      .finally(() => {
        reconciling = undefined
      })
  }

  return {
    queue,
    schedule: (scheduleId, runAt) => queue.schedule(String(scheduleId), runAt),
    unschedule: (scheduleId) => queue.remove(String(scheduleId)),
    run,
    reconcile,
    async start() {
      if (status.state === 'running') return
      status.state = 'running'
      await queue.start()
      consumer = queue.consume(
        async (id) => {
          const scheduleId = Number(id)
          // Not one of ours (a foreign id in the queue): acknowledged and dropped.
          if (!Number.isSafeInteger(scheduleId) || scheduleId < 1) return
          const outcome = await run(scheduleId)
          // Delivered before its runAt by Postgres's clock: back into the delayed set for the rest
          // of the wait, on the Redis clock the mover reads (the acknowledgement then finds nothing).
          if (typeof outcome === 'object' && outcome.status === 'not-due')
            await queue.nack(id, outcome.dueInMs)
        },
        {
          concurrency: options.concurrency ?? 4,
          ...(options.retryDelayMs ? { retryDelayMs: options.retryDelayMs } : {}),
        },
      )
      reconcileTick()
      timer = setInterval(reconcileTick, reconcileIntervalMs)
      timer.unref()
    },
    stop(stopOptions) {
      clearInterval(timer)
      const stopping = (async () => {
        await consumer?.stop()
        await reconciling
        await queue.stop()
      })()
      return status.stopWithin(stopping, stopOptions)
    },
    health: () => status.health({}, [queue]),
  }
}
