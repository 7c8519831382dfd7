import { type Database, type Queryable, toSafeInteger } from '../db/database.ts'
import { HttpProblem } from '../errors.ts'
import { idempotencyKeyMismatch } from '../index.ts'
import { hashPassword } from './passwords.ts'

export interface Account {
  accountId: number
  currency: string
  balance: number
}

export interface TransferInput {
  customerId: number
  fromAccountId: number
  toAccountId: number
  amount: number
  currency: string
}

export interface Transfer {
  transferId: number
  fromAccountId: number
  toAccountId: number
  amount: number
  currency: string
  createdAt: string
}

/** `outbox` (default true): the transfer's statement also writes its `transfer.completed` outbox event. */
export interface TransferOptions {
  outbox?: boolean
}

/** The Idempotency-Key of a transfer and its request fingerprint, kept on the transfer row. */
export interface TransferIdempotency {
  key: string
  fingerprint: string
}

/**
 * `replayed` is set when the key's transfer already existed and nothing was moved now;
 * `recipientCustomerId` (read under the lock, so no extra query) when money moved now.
 */
export type TransferResult = Transfer & { replayed?: true; recipientCustomerId?: number }

interface AccountRow {
  id: number
  customer_id: number
  currency: string
  balance: unknown
}

const toAccount = (row: AccountRow): Account => ({
  accountId: row.id,
  currency: row.currency,
  balance: toSafeInteger(row.balance),
})

export async function findCustomerByUsername(db: Queryable, username: string) {
  const [row] = await db.query<{ id: number; password_hash: string }>(
    'SELECT id, password_hash FROM customers WHERE username = $1',
    [username],
  )
  return row
}

export async function listAccounts(db: Queryable, customerId: number): Promise<Account[]> {
  const rows = await db.query<AccountRow>(
    'SELECT id, customer_id, currency, balance FROM accounts WHERE customer_id = $1 ORDER BY id',
    [customerId],
  )
  return rows.map(toAccount)
}

/** Another customer's account is reported exactly like a missing one, so ids cannot be probed. */
export async function getOwnAccount(
  db: Queryable,
  customerId: number,
  accountId: number,
): Promise<Account | null> {
  const [row] = await db.query<AccountRow>(
    'SELECT id, customer_id, currency, balance FROM accounts WHERE id = $1 AND customer_id = $2',
    [accountId, customerId],
  )
  return row ? toAccount(row) : null
}

export interface OwnedAccount extends Account {
  customerId: number
}

/** Any account with its owner: for caches shared by all customers, which check ownership on use. */
export async function getAccountWithOwner(db: Queryable, accountId: number): Promise<OwnedAccount | null> {
  const [row] = await db.query<AccountRow>(
    'SELECT id, customer_id, currency, balance FROM accounts WHERE id = $1',
    [accountId],
  )
  return row ? { ...toAccount(row), customerId: row.customer_id } : null
}

export const sameAccount = () =>
  new HttpProblem(400, 'same-account', 'Same account', 'fromAccountId and toAccountId must differ.')

export const accountNotFound = (accountId: number) =>
  new HttpProblem(
    404,
    'account-not-found',
    'Account not found',
    `Account ${accountId} does not exist or is not yours.`,
  )

interface PreviousTransfer {
  request_fingerprint: string
  response: Transfer
  recipient_customer_id: number
}

/** The transfer a customer ($customer) already made with a key ($key), as one jsonb value or null. */
const previousTransfer = (customer: string, key: string) =>
  `(SELECT jsonb_build_object('request_fingerprint', t.request_fingerprint, 'response', t.response,
     'recipient_customer_id', (SELECT a.customer_id FROM accounts a WHERE a.id = t.to_account_id))
   FROM transfers t WHERE t.customer_id = ${customer} AND t.idempotency_key = ${key})`

/**
 * A transfer already made with this key: same request replays its response, another is refused.
 * The recipient comes along so a replay invalidates both customers' cached accounts, as the first
 * response did (or would have, had the process survived its commit).
 */
function replayPrevious(previous: PreviousTransfer, idempotency: TransferIdempotency): TransferResult {
  if (previous.request_fingerprint !== idempotency.fingerprint) throw idempotencyKeyMismatch()
  return { ...previous.response, replayed: true, recipientCustomerId: previous.recipient_customer_id }
}

/**
 * Moves money in one transaction: both accounts locked FOR UPDATE in ascending id order (so two
 * opposite transfers cannot deadlock), ownership, currency and funds checked under the lock, then
 * balances, the transfer row, its two ledger entries and its outbox event written in one statement.
 *
 * With `idempotency`, the row also records the key, fingerprint and response, unique per customer
 * and key: the final guard when Redis lost its record. A transfer already made with the key is
 * found by the locking statement itself; two requests racing past that check collide on the unique
 * constraint, and the loser rolls back and answers from the winner's row.
 */
