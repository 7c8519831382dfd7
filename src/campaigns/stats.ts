import {
  createShardedCounter,
  type RedisClient,
  type ShardedCounter,
  type ShardedCounterItem,
  type StreamConsumer,
  type StreamEntry,
} from 'fastify-redis-gateway'
import { createTransferEventsConsumer, type TransferEventsConsumerOptions } from '../events/consumer.ts'
import type { TransferEvent } from '../events/outbox-relay.ts'
import { DAY_MS, utcDay } from './periods.ts'

// The bank's totals per UTC day (docs/leaderboard.md, "Today's totals"): transfers, volume per
// currency and distinct senders, on a sharded counter so that no single key takes every transfer.

export const STATS_GROUP = 'daily-stats'
/** Shards per day: writes spread over this many keys (and Cluster slots); a read asks them all. */
export const STATS_SHARDS = 8
/** A day's keys live this long after its last write: today's and yesterday's totals stay readable. */
export const STATS_TTL_MS = 2 * DAY_MS

/**
 * The counter of one day. Shard `s` is `<prefix>stats:{<day>:<s>}` (counts), with `:distinct`
 * (senders) and `:ids` (counted event ids) under the same hash tag.
 */
export function dayCounter(redis: RedisClient, prefix: string, day: string): ShardedCounter {
  return createShardedCounter(redis, {
    key: (shard) => `${prefix}stats:{${day}:${shard}}`,
    shards: STATS_SHARDS,
    ttlMs: STATS_TTL_MS,
  })
}

/**
 * One transfer as the counter takes it. The sender is the distinct member, so it also picks the
 * shard: one sender's transfers always land on one shard, the shards' distinct counts add up, and a
 * redelivered event meets its id on the shard that counted it.
 */
export function statsItem(event: TransferEvent): ShardedCounterItem {
  return {
    id: event.eventId,
    member: String(event.fromCustomerId),
    counts: { transfers: 1, [`volume:${event.currency}`]: event.amount },
  }
}

/** The transfer events of one read, grouped by the UTC day they occurred on. */
export function itemsByDay(entries: readonly StreamEntry[]): Map<string, ShardedCounterItem[]> {
  const days = new Map<string, ShardedCounterItem[]>()
  for (const entry of entries) {
    const event = JSON.parse(entry.fields.data ?? '') as TransferEvent
    if (event.type !== 'transfer.completed') continue
    const day = utcDay(Date.parse(event.occurredAt)).name
    const items = days.get(day) ?? []
    items.push(statsItem(event))
    days.set(day, items)
  }
  return days
}

export interface StatsConsumerOptions extends TransferEventsConsumerOptions {
  prefix: string
}

/**
 * The `daily-stats` consumer group on the transfer events: a read's entries are handled together,
 * one script call per shard they fall on, each counting its events once per event id.
 */
export function createStatsConsumer(options: StatsConsumerOptions): StreamConsumer {
  const { redis, prefix } = options
  // Nobody watches this live: fuller reads (one script call for many events) are worth 100 ms.
  return createTransferEventsConsumer(options, STATS_GROUP, 100, async (entries) => {
    await Promise.all(
      [...itemsByDay(entries)].map(([day, items]) => dayCounter(redis, prefix, day).add(items)),
    )
  })
}

export interface DayStats {
  date: string
  transfers: number
  /** Per currency, in its minor unit. */
  volume: Record<string, number>
  distinctSenders: number
}

/** One day's totals: every shard in one round trip. */
export async function readDay(redis: RedisClient, prefix: string, day: string): Promise<DayStats> {
  const { counts, distinct } = await dayCounter(redis, prefix, day).read()
  const volume: Record<string, number> = {}
  for (const field of Object.keys(counts).sort()) {
    if (field.startsWith('volume:')) volume[field.slice('volume:'.length)] = counts[field]!
  }
  return { date: day, transfers: counts.transfers ?? 0, volume, distinctSenders: distinct }
}
