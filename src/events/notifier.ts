import {
  appendEachOnce,
  type RedisClient,
  type StreamConsumer,
  type StreamEntry,
} from 'fastify-redis-gateway'
import type { Queryable } from '../db/database.ts'
import { createTransferEventsConsumer, type TransferEventsConsumerOptions } from './consumer.ts'
import type { TransferEvent } from './outbox-relay.ts'

/** Redis names of one customer's notifications, all under the customer's hash tag. */
export const notificationKeys = (prefix: string, customerId: number | string) => ({
  stream: `${prefix}notifications:{${customerId}}`,
  channel: `${prefix}notify:{${customerId}}`,
  marker: (eventId: string, event: string) => `${prefix}notified:{${customerId}}:${eventId}:${event}`,
})

export type NotificationEvent = 'transfer.sent' | 'transfer.received'

/** What a customer's screen gets (the SSE `data:`). */
export interface NotificationData {
  eventId: string
  transferId: number
  fromAccountId: number
  toAccountId: number
  amount: number
  currency: string
  occurredAt: string
}

export interface NotifierOptions extends TransferEventsConsumerOptions {
  /** Where the notified events are recorded (`notified_events`): the record that outlives Redis. */
  db: Queryable
  prefix: string
  /**
   * How many transfers back the relay's refill after a Redis data loss reaches (EVENTS_RETENTION):
   * notified events older than that cannot come back and are pruned.
   */
  refillReach: number
  /** Approximate notifications kept per customer (MAXLEN ~). */
  retention: number
  /**
   * How long an event id is remembered per customer, so a redelivery is not shown twice
   * (NOTIFICATIONS_DEDUP). Each remembered id is a Redis key (about 110 B) per customer and
   * notification; redeliveries and relay duplicates come within minutes. They are the fast path:
   * `notified_events` in Postgres is what still knows after Redis lost them.
   */
  dedupTtlMs: number
  /**
   * How long a customer's notification stream lives after its latest notification, and the age
   * beyond which its notifications are trimmed (NOTIFICATIONS_TTL). Default none: streams stay.
   */
  streamTtlMs?: number
}

export const NOTIFIER_GROUP = 'notifier'

/** One notification for one customer. */
export interface Notification {
  customerId: number
  event: NotificationEvent
  data: NotificationData
}

/**
 * Appends notifications, each once per customer, event id and name, in script calls of up to 100
 * (one per customer on a Cluster, where customers' keys live on different nodes), sent together.
 * With `streamTtlMs` each customer's stream expires that long after its latest notification.
 * Resolves with the stream ids, in the order given.
 */
export async function notifyCustomers(
  redis: RedisClient,
  prefix: string,
  notifications: readonly Notification[],
  retention: number,
  dedupTtlMs: number,
  streamTtlMs?: number,
): Promise<string[]> {
  const results = await appendEachOnce(redis, {
    markerTtlMs: dedupTtlMs,
    maxLen: retention,
    streamTtlMs,
    entries: notifications.map(({ customerId, event, data }) => {
      const keys = notificationKeys(prefix, customerId)
      const payload = JSON.stringify(data)
      return {
        stream: keys.stream,
        channel: keys.channel,
        marker: keys.marker(data.eventId, event),
        fields: { event, eventId: data.eventId, data: payload },
        message: { event, eventId: data.eventId, data: payload },
      }
    }),
  })
  return results.map((result) => result.id)
}

/** The two notifications of one transfer event; none for other event types. */
function notificationsOf(entry: StreamEntry): Notification[] {
  const event = JSON.parse(entry.fields.data ?? '') as TransferEvent
  if (event.type !== 'transfer.completed') return []
  const data: NotificationData = {
    eventId: event.eventId,
    transferId: event.transferId,
    fromAccountId: event.fromAccountId,
    toAccountId: event.toAccountId,
    amount: event.amount,
    currency: event.currency,
    occurredAt: event.occurredAt,
  }
  return [
    { customerId: event.fromCustomerId, event: 'transfer.sent', data },
    { customerId: event.toCustomerId, event: 'transfer.received', data },
  ]
}

/** How often a notifier prunes `notified_events` of what a refill can no longer bring back. */
const PRUNE_INTERVAL_MS = 60_000

/**
 * The `notifier` consumer group on the transfer events: the sender gets `transfer.sent`, the
 * recipient `transfer.received`, each on their notification stream and their Pub/Sub channel.
 * A read's entries are handled together: one query for the events already notified, script calls
 * of up to 100 notifications, one insert of the events notified now, one XACK.
 *
 * "Already notified" lives in two places. The per-customer markers in Redis absorb redeliveries
 * and relay duplicates; `notified_events` in Postgres outlives Redis: after a FLUSHALL, a restart
 * without persistence or a failover that lost writes, the relay refills the stream with recent
 * events and the markers are gone, and the events listed there are skipped rather than shown again.
 * An event is recorded after its notifications were appended, so none is lost; only a Redis data
 * loss in the milliseconds between the two can show one twice.
 */
export function createNotifier(options: NotifierOptions): StreamConsumer {
  const { db, redis, prefix, retention, dedupTtlMs, streamTtlMs, refillReach } = options
  let prunedAt = 0
  // A notification may wait 50 ms for others to share its read: one read and one XACK for many.
  return createTransferEventsConsumer(options, NOTIFIER_GROUP, 50, async (entries) => {
    const notifications = entries.flatMap(notificationsOf)
    if (notifications.length === 0) return
    const eventIds = [...new Set(notifications.map((n) => n.data.eventId))]
    const notified = await db.query<{ event_id: string }>(
      'SELECT event_id::text FROM notified_events WHERE event_id = ANY ($1::bigint[])',
      [eventIds],
    )
    const skip = new Set(notified.map((row) => row.event_id))
    const fresh = notifications.filter((n) => !skip.has(n.data.eventId))
    if (fresh.length === 0) return
    await notifyCustomers(redis, prefix, fresh, retention, dedupTtlMs, streamTtlMs)
    await db.query(
      'INSERT INTO notified_events (event_id) SELECT unnest($1::bigint[]) ON CONFLICT (event_id) DO NOTHING',
      [eventIds.filter((id) => !skip.has(id))],
    )
    if (Date.now() - prunedAt < PRUNE_INTERVAL_MS) return
    prunedAt = Date.now()
    // An event id is its transfer's: a refill reaches at most `refillReach` transfers back.
    await db.query(
      `DELETE FROM notified_events
       WHERE event_id < (SELECT max(event_id) FROM notified_events) - $1::bigint`,
      [refillReach],
    )
  })
}
