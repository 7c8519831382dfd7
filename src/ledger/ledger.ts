import { type Database, type Queryable, toSafeInteger } from '../db/database.ts'
import { HttpProblem } from '../errors.ts'
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

export const accountNotFound = (accountId: number) =>
  new HttpProblem(
    404,
    'account-not-found',
    'Account not found',
    `Account ${accountId} does not exist or is not yours.`,
  )

/**
 * Moves money in one transaction: both accounts locked FOR UPDATE in ascending id order (so two
 * opposite transfers cannot deadlock), ownership, currency and funds checked under the lock, then
 * balances, the transfer row and its two ledger entries written in one statement.
 */
export async function executeTransfer(db: Database, input: TransferInput): Promise<Transfer> {
  const { customerId, fromAccountId, toAccountId, amount, currency } = input
  return db.transaction(async (tx) => {
    const rows = await tx.query<AccountRow>(
      'SELECT id, customer_id, currency, balance FROM accounts WHERE id IN ($1, $2) ORDER BY id FOR UPDATE',
      [fromAccountId, toAccountId],
    )
    const from = rows.find((r) => r.id === fromAccountId)
    const to = rows.find((r) => r.id === toAccountId)
    if (!from || from.customer_id !== customerId) throw accountNotFound(fromAccountId)
    if (!to) throw accountNotFound(toAccountId)
    if (from.currency !== currency || to.currency !== currency) {
      throw new HttpProblem(
        422,
        'currency-mismatch',
        'Currency mismatch',
        `The transfer is in ${currency}; account ${fromAccountId} holds ${from.currency} and account ${toAccountId} holds ${to.currency}.`,
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
    const [row] = await tx.query<{ id: unknown; created_at: Date }>(
      `WITH moved AS (
         UPDATE accounts SET balance = balance + CASE WHEN id = $2 THEN -$4::bigint ELSE $4::bigint END
         WHERE id IN ($2, $3) RETURNING id
       ), transfer AS (
         INSERT INTO transfers (customer_id, from_account_id, to_account_id, amount, currency)
         VALUES ($1, $2, $3, $4, $5) RETURNING id, created_at
       ), entries AS (
         INSERT INTO ledger_entries (transfer_id, account_id, amount)
         SELECT transfer.id, e.account_id, e.amount
         FROM transfer, (VALUES ($2::integer, -$4::bigint), ($3::integer, $4::bigint)) AS e (account_id, amount)
       )
       SELECT id, created_at FROM transfer`,
      [customerId, fromAccountId, toAccountId, amount, currency],
    )
    if (!row) throw new Error('transfer insert returned no row')
    return {
      transferId: toSafeInteger(row.id),
      fromAccountId,
      toAccountId,
      amount,
      currency,
      createdAt: new Date(row.created_at).toISOString(),
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
