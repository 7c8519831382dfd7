import type { FeedItem, FeedSource } from 'fastify-redis-gateway'
import { maskUsername } from '../campaigns/leaderboard.ts'
import type { Queryable } from '../db/database.ts'

// Public accounts in Postgres: the accounts with a public name, who follows them, and their
// movements as feed items. Postgres is the truth; the feed in Redis is derived from it.

export interface PublicAccount {
  accountId: number
  name: string
  currency: string
  /** Whether the caller follows it. */
  following: boolean
}

/** A public account's movement as a feed item: one per transfer and public account it touched. */
export const feedItemId = (transferId: number, accountId: number) => `${transferId}:${accountId}`

const parseItemId = (id: string) => {
  const [transferId, accountId] = id.split(':').map(Number) as [number, number]
  return { transferId, accountId }
}

export async function listPublicAccounts(db: Queryable, customerId: number): Promise<PublicAccount[]> {
  return db.query<PublicAccount>(
    `SELECT a.id AS "accountId", a.public_name AS name, a.currency::text AS currency,
            EXISTS (SELECT 1 FROM follows f WHERE f.customer_id = $1 AND f.account_id = a.id) AS following
     FROM accounts a WHERE a.public_name IS NOT NULL ORDER BY a.id LIMIT 100`,
    [customerId],
  )
}

export async function isPublicAccount(db: Queryable, accountId: number): Promise<boolean> {
  const rows = await db.query('SELECT 1 FROM accounts WHERE id = $1 AND public_name IS NOT NULL', [accountId])
  return rows.length === 1
}

/** The public accounts among these ids. */
export async function publicAmong(db: Queryable, accountIds: readonly number[]): Promise<Set<number>> {
  const rows = await db.query<{ id: number }>(
    'SELECT id FROM accounts WHERE id = ANY ($1::integer[]) AND public_name IS NOT NULL',
    [accountIds],
  )
  return new Set(rows.map((row) => row.id))
}

export async function follow(db: Queryable, customerId: number, accountId: number): Promise<void> {
  await db.query('INSERT INTO follows (customer_id, account_id) VALUES ($1, $2) ON CONFLICT DO NOTHING', [
    customerId,
    accountId,
  ])
}

export async function unfollow(db: Queryable, customerId: number, accountId: number): Promise<void> {
  await db.query('DELETE FROM follows WHERE customer_id = $1 AND account_id = $2', [customerId, accountId])
}

/** What the feed reads from Postgres when Redis lacks a feed, a timeline or a follower count. */
export function feedSource(db: Queryable): FeedSource {
  return {
    async followingOf(reader) {
      const rows = await db.query<{ account_id: number }>(
        'SELECT account_id FROM follows WHERE customer_id = $1 LIMIT 5000',
        [Number(reader)],
      )
      return rows.map((row) => String(row.account_id))
    },
    async followerCountsOf(producers) {
      const rows = await db.query<{ account_id: number; n: number }>(
        `SELECT account_id, count(*)::int AS n FROM follows
         WHERE account_id = ANY ($1::integer[]) GROUP BY account_id`,
        [producers.map(Number)],
      )
      const counts = new Map(rows.map((row) => [String(row.account_id), row.n]))
      return producers.map((producer) => counts.get(producer) ?? 0)
    },
    async itemsOf(producers, { limit }) {
      // Each account's newest transfers from its two history indexes, merged newest first by
      // (at, id) as the feed orders them (ids compared byte by byte: COLLATE "C").
      const rows = await db.query<{ id: string; producer: string; at: string }>(
        `SELECT item.id, item.producer, item.at FROM unnest($1::integer[]) AS p(account_id)
         CROSS JOIN LATERAL (
           SELECT t.id::text || ':' || p.account_id AS id, p.account_id::text AS producer,
                  round(extract(epoch FROM t.created_at) * 1000)::bigint::text AS at
           FROM (
             (SELECT id, created_at FROM transfers WHERE from_account_id = p.account_id
              ORDER BY created_at DESC, id DESC LIMIT $2)
             UNION ALL
             (SELECT id, created_at FROM transfers WHERE to_account_id = p.account_id
              ORDER BY created_at DESC, id DESC LIMIT $2)
           ) t
         ) item
         ORDER BY item.at::bigint DESC, item.id COLLATE "C" DESC LIMIT $2`,
        [producers.map(Number), limit],
      )
      return rows.map((row) => ({ id: row.id, producer: row.producer, at: Number(row.at) }))
    },
  }
}

/** A feed item as the API shows it. */
export interface FeedEntry {
  transferId: number
  accountId: number
  accountName: string
  direction: 'in' | 'out'
  /** The other side's username, masked as on the leaderboard (`alice`: `a***e`). */
  counterparty: string
  amount: number
  currency: string
  occurredAt: string
}

/**
 * The items' transfers, in the items' order (one query). Left out and counted in `dropped`: an item
 * whose transfer is gone, whose account is not public, or that is not a movement of its producer
 * (the account is no party to the transfer: Redis kept an item of another database's transfer).
 */
export async function hydrate(
  db: Queryable,
  items: readonly FeedItem[],
): Promise<{ entries: FeedEntry[]; dropped: number }> {
  const parsed = items.map((item) => parseItemId(item.id))
  const rows = await db.query<{
    transfer_id: number
    account_id: number
    account_name: string
    direction: 'in' | 'out'
    counterparty: string
    amount: string
    currency: string
    occurred_at: string
  }>(
    `SELECT t.id::int AS transfer_id, a.id AS account_id, a.public_name AS account_name,
            CASE WHEN t.to_account_id = a.id THEN 'in' ELSE 'out' END AS direction,
            c.username AS counterparty, t.amount::text, t.currency::text,
            to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS occurred_at
     FROM unnest($1::bigint[], $2::integer[]) AS i(transfer_id, account_id)
     JOIN transfers t ON t.id = i.transfer_id AND i.account_id IN (t.from_account_id, t.to_account_id)
     JOIN accounts a ON a.id = i.account_id AND a.public_name IS NOT NULL
     JOIN accounts other ON other.id = CASE WHEN t.to_account_id = a.id THEN t.from_account_id ELSE t.to_account_id END
     JOIN customers c ON c.id = other.customer_id`,
    [parsed.map((p) => p.transferId), parsed.map((p) => p.accountId)],
  )
  const byItem = new Map(rows.map((row) => [feedItemId(row.transfer_id, row.account_id), row]))
  const entries = items.flatMap((item) => {
    const row = byItem.get(item.id)
    if (!row || String(row.account_id) !== item.producer) return []
    return [
      {
        transferId: row.transfer_id,
        accountId: row.account_id,
        accountName: row.account_name,
        direction: row.direction,
        counterparty: maskUsername(row.counterparty),
        amount: Number(row.amount),
        currency: row.currency,
        occurredAt: row.occurred_at,
      },
    ]
  })
  return { entries, dropped: items.length - entries.length }
}
