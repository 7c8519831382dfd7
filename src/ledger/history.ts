import { type Queryable, toSafeInteger } from '../db/database.ts'

/** One transfer as one account sees it: money out (`debit`) or in (`credit`), and the other side. */
export interface HistoryItem {
  transferId: number
  direction: 'debit' | 'credit'
  amount: number
  currency: string
  counterpartyAccountId: number
  createdAt: string
}

/**
 * A place in an account's history: the (created_at, id) of the last transfer a page held. The time
 * is kept as Postgres wrote it, to the microsecond (a JavaScript Date would cut it to milliseconds
 * and could land between two transfers of one millisecond), as RFC 3339 text in UTC.
 */
export interface HistoryPosition {
  createdAt: string
  transferId: number
}

export interface HistoryPage {
  items: HistoryItem[]
  /** Where the next page starts; null when this page holds the account's oldest transfer. */
  next: HistoryPosition | null
}

interface HistoryRow {
  id: unknown
  from_account_id: number
  to_account_id: number
  amount: unknown
  currency: string
  created_at: Date
  position_at: string
}

/** Exact, in UTC, parsed back by `::timestamptz` to the same instant. */
const POSITION_AT = `to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS position_at`
const COLUMNS = `id, from_account_id, to_account_id, amount, currency, created_at, ${POSITION_AT}`

/**
 * The page query: one index scan per side of the transfer (transfers_from_account_history and
 * transfers_to_account_history, migration 005), each starting right after `after` and stopping after
 * `$2` rows, merged in (created_at, id) order. No transfer is on both sides of itself (a CHECK), so
 * UNION ALL repeats none. The cost is one page's rows whatever the depth; OFFSET would read and drop
 * every row before the page.
 */
export function historyQuery(after: boolean): string {
  const since = after ? ' AND (created_at, id) < ($3::timestamptz, $4::bigint)' : ''
  const side = (column: string) =>
    `(SELECT ${COLUMNS} FROM transfers WHERE ${column} = $1${since}
      ORDER BY created_at DESC, id DESC LIMIT $2)`
  return `SELECT * FROM (${side('from_account_id')} UNION ALL ${side('to_account_id')}) page
    ORDER BY created_at DESC, id DESC LIMIT $2`
}

/**
 * Up to `limit` transfers of an account, newest first, strictly older than `after` (from the newest
 * without it). The caller has checked that the account is the customer's. Each page starts strictly
 * after the last transfer of the one before, by value, not by count: transfers committed in between
 * cannot push a row already seen onto the next page, nor one not yet seen past it.
 */
export async function listTransactions(
  db: Queryable,
  accountId: number,
  limit: number,
  after?: HistoryPosition,
): Promise<HistoryPage> {
  // One row more than the page tells whether another page follows, without a count.
  const params: unknown[] = [accountId, limit + 1]
  if (after) params.push(after.createdAt, after.transferId)
  const rows = await db.query<HistoryRow>(historyQuery(Boolean(after)), params)
  const page = rows.slice(0, limit)
  const last = page.at(-1)
  return {
    items: page.map((row) => toItem(row, accountId)),
    next:
      rows.length > limit && last
        ? { createdAt: last.position_at, transferId: toSafeInteger(last.id) }
        : null,
  }
}

function toItem(row: HistoryRow, accountId: number): HistoryItem {
  const debit = row.from_account_id === accountId
  return {
    transferId: toSafeInteger(row.id),
    direction: debit ? 'debit' : 'credit',
    amount: toSafeInteger(row.amount),
    currency: row.currency,
    counterpartyAccountId: debit ? row.to_account_id : row.from_account_id,
    createdAt: new Date(row.created_at).toISOString(),
  }
}
