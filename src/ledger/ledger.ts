import { idempotencyKeyMismatch } from 'fastify-redis-gateway'
import { type Database, type Queryable, toSafeInteger } from '../db/database.ts'
import { type DomainError, isRefusal } from '../domain-error.ts'
import { type RefusedVerdict, refusalOf } from './refusals.ts'

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
 * What the transfer statement decided, in the order the checks are made: the first that applies
 * wins. Only `ok` wrote anything.
 */
export type TransferVerdict = 'ok' | 'replay' | RefusedVerdict

/** The parameters of TRANSFER_SQL in order ($1, $2, ...), named for scripts that run it (pgbench). */
export const TRANSFER_PARAMETERS = [
  'customer_id',
  'from_account_id',
  'to_account_id',
  'amount',
  'currency',
  'idempotency_key',
  'request_fingerprint',
  'outbox',
] as const

/**
 * A whole transfer in one statement, sent on its own (autocommit): one round trip to Postgres,
 * during which the account locks are taken and released at the commit, with nothing in between
 * that waits on the network.
 *
 * - `locked` takes both accounts FOR UPDATE in ascending id order, so two opposite transfers
 *   cannot deadlock. It is MATERIALIZED (and referenced three times, which alone keeps Postgres
 *   from inlining it): its LockRows runs once, in its own plan node, and rows leave it in id order.
 * - `previous` is the transfer this customer already made with this key (null without a key).
 * - `verdict` checks, in this order: replay (a reused key is answered for before anything else is
 *   said about the request, so a reused key with a bad body is a mismatch, never a new error
 *   standing in for the original's replay), same account, source missing or not the caller's,
 *   destination missing, currency of the source then of the destination, funds. It reads both
 *   locked rows, so every write below waits until both locks are held.
 * - `event` is the outbox row, with the transfer's id as its event id, and `has_event` on the
 *   transfer row says it exists: a refill of the event stream rebuilds lost events from transfers.
 * - `moved`, `transfer`, `entries` and `event` write only when the verdict is `ok`. The UPDATE
 *   joins `locked` and `verdict`: no row is written before the verdict exists, hence before both
 *   locks are held.
 *
 * Why the funds check is sound under READ COMMITTED: a statement reads with the snapshot taken
 * when it started, but a row locked FOR UPDATE is the latest committed version (when the lock had
 * to wait for another transfer, Postgres re-reads the row once that one committed), so `verdict`
 * sees the balance as it is now, and no one can change it until this statement commits. The
 * UPDATE finds its row through the older snapshot, sees it was updated since, and applies
 * `balance + delta` to the latest version: the one `verdict` checked. The CHECK (balance >= 0) of
 * the table stays the last guard. `previous` reads with the snapshot as well: a transfer with the
 * same key committed while this one waited is not seen, and the unique (customer_id,
 * idempotency_key) refuses the second insert (23505), the statement rolls back whole.
 *
 * The id is drawn first and created_at cut to milliseconds, so the stored response is built in
 * the same statement and equals the response sent now, byte for byte once serialized. The colons
 * of its time format are quoted (`":"`): pgbench reads `:name` as a variable even inside a string.
 *
 * It is sent as a prepared statement (`transfer`, once per connection): planning it costs Postgres
 * more than running it (about 0.4 ms against 0.1-0.2 ms), and a prepared one is planned once per
 * connection. Its generic plan reads the two accounts by an index scan on the primary key, in id
 * order, so the locks are still taken in ascending order.
 */
export const TRANSFER_SQL = `WITH locked AS MATERIALIZED (
  SELECT id, customer_id, currency, balance FROM accounts
  WHERE id IN ($2::integer, $3::integer) ORDER BY id FOR UPDATE
), previous AS MATERIALIZED (
  SELECT ${previousTransfer('$1::integer', '$6::text')} AS previous
), verdict AS MATERIALIZED (
  SELECT CASE
      WHEN p.previous IS NOT NULL THEN 'replay'
      WHEN $2::integer = $3::integer THEN 'same-account'
      WHEN f.id IS NULL OR f.customer_id <> $1::integer THEN 'from-not-found'
      WHEN r.id IS NULL THEN 'to-not-found'
      WHEN f.currency::text <> $5::text THEN 'currency-from'
      WHEN r.currency::text <> $5::text THEN 'currency-to'
      WHEN f.balance < $4::bigint THEN 'insufficient'
      ELSE 'ok'
    END AS verdict,
    f.currency::text AS from_currency, r.customer_id AS recipient_customer_id, p.previous
  FROM previous p
    LEFT JOIN locked f ON f.id = $2::integer
    LEFT JOIN locked r ON r.id = $3::integer
), moved AS (
  UPDATE accounts a SET balance = a.balance + CASE WHEN a.id = $2::integer THEN -$4::bigint ELSE $4::bigint END
  FROM locked l, verdict v WHERE a.id = l.id AND v.verdict = 'ok'
  RETURNING a.id
), next AS MATERIALIZED (
  SELECT nextval(pg_get_serial_sequence('transfers', 'id')) AS id, date_trunc('milliseconds', now()) AS at
  FROM verdict WHERE verdict = 'ok'
), transfer AS (
  INSERT INTO transfers (id, customer_id, from_account_id, to_account_id, amount, currency, created_at,
                         idempotency_key, request_fingerprint, has_event, response)
  OVERRIDING SYSTEM VALUE
  SELECT next.id, $1::integer, $2::integer, $3::integer, $4::bigint, $5::text, next.at, $6::text, $7::text,
    $8::boolean,
    CASE WHEN $6::text IS NOT NULL THEN jsonb_build_object(
      'transferId', next.id, 'fromAccountId', $2::integer, 'toAccountId', $3::integer,
      'amount', $4::bigint, 'currency', $5::text,
      'createdAt', to_char(next.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.MS"Z"')) END
  FROM next RETURNING id, created_at
), entries AS (
  INSERT INTO ledger_entries (transfer_id, account_id, amount)
  SELECT transfer.id, e.account_id, e.amount
  FROM transfer, (VALUES ($2::integer, -$4::bigint), ($3::integer, $4::bigint)) AS e (account_id, amount)
), event AS (
  INSERT INTO outbox_events (id, type, transfer_id, from_customer_id, to_customer_id, from_account_id,
                             to_account_id, amount, currency, occurred_at)
  SELECT transfer.id, 'transfer.completed', transfer.id, $1::integer, v.recipient_customer_id, $2::integer, $3::integer,
    $4::bigint, $5::text, transfer.created_at
  FROM transfer, verdict v WHERE $8::boolean
)
SELECT v.verdict, v.from_currency, v.recipient_customer_id, v.previous, transfer.id, transfer.created_at
FROM verdict v LEFT JOIN transfer ON true`

