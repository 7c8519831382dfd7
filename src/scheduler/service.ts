import { randomBytes } from 'node:crypto'
import { hostname } from 'node:os'
import type { FastifyInstance } from 'fastify'
import { closeWith } from 'fastify-redis-gateway'
import type { Config } from '../config.ts'
import { invalidateAfterTransfer } from '../ledger/account-cache.ts'
import type { DescribeRefusal } from '../ledger/ledger.ts'
import {
  createReconciliationJob,
  type ReconciliationJob,
  type ReconciliationJobOptions,
} from './reconciliation-job.ts'
import { createTransferWorker, type TransferWorker, type TransferWorkerOptions } from './transfer-worker.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /** The scheduled-transfer worker (always) and the reconciliation job (when the workers run here). */
    scheduler: { worker: TransferWorker; job?: ReconciliationJob }
  }
}

type Tunable<T> = Partial<
  Omit<T, 'redis' | 'db' | 'log' | 'keyPrefix' | 'instanceId' | 'registry' | 'describeRefusal'>
>

/** Timings of the scheduler's workers (defaults in docs/demo/scheduled-transfers.md); tests shorten them. */
export interface SchedulerTuning {
  /** This process's id in the queues and the runs table (default host, pid and a random suffix). */
  instanceId?: string
  transfers?: Tunable<TransferWorkerOptions>
  reconciliation?: Tunable<ReconciliationJobOptions>
}

export interface SchedulerOptions {
  config: Config
  keyPrefix: string
  /** Run the workers (queue consumers, mover, reconciler, the reconciliation job) in this process. */
  run: boolean
  /** How a refused run is recorded on its schedule (src/errors.ts gives it). */
  describeRefusal: DescribeRefusal
  tuning?: SchedulerTuning
}

/**
 * Scheduled transfers as a service: `app.scheduler.worker` always (the routes queue and unqueue
 * schedules through it), the workers when `run` is set: started once the app is ready, stopped on
 * close (items in hand finish, the rest is handed back to the queue for the other instances).
 */
export async function registerScheduler(app: FastifyInstance, options: SchedulerOptions): Promise<void> {
  const { config, keyPrefix, tuning = {} } = options
  const instanceId = tuning.instanceId ?? `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`
  const worker = createTransferWorker({
    redis: app.redis,
    db: app.db,
    log: app.log.child({ component: 'scheduled-transfers' }),
    keyPrefix,
    instanceId,
    outbox: config.events.outbox,
    describeRefusal: options.describeRefusal,
    // Where the workers run: their runs are timed here, and the due count is read at each scrape.
    registry: options.run ? app.metrics?.registry : undefined,
    ...tuning.transfers,
    onRun: async (scheduleId, run) => {
      if (run.status === 'completed')
        await invalidateAfterTransfer(app.cache, run.customerId, run, run.recipientCustomerId)
      await tuning.transfers?.onRun?.(scheduleId, run)
    },
  })
  app.decorate('scheduler', { worker })
  if (!options.run) return

  const job = createReconciliationJob({
    redis: app.redis,
    db: app.db,
    log: app.log.child({ component: 'reconciliation' }),
    keyPrefix,
    instanceId,
    periodMs: config.scheduler.reconciliationPeriodMs,
    registry: app.metrics?.registry,
    ...tuning.reconciliation,
  })
  app.scheduler.job = job
  closeWith(app, worker, { name: 'scheduled transfers', start: true })
  closeWith(app, job, { name: 'reconciliation job', start: true })
}