export async function executeTransfer(
  db: Database,
  input: TransferInput,
  idempotency?: TransferIdempotency,
  { outbox = true }: TransferOptions = {},
): Promise<TransferResult> {
  try {
    return await moveMoney(db, input, idempotency, outbox)
  } catch (err) {
    if (!idempotency || (err as { code?: string }).code !== '23505') throw err
    const previous = await findPrevious(db, input.customerId, idempotency.key)
    if (!previous) throw err
    return replayPrevious(previous, idempotency)
  }
}

async function findPrevious(
  db: Queryable,
  customerId: number,
  key: string,
): Promise<PreviousTransfer | null> {
  const [row] = await db.query<{ previous: PreviousTransfer | null }>(
    `SELECT ${previousTransfer('$1', '$2')} AS previous`,
    [customerId, key],
  )
  return row?.previous ?? null
}

async function moveMoney(
  db: Pick<Database, 'transaction'>,
  input: TransferInput,
  idempotency: TransferIdempotency | undefined,
  outbox: boolean,
): Promise<TransferResult> {
  const { customerId, fromAccountId, toAccountId, amount, currency } = input
  return db.transaction(async (tx) => {
    const rows = await tx.query<AccountRow & { previous: PreviousTransfer | null }>(
      `SELECT id, customer_id, currency, balance, ${previousTransfer('$3', '$4')} AS previous
       FROM accounts WHERE id IN ($1, $2) ORDER BY id FOR UPDATE`,
      [fromAccountId, toAccountId, customerId, idempotency?.key ?? null],
    )
    // Postgres answers for a key it holds before anything else is said about this request: a reused
    // key with a bad body (same account, unknown accounts) is a mismatch, never a new stored error
    // that would stand in for the original transfer's replay. Missing accounts cost one more lookup.
    if (idempotency) {
      const previous =
        rows.length > 0 ? rows[0]!.previous : await findPrevious(tx, customerId, idempotency.key)
      if (previous) return replayPrevious(previous, idempotency)
    }
    if (fromAccountId === toAccountId) throw sameAccount()
    const from = rows.find((r) => r.id === fromAccountId)
    const to = rows.find((r) => r.id === toAccountId)
    if (!from || from.customer_id !== customerId) throw accountNotFound(fromAccountId)
    if (!to) throw accountNotFound(toAccountId)
    if (from.currency !== currency) {
      throw new HttpProblem(
        422,
        'currency-mismatch',
        'Currency mismatch',
        `The transfer is in ${currency}; account ${fromAccountId} holds ${from.currency}.`,
      )
    }
    // The recipient may be another customer: its currency is not ours to disclose.
    if (to.currency !== currency) {
      throw new HttpProblem(
        422,
        'currency-mismatch',
        'Currency mismatch',
        `The transfer is in ${currency}; account ${toAccountId} cannot receive it.`,
      )
    }
    if (toSafeInteger(from.balance) < amount) {
      throw new HttpProblem(
        422,
        'insufficient-funds',
        'Insufficient funds',
        `Account ${fromAccountId} does not hold ${amount} ${currency}.`,
      )
    }
    // The id is drawn first and created_at cut to milliseconds so the stored response can be built
    // in the same statement (no second round trip while the account locks are held) and equals the
    // response sent now, byte for byte once serialized.
    const [row] = await tx.query<{ id: unknown; created_at: Date }>(
      `WITH moved AS (
         UPDATE accounts SET balance = balance + CASE WHEN id = $2 THEN -$4::bigint ELSE $4::bigint END
         WHERE id IN ($2, $3) RETURNING id
       ), next AS (
         SELECT nextval(pg_get_serial_sequence('transfers', 'id')) AS id, date_trunc('milliseconds', now()) AS at
       ), transfer AS (
         INSERT INTO transfers (id, customer_id, from_account_id, to_account_id, amount, currency, created_at,
                                idempotency_key, request_fingerprint, response)
         OVERRIDING SYSTEM VALUE
         SELECT next.id, $1, $2, $3, $4, $5::text, next.at, $6::text, $7::text,
           CASE WHEN $6::text IS NOT NULL THEN jsonb_build_object(
             'transferId', next.id, 'fromAccountId', $2::integer, 'toAccountId', $3::integer,
             'amount', $4::bigint, 'currency', $5::text,
             'createdAt', to_char(next.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')) END
         FROM next RETURNING id, created_at
       ), entries AS (
         INSERT INTO ledger_entries (transfer_id, account_id, amount)
         SELECT transfer.id, e.account_id, e.amount
         FROM transfer, (VALUES ($2::integer, -$4::bigint), ($3::integer, $4::bigint)) AS e (account_id, amount)
       ), event AS (
         INSERT INTO outbox_events (type, transfer_id, from_customer_id, to_customer_id, from_account_id,
                                    to_account_id, amount, currency, occurred_at)
         SELECT 'transfer.completed', transfer.id, $1, $8::integer, $2, $3, $4, $5::text, transfer.created_at
         FROM transfer WHERE $9::boolean
       )
       SELECT id, created_at FROM transfer`,
      [
        customerId,
        fromAccountId,
        toAccountId,
        amount,
        currency,
        idempotency?.key ?? null,
        idempotency?.fingerprint ?? null,
        to.customer_id,
        outbox,
      ],
    )
    if (!row) throw new Error('transfer insert returned no row')
    return {
      transferId: toSafeInteger(row.id),
      fromAccountId,
      toAccountId,
      amount,
      currency,
      createdAt: new Date(row.created_at).toISOString(),
      recipientCustomerId: to.customer_id,
    }
  })
}