/** TRANSFER_SQL's parameters for one transfer, in the order of TRANSFER_PARAMETERS. */
export const transferParameters = (
  { customerId, fromAccountId, toAccountId, amount, currency }: TransferInput,
  idempotency: TransferIdempotency | undefined,
  outbox: boolean,
) => [
  customerId,
  fromAccountId,
  toAccountId,
  amount,
  currency,
  idempotency?.key ?? null,
  idempotency?.fingerprint ?? null,
  outbox,
]

interface TransferRow {
  verdict: TransferVerdict
  from_currency: string | null
  recipient_customer_id: number | null
  previous: PreviousTransfer | null
  id: unknown
  created_at: Date | string | null
}

/**
 * A transfer already made with this key: same request replays its response, another is refused
 * with the idempotency plugin's own mismatch error (not a DomainError): the plugin recognizes it and
 * releases the key. The recipient comes along so a replay invalidates both customers' cached
 * accounts, as the first response did (or would have, had the process survived its commit).
 */
function replayPrevious(previous: PreviousTransfer, idempotency: TransferIdempotency): TransferResult {
  if (previous.request_fingerprint !== idempotency.fingerprint) throw idempotencyKeyMismatch()
  return { ...previous.response, replayed: true, recipientCustomerId: previous.recipient_customer_id }
}

/**
 * Moves money in one statement (TRANSFER_SQL): on its own it is its own transaction, one round
 * trip; inside a transaction (a scheduled run) it is one statement of it. Refusals are thrown as
 * DomainErrors (src/ledger/refusals.ts).
 */
async function moveMoney(
  db: Queryable,
  input: TransferInput,
  idempotency: TransferIdempotency | undefined,
  outbox: boolean,
): Promise<TransferResult> {
  const [row] = await db.query<TransferRow>(TRANSFER_SQL, transferParameters(input, idempotency, outbox), {
    prepare: 'transfer',
  })
  if (!row) throw new Error('the transfer statement returned no row')
  if (row.verdict === 'replay') {
    if (!idempotency) throw new Error('the transfer statement replayed a transfer sent without a key')
    return replayPrevious(row.previous!, idempotency)
  }
  if (row.verdict !== 'ok') throw refusalOf(row.verdict, input, row.from_currency)
  if (row.id === null || row.created_at === null) throw new Error('transfer insert returned no row')
  return {
    transferId: toSafeInteger(row.id),
    fromAccountId: input.fromAccountId,
    toAccountId: input.toAccountId,
    amount: input.amount,
    currency: input.currency,
    createdAt: new Date(row.created_at).toISOString(),
    recipientCustomerId: row.recipient_customer_id!,
  }
}

/**
 * Moves money in one Postgres round trip: one statement, sent on its own, locks both accounts in
 * ascending id order (so two opposite transfers cannot deadlock), checks ownership, currency and
 * funds under the lock, and writes balances, the transfer row, its two ledger entries and its
 * outbox event, or nothing (see TRANSFER_SQL).
 *
 * With `idempotency`, the row also records the key, fingerprint and response, unique per customer
 * and key: the final guard when Redis lost its record. A transfer already made with the key is
 * found by the statement itself; two requests racing past that check collide on the unique
 * constraint, the loser's statement rolls back, and it answers from the winner's row (a second
 * round trip, on that race only).
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

/** How a refused run is recorded on its schedule: as the problem the HTTP layer answers for it. */
export type DescribeRefusal = (refusal: DomainError) => ScheduleFailure

export interface ScheduledTransferOptions extends TransferOptions {
  /** Without it a refusal is thrown, like any other error. */
  describeRefusal?: DescribeRefusal
}

/**
 * Runs a scheduled transfer, bound to its schedule: the schedule row is locked FOR UPDATE and its
 * status checked in the transaction that moves the money (with the statement of `executeTransfer`,
 * here one of three), and set to completed (with the transfer id) or failed in it. A second run of
 * one schedule, or a cancel that won the row lock, finds it finished and moves nothing. Refusals of
 * the transfer (insufficient funds, a currency or account that no longer fits) end it as failed;
 * anything else (Postgres down, a serialization failure) rolls back and is thrown, for the caller
 * to retry.
 */
export async function executeScheduledTransfer(
  db: Database,
  scheduleId: number,
  { outbox = true, describeRefusal }: ScheduledTransferOptions = {},
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
      transfer = await moveMoney(tx, input, undefined, outbox)
    } catch (err) {
      if (!isRefusal(err) || !describeRefusal) throw err
      const failure = describeRefusal(err)
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
