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

/** The Idempotency-Key of a schedule and its request fingerprint, kept on the schedule row. */
export interface ScheduleIdempotency {
  key: string
  fingerprint: string
}

/** The 201 body of `POST /scheduled-transfers`, kept on the row for replays. */
export interface ScheduleCreated {
  scheduleId: number
  status: 'scheduled'
  runAt: string
}

/** A schedule made with the key earlier: its fingerprint and its kept response. */
export interface PreviousSchedule {
  fingerprint: string
  response: ScheduleCreated
}

export type CreateScheduleResult =
  | { created: ScheduleCreated }
  | { previous: PreviousSchedule }
  | { pendingLimit: { pending: number; earliestDueInMs: number } }

/** The schedule this customer already made with this key, or null. */
export async function findScheduleByKey(
  db: Queryable,
  customerId: number,
  key: string,
): Promise<PreviousSchedule | null> {
  const [row] = await db.query<{ request_fingerprint: string; response: ScheduleCreated }>(
    'SELECT request_fingerprint, response FROM scheduled_transfers WHERE customer_id = $1 AND idempotency_key = $2',
    [customerId, key],
  )
  return row ? { fingerprint: row.request_fingerprint, response: row.response } : null
}

/**
 * Inserts a schedule unless the customer already has `maxPending` unfinished ones, or already made
 * one with this key. The customer's row is locked first (FOR NO KEY UPDATE, which foreign-key
 * checks of transfers do not wait for), so a customer's creations run one at a time, then its two
 * accounts (KEY SHARE, in id order); the count and
 * the key lookup are the next statement, whose snapshot is taken after the lock and so sees every
 * schedule committed before it. The 201 body is built in the INSERT (its id drawn first) and kept.
 */
export async function createSchedule(
  db: Database,
  input: NewSchedule,
  idempotency: ScheduleIdempotency | undefined,
  maxPending: number,
): Promise<CreateScheduleResult> {
  return db.transaction(async (tx) => {
    await tx.query('SELECT 1 FROM customers WHERE id = $1 FOR NO KEY UPDATE', [input.customerId])
    // The insert's foreign-key checks take KEY SHARE on its two accounts, source first, while a
    // transfer takes them FOR UPDATE in ascending id order: taken here in that order, as the
    // transfer does, a schedule and a transfer between the same accounts cannot deadlock.
    await tx.query(
      'SELECT 1 FROM accounts WHERE id IN ($1::integer, $2::integer) ORDER BY id FOR KEY SHARE',
      [input.fromAccountId, input.toAccountId],
    )
    const [row] = await tx.query<{
      request_fingerprint: string | null
      response: ScheduleCreated | null
      pending: number
      earliest_due_in_ms: number | null
      id: unknown
      run_at: Date | null
    }>(
      `WITH previous AS MATERIALIZED (
         SELECT request_fingerprint, response FROM scheduled_transfers WHERE customer_id = $1 AND idempotency_key = $7::text
       ), pending AS MATERIALIZED (
         SELECT count(*)::int AS pending,
           ceil(extract(epoch FROM min(run_at) - now()) * 1000)::float8 AS earliest_due_in_ms
         FROM scheduled_transfers WHERE customer_id = $1 AND status IN ('scheduled', 'running')
       ), next AS MATERIALIZED (
         SELECT nextval(pg_get_serial_sequence('scheduled_transfers', 'id')) AS id
         FROM pending WHERE pending < $9 AND NOT EXISTS (SELECT 1 FROM previous)
       ), created AS (
         INSERT INTO scheduled_transfers (id, customer_id, from_account_id, to_account_id, amount, currency,
                                          run_at, idempotency_key, request_fingerprint, response)
         OVERRIDING SYSTEM VALUE
         SELECT next.id, $1, $2, $3, $4, $5, $6, $7::text, $8::text,
           CASE WHEN $7::text IS NOT NULL THEN jsonb_build_object('scheduleId', next.id, 'status', 'scheduled',
             'runAt', to_char($6::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')) END
         FROM next RETURNING id, run_at
       )
       SELECT previous.request_fingerprint, previous.response, pending.pending, pending.earliest_due_in_ms,
         created.id, created.run_at
       FROM pending LEFT JOIN previous ON true LEFT JOIN created ON true`,
      [
        input.customerId,
        input.fromAccountId,
        input.toAccountId,
        input.amount,
        input.currency,
        input.runAt,
        idempotency?.key ?? null,
        idempotency?.fingerprint ?? null,
        maxPending,
      ],
    )
    if (!row) throw new Error('the schedule statement returned no row')
    if (row.request_fingerprint !== null && row.response !== null)
      return { previous: { fingerprint: row.request_fingerprint, response: row.response } }
    if (row.run_at)
      return {
        created: {
          scheduleId: toSafeInteger(row.id),
          status: 'scheduled',
          runAt: new Date(row.run_at).toISOString(),
        },
      }
    return {
      pendingLimit: { pending: row.pending, earliestDueInMs: Math.max(0, row.earliest_due_in_ms ?? 0) },
    }
  })
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

/** A delivery before the schedule's runAt: nothing was done; it is due in `dueInMs`. */
export interface NotDue {
  status: 'not-due'
  dueInMs: number
}

/** A schedule marked running: how long after its runAt, by Postgres's clock (0 or more). */
export interface Running {
  status: 'running'
  lateSeconds: number
}

/**
 * Marks a schedule running (counted as an attempt) once it is due by Postgres's clock: `running`
 * with how late it is, `finished` when it is finished or cancelled, or how long until it is due (a
 * delivery that came early, by the Redis clock or a producer's). Committed on its own, so
 * `running` is visible and a cancel from now on answers 409.
 */
export async function markRunning(db: Queryable, scheduleId: number): Promise<Running | 'finished' | NotDue> {
  const [row] = await db.query<{ late_s: number | null; due_in_ms: number | null }>(
    `WITH marked AS (
       UPDATE scheduled_transfers SET status = 'running', attempts = attempts + 1, updated_at = now()
       WHERE id = $1 AND status IN ('scheduled', 'running') AND run_at <= now()
       RETURNING extract(epoch FROM now() - run_at)::float8 AS late_s
     )
     SELECT (SELECT late_s FROM marked) AS late_s,
       (SELECT ceil(extract(epoch FROM run_at - now()) * 1000)::float8 FROM scheduled_transfers
        WHERE id = $1 AND status IN ('scheduled', 'running') AND run_at > now()) AS due_in_ms`,
    [scheduleId],
  )
  if (row?.late_s != null) return { status: 'running', lateSeconds: Math.max(0, row.late_s) }
  if (row?.due_in_ms != null) return { status: 'not-due', dueInMs: row.due_in_ms }
  return 'finished'
}

/** Schedules not finished and past their runAt (Postgres clock): the partial index's due range. */
export async function dueCount(db: Queryable): Promise<number> {
  const [row] = await db.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM scheduled_transfers
     WHERE status IN ('scheduled', 'running') AND run_at <= now()`,
  )
  return row?.n ?? 0
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
