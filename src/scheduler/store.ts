import { type Database, type Queryable, toSafeInteger } from '../db/database.ts'
import type { ScheduleFailure } from '../ledger/ledger.ts'

export type ScheduleStatus = 'scheduled' | 'running' | 'completed' | 'failed' | 'cancelled'

export interface Schedule {
  scheduleId: number
  status: ScheduleStatus
  runAt: string
  transferId?: number
  failure?: ScheduleFailure
}

export interface NewSchedule {
  customerId: number
  fromAccountId: number
  toAccountId: number
  amount: number
  currency: string
  runAt: Date
}

interface ScheduleRow {
  id: unknown
  status: ScheduleStatus
  run_at: Date
  transfer_id: unknown
  failure: ScheduleFailure | null
}

const COLUMNS = 'id, status, run_at, transfer_id, failure'

export const toSchedule = (row: ScheduleRow): Schedule => ({
  scheduleId: toSafeInteger(row.id),
  status: row.status,
  runAt: new Date(row.run_at).toISOString(),
  ...(row.transfer_id != null ? { transferId: toSafeInteger(row.transfer_id) } : {}),
  ...(row.failure ? { failure: row.failure } : {}),
})

export async function insertSchedule(db: Queryable, input: NewSchedule): Promise<Schedule> {
  const [row] = await db.query<ScheduleRow>(
    `INSERT INTO scheduled_transfers (customer_id, from_account_id, to_account_id, amount, currency, run_at)
     VALUES ($1, $2, $3, $4, $5, $6) RETURNING ${COLUMNS}`,
    [input.customerId, input.fromAccountId, input.toAccountId, input.amount, input.currency, input.runAt],
  )
  return toSchedule(row!)
}

/** The customer's schedules, newest first (at most `limit`). */
export async function listSchedules(db: Queryable, customerId: number, limit = 100): Promise<Schedule[]> {
  const rows = await db.query<ScheduleRow>(
    `SELECT ${COLUMNS} FROM scheduled_transfers WHERE customer_id = $1 ORDER BY id DESC LIMIT $2`,
    [customerId, limit],
  )
  return rows.map(toSchedule)
}

/** Another customer's schedule is reported exactly like a missing one. */
export async function getSchedule(db: Queryable, customerId: number, scheduleId: number) {
  const [row] = await db.query<ScheduleRow>(
    `SELECT ${COLUMNS} FROM scheduled_transfers WHERE id = $1 AND customer_id = $2`,
    [scheduleId, customerId],
  )
  return row ? toSchedule(row) : null
}

/**
 * Cancels a schedule that has not started: one UPDATE, which waits for the row lock of a run in
 * progress and then sees its outcome. `cancelled`, or the schedule as it is (null when missing or
 * another customer's).
 */
export async function cancelSchedule(
  db: Database,
  customerId: number,
  scheduleId: number,
): Promise<'cancelled' | Schedule | null> {
  const [row] = await db.query<{ id: unknown }>(
    `UPDATE scheduled_transfers SET status = 'cancelled', updated_at = now()
     WHERE id = $1 AND customer_id = $2 AND status = 'scheduled' RETURNING id`,
    [scheduleId, customerId],
  )
  if (row) return 'cancelled'
  return getSchedule(db, customerId, scheduleId)
}

/**
 * Marks a due schedule running (counted as an attempt); false when it is finished or cancelled.
 * Committed on its own, so `running` is visible and a cancel from now on answers 409.
 */
export async function markRunning(db: Queryable, scheduleId: number): Promise<boolean> {
  const rows = await db.query(
    `UPDATE scheduled_transfers SET status = 'running', attempts = attempts + 1, updated_at = now()
     WHERE id = $1 AND status IN ('scheduled', 'running') RETURNING id`,
    [scheduleId],
  )
  return rows.length === 1
}

/** Schedules not finished and due before `horizonMs` from now (Postgres clock), earliest first. */
export async function pendingSchedules(db: Queryable, horizonMs: number, limit: number) {
  const rows = await db.query<{ id: unknown; run_at: Date }>(
    `SELECT id, run_at FROM scheduled_transfers
     WHERE status IN ('scheduled', 'running') AND run_at <= now() + $1 * interval '1 millisecond'
     ORDER BY run_at LIMIT $2`,
    [horizonMs, limit],
  )
  return rows.map((r) => ({ id: String(r.id), runAt: new Date(r.run_at) }))
}
