import type { FastifyBaseLogger } from 'fastify'
import {
  type Consumer,
  createDelayedQueue,
  createLock,
  type DelayedQueue,
  type Lifecycle,
  LifecycleStatus,
  LockNotAcquiredError,
  type RedisClient,
} from 'fastify-redis-gateway'
import { Counter, Gauge, type Registry } from 'prom-client'
import type { Database, Queryable } from '../db/database.ts'
import { queuedIds } from './queue-presence.ts'

export interface Violation {
  kind: 'balance-mismatch' | 'unbalanced-transfer' | 'negative-balance'
  /** The account id (balance-mismatch, negative-balance) or the transfer id (unbalanced-transfer). */
  id: number
  /** balance-mismatch: balance - (opening + entries); unbalanced-transfer: the entries' sum; negative-balance: the balance. */
  amount: string
}

const MAX_VIOLATIONS = 1000

/**
 * The ledger's invariants, in one statement (one snapshot, so transfers committing meanwhile never
 * show as a mismatch): every account's balance equals its opening balance plus its entries, every
 * transfer's entries sum to zero, no balance is negative.
 */
export async function checkLedger(db: Queryable): Promise<Violation[]> {
  const rows = await db.query<{ kind: Violation['kind']; id: unknown; amount: string }>(
    `SELECT 'balance-mismatch' AS kind, a.id::bigint AS id,
            (a.balance - a.opening_balance - coalesce(e.total, 0))::text AS amount
     FROM accounts a
     LEFT JOIN (SELECT account_id, sum(amount) AS total FROM ledger_entries GROUP BY account_id) e
       ON e.account_id = a.id
     WHERE a.balance <> a.opening_balance + coalesce(e.total, 0)
     UNION ALL
     SELECT 'unbalanced-transfer', transfer_id, sum(amount)::text
     FROM ledger_entries GROUP BY transfer_id HAVING sum(amount) <> 0
     UNION ALL
     SELECT 'negative-balance', id::bigint, balance::text FROM accounts WHERE balance < 0
     LIMIT ${MAX_VIOLATIONS}`,
  )
  return rows.map((r) => ({ kind: r.kind, id: Number(r.id), amount: r.amount }))
}

export interface ReconciliationJobOptions {
  redis: RedisClient
  db: Database
  log: FastifyBaseLogger
  keyPrefix: string
  instanceId: string
  /** Time between runs (config RECONCILIATION_PERIOD). */
  periodMs: number
  /** The longest a run may take (default 60 s). */
  maxWorkTimeMs?: number
  /** Margin on top of it (default 10 s). */
  bufferMs?: number
  /**
   * How often this instance checks that the trigger exists (re-seeding it if not): must exceed
   * maxWorkTimeMs + bufferMs (default twice that sum).
   */
  watchdogIntervalMs?: number
  /** The lock's TTL, renewed while a run lasts (default 10 s): how soon a dead holder frees it. */
  lockTtlMs?: number
  /** The jobs queue's heartbeat TTL (default 15 s). */
  heartbeatTtlMs?: number
  moveIntervalMs?: number
  /**
   * Delay before a failed run is retried, by its failed attempt in this process (1, 2, ...): the
   * retries go on until a run of the period ends `ok` or `violations` (default the jobs queue's
   * backoff, 1 s doubling up to 60 s).
   */
  retryDelayMs?: (attempt: number) => number
  /** Where the metrics go (the metrics plugin's registry). */
  registry?: Registry
}

export type RunOutcome =
  | { ran: true; runId: number; fence: number; violations: Violation[] }
  | { ran: false; reason: 'held' | 'duplicate' | 'fenced' }

/**
 * The job's lifecycle: `start()` runs the jobs queue, its consumer and the watchdog; `stop()` lets a
 * run in progress finish (its lock is released) and hands the trigger back; `health()` has the
 * latest error of the queue, a run or the watchdog.
 */
export interface ReconciliationJob extends Lifecycle {
  readonly queue: DelayedQueue
  /** The trigger's id in the jobs queue. */
  readonly token: string
  /** Handles one delivery of the trigger: the run under the lock, then re-arming. */
  trigger(): Promise<RunOutcome>
  /** The watchdog once: re-seeds the trigger when no instance has it; true when it did. */
  watchdog(): Promise<boolean>
}

export const RECONCILE_TOKEN = 'reconcile'
const LOCK_NAME = 'reconciliation'

/**
 * The end-of-day reconciliation as a singleton periodic job: a trigger token in a delayed queue
 * (survives crashes and deploys), a lock as the mutex (one run at a time across instances) whose
 * fencing token is recorded with the run (a stale holder cannot record one), re-armed one period
 * after each run, and a watchdog that re-seeds the token when no queue structure holds it.
 */
