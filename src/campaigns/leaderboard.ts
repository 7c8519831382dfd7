import type {
  Leaderboard,
  LeaderboardEntry,
  LeaderboardItem,
  StreamConsumer,
  StreamEntry,
} from 'fastify-redis-gateway'
import type { Database } from '../db/database.ts'
import { createTransferEventsConsumer, type TransferEventsConsumerOptions } from '../events/consumer.ts'
import type { TransferEvent } from '../events/outbox-relay.ts'
import { DAY_MS, isoWeek } from './periods.ts'

// The weekly campaign leaderboard (docs/leaderboard.md): the `leaderboard` consumer group adds each
// transfer's amount to its sender's volume on the board of the transfer's ISO week and currency.

export const LEADERBOARD_GROUP = 'leaderboard'

/**
 * How long a week's board outlives the week: last week's ranking stays readable, and an event
 * delivered late (a backlog after an outage) still finds its board and its counted ids.
 */
export const WEEK_GRACE_MS = 7 * DAY_MS

/** The board of one ISO week and currency: volumes in different currencies are never added up. */
export const weekBoard = (week: string, currency: string) => `week:${week}:${currency}`

/**
 * A board member is the customer id zero-padded to 10 digits (every Postgres integer fits), so byte
 * order is numeric order and equal volumes rank the lower customer id first.
 */
export const memberOf = (customerId: number) => String(customerId).padStart(10, '0')

/** How a customer shows on the public board: `alice` is `a***e`; names of one or two characters keep only the first. */
export function maskUsername(username: string): string {
  const chars = Array.from(username)
  if (chars.length <= 2) return `${chars[0] ?? ''}***`
  return `${chars[0]}***${chars[chars.length - 1]}`
}

export interface LeaderboardConsumerOptions extends TransferEventsConsumerOptions {
  leaderboard: Leaderboard
}

interface BoardBatch {
  items: LeaderboardItem[]
  expireAtMs: number
}

/** The transfer events of one read, grouped by the board they count on. */
export function itemsByBoard(entries: readonly StreamEntry[], now = Date.now()): Map<string, BoardBatch> {
  const boards = new Map<string, BoardBatch>()
  for (const entry of entries) {
    const event = JSON.parse(entry.fields.data ?? '') as TransferEvent
    if (event.type !== 'transfer.completed') continue
    const week = isoWeek(Date.parse(event.occurredAt))
    const expireAtMs = week.endMs + WEEK_GRACE_MS
    // That board has expired: counting the event would only create it again, alone.
    if (expireAtMs <= now) continue
    const name = weekBoard(week.name, event.currency)
    const batch = boards.get(name) ?? { items: [], expireAtMs }
    batch.items.push({ id: event.eventId, member: memberOf(event.fromCustomerId), amount: event.amount })
    boards.set(name, batch)
  }
  return boards
}

/**
 * The `leaderboard` consumer group on the transfer events. A read's entries are handled together:
 * one script call per board they touch (usually one: this week's, in VND), which adds each amount
 * and records its event id atomically, so a redelivered event changes no score.
 */
export function createLeaderboardConsumer(options: LeaderboardConsumerOptions): StreamConsumer {
  const { leaderboard } = options
  // Nobody watches this live: fuller reads (one script call for many events) are worth 100 ms.
  return createTransferEventsConsumer(options, LEADERBOARD_GROUP, 100, async (entries) => {
    await Promise.all(
      [...itemsByBoard(entries)].map(([name, { items, expireAtMs }]) =>
        leaderboard.add(name, items, { expireAtMs }),
      ),
    )
  })
}

export interface RankedCustomer {
  rank: number
  /** The masked username. */
  customer: string
  volume: number
}

/** A board's entries with their customers' masked usernames (one Postgres query). */
export async function rankedCustomers(
  db: Database,
  entries: readonly LeaderboardEntry[],
): Promise<RankedCustomer[]> {
  if (entries.length === 0) return []
  const rows = await db.query<{ id: number; username: string }>(
    'SELECT id, username FROM customers WHERE id = ANY($1::integer[])',
    [entries.map((e) => Number(e.member))],
  )
  const usernames = new Map(rows.map((row) => [row.id, row.username]))
  return entries.map((e) => ({
    rank: e.rank,
    customer: maskUsername(usernames.get(Number(e.member)) ?? ''),
    volume: e.score,
  }))
}