/** How one run of a scheduled transfer ended; `skipped` when it had already finished or was cancelled. */
export type ScheduledRun =
  | {
      status: 'completed'
      transferId: number
      customerId: number
      fromAccountId: number
      toAccountId: number
      recipientCustomerId?: number
    }
  | { status: 'failed'; failure: ScheduleFailure }
  | { status: 'skipped'; current: string | null }

/** Why a scheduled transfer failed: the problem its run met. */
export interface ScheduleFailure {
  type: string
  title: string
  detail: string
}

/**
 * Runs a scheduled transfer, bound to its schedule: the schedule row is locked FOR UPDATE and its
 * status checked in the transaction that moves the money (the same one as `executeTransfer`), and
 * set to completed (with the transfer id) or failed in it. A second run of one schedule, or a cancel
 * that won the row lock, finds it finished and moves nothing. Refusals of the transfer (insufficient
 * funds, a currency or account that no longer fits) end it as failed; anything else (Postgres down,
 * a serialization failure) rolls back and is thrown, for the caller to retry.
 */
export async function executeScheduledTransfer(
  db: Database,
  scheduleId: number,
  { outbox = true }: TransferOptions = {},
): Promise<ScheduledRun> {
  return db.transaction(async (tx) => {
    const [schedule] = await tx.query<{
      customer_id: number
      from_account_id: number
      to_account_id: number
      amount: unknown
      currency: string
      status: string
    }>(
      `SELECT customer_id, from_account_id, to_account_id, amount, currency, status
       FROM scheduled_transfers WHERE id = $1 FOR UPDATE`,
      [scheduleId],
    )
    if (!schedule || (schedule.status !== 'scheduled' && schedule.status !== 'running'))
      return { status: 'skipped', current: schedule?.status ?? null }
    const input = {
      customerId: schedule.customer_id,
      fromAccountId: schedule.from_account_id,
      toAccountId: schedule.to_account_id,
      amount: toSafeInteger(schedule.amount),
      currency: schedule.currency,
    }
    let transfer: TransferResult
    try {
      // Inside this transaction: the money moves with the schedule row locked.
      transfer = await moveMoney({ transaction: (fn) => fn(tx) }, input, undefined, outbox)
    } catch (err) {
      if (!(err instanceof HttpProblem) || err.status >= 500) throw err
      const failure = { type: err.type, title: err.title, detail: err.message }
      await tx.query(
        `UPDATE scheduled_transfers SET status = 'failed', failure = $2, updated_at = now() WHERE id = $1`,
        [scheduleId, JSON.stringify(failure)],
      )
      return { status: 'failed', failure }
    }
    await tx.query(
      `UPDATE scheduled_transfers SET status = 'completed', transfer_id = $2, updated_at = now() WHERE id = $1`,
      [scheduleId, transfer.transferId],
    )
    return {
      status: 'completed',
      transferId: transfer.transferId,
      customerId: input.customerId,
      fromAccountId: input.fromAccountId,
      toAccountId: input.toAccountId,
      recipientCustomerId: transfer.recipientCustomerId,
    }
  })
}

export const DEMO_PASSWORD = 'demo-password'
export const DEMO_OPENING_BALANCE = 100_000_000

/** Creates alice and bob with one VND account each, once; later starts leave them as they are. */
export async function seedDemo(db: Database): Promise<void> {
  for (const username of ['alice', 'bob']) {
    const existing = await findCustomerByUsername(db, username)
    if (existing) continue
    const hash = await hashPassword(DEMO_PASSWORD)
    await db.transaction(async (tx) => {
      const [customer] = await tx.query<{ id: number }>(
        'INSERT INTO customers (username, password_hash) VALUES ($1, $2) ON CONFLICT (username) DO NOTHING RETURNING id',
        [username, hash],
      )
      if (!customer) return
      await tx.query(
        "INSERT INTO accounts (customer_id, currency, balance, opening_balance) VALUES ($1, 'VND', $2, $2)",
        [customer.id, DEMO_OPENING_BALANCE],
      )
    })
  }
}