export function createReconciliationJob(options: ReconciliationJobOptions): ReconciliationJob {
  const { redis, db, log, periodMs, instanceId } = options
  const maxWorkTimeMs = options.maxWorkTimeMs ?? 60_000
  const bufferMs = options.bufferMs ?? 10_000
  const watchdogIntervalMs = options.watchdogIntervalMs ?? 2 * (maxWorkTimeMs + bufferMs)
  if (watchdogIntervalMs <= maxWorkTimeMs + bufferMs)
    throw new TypeError('reconciliation job: watchdogIntervalMs must exceed maxWorkTimeMs + bufferMs')
  const lockTtlMs = options.lockTtlMs ?? 10_000
  const queue = createDelayedQueue(redis, {
    name: 'jobs',
    keyPrefix: `${options.keyPrefix}dq:`,
    instanceId,
    // A trigger taken by a worker that died is handed on once a run could no longer be in progress.
    visibilityTimeoutMs: maxWorkTimeMs + bufferMs,
    heartbeatTtlMs: options.heartbeatTtlMs ?? 15_000,
    moveIntervalMs: options.moveIntervalMs ?? 1000,
    onError: (err, task) => log.warn({ err, task }, 'reconciliation job: queue error'),
  })
  const locks = createLock(redis, { keyPrefix: `${options.keyPrefix}lock:` })
  const registers = options.registry ? [options.registry] : []
  const runs = new Counter({
    name: 'reconciliation_runs_total',
    help: 'End-of-day reconciliation runs by result (ok, violations, error)',
    labelNames: ['result'] as const,
    registers,
  })
  const violationsGauge = new Gauge({
    name: 'reconciliation_violations',
    help: 'Ledger invariant violations found by the latest reconciliation run of this instance',
    registers,
  })
  const status = new LifecycleStatus()
  let consumer: Consumer | undefined
  let timer: NodeJS.Timeout | undefined
  let watching: Promise<unknown> | undefined

  async function runLocked(signal: AbortSignal, fence: number): Promise<RunOutcome> {
    // A duplicate trigger (seeded twice, returned by a watchdog): a run completed within half a
    // period. A run that failed is no run of the period: the trigger's retry must run again.
    const [recent] = await db.query<{ recent: boolean }>(
      `SELECT EXISTS (SELECT 1 FROM reconciliation_runs
         WHERE result IN ('ok', 'violations')
           AND finished_at > now() - $1 * interval '1 millisecond') AS recent`,
      [periodMs / 2],
    )
    if (recent?.recent) return { ran: false, reason: 'duplicate' }
    // The fence guards the record: a holder whose lock was taken over cannot start a run.
    const [started] = await db.query<{ id: unknown }>(
      `INSERT INTO reconciliation_runs (instance_id, fence)
       SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM reconciliation_runs WHERE fence >= $2)
       RETURNING id`,
      [instanceId, fence],
    )
    if (!started) return { ran: false, reason: 'fenced' }
    const runId = Number(started.id)
    let violations: Violation[]
    try {
      signal.throwIfAborted()
      violations = await checkLedger(db)
    } catch (err) {
      await db
        .query(
          `UPDATE reconciliation_runs SET finished_at = clock_timestamp(), result = 'error' WHERE id = $1`,
          [runId],
        )
        .catch(() => {})
      runs.inc({ result: 'error' })
      throw err
    }
    const result = violations.length ? 'violations' : 'ok'
    await db.query(
      `UPDATE reconciliation_runs SET finished_at = clock_timestamp(), result = $2, violation_count = $3,
         violations = $4 WHERE id = $1`,
      [runId, result, violations.length, JSON.stringify(violations)],
    )
    runs.inc({ result })
    violationsGauge.set(violations.length)
    if (violations.length)
      log.error(
        { runId, fence, violations: violations.slice(0, 20), count: violations.length },
        'reconciliation: ledger invariants violated',
      )
    else log.info({ runId, fence }, 'reconciliation: ledger consistent')
    return { ran: true, runId, fence, violations }
  }

  async function trigger(): Promise<RunOutcome> {
    let outcome: RunOutcome
    try {
      outcome = await locks.withLock(LOCK_NAME, (signal, handle) => runLocked(signal, handle.fence), {
        ttlMs: lockTtlMs,
      })
    } catch (err) {
      // Another instance runs it now: this trigger is a duplicate; that run re-arms.
      if (err instanceof LockNotAcquiredError) return { ran: false, reason: 'held' }
      throw err
    }
    // Only the trigger that ran re-arms, so duplicates die out; the watchdog covers a lost one.
    if (outcome.ran) await queue.schedule(RECONCILE_TOKEN, Date.now() + periodMs)
    return outcome
  }

  async function watchdog(): Promise<boolean> {
    const present = await queuedIds(redis, queue, [RECONCILE_TOKEN])
    if (present.has(RECONCILE_TOKEN) || (await locks.holder(LOCK_NAME))) return false
    // Due one period after the last completed run started (now, if that is past or there was none).
    const [last] = await db.query<{ due: Date | null }>(
      `SELECT max(started_at) + $1 * interval '1 millisecond' AS due FROM reconciliation_runs
       WHERE result IN ('ok', 'violations')`,
      [periodMs],
    )
    const due = Math.max(Date.now(), last?.due ? new Date(last.due).getTime() : 0)
    const added = await queue.schedule(RECONCILE_TOKEN, due)
    if (added) log.info({ due: new Date(due).toISOString() }, 'reconciliation: trigger seeded')
    return added
  }

  const watchTick = () => {
    if (watching) return
    watching = watchdog()
      .catch((err) => {
        status.failed(err)
        log.warn({ err }, 'reconciliation: watchdog failed')
      })
      .finally(() => {
        watching = undefined
      })
  }

  return {
    queue,
    token: RECONCILE_TOKEN,
    trigger,
    watchdog,
    async start() {
      if (status.state === 'running') return
      status.state = 'running'
      await queue.start()
      // A throwing trigger (a failed run) is nacked: the queue delivers it again after the backoff.
      consumer = queue.consume(
        async (id) => {
          if (id !== RECONCILE_TOKEN) return
          try {
            await trigger()
          } catch (err) {
            status.failed(err)
            log.warn({ err }, 'reconciliation: run failed, to be retried')
            throw err
          }
        },
        { retryDelayMs: options.retryDelayMs },
      )
      watchTick()
      timer = setInterval(watchTick, watchdogIntervalMs)
      timer.unref()
    },
    stop(stopOptions) {
      clearInterval(timer)
      const stopping = (async () => {
        await consumer?.stop()
        await watching
        await queue.stop()
      })()
      return status.stopWithin(stopping, stopOptions)
    },
    health: () => status.health({}, [queue]),
  }
}
