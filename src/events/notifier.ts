import { appendEachOnce, type RedisClient, type StreamConsumer, type StreamEntry } from '../index.ts'
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
  prefix: string
  /** Approximate notifications kept per customer (MAXLEN ~). */
  retention: number
  /**
   * How long an event id is remembered per customer, so a redelivery is not shown twice
   * (NOTIFICATIONS_DEDUP). Each remembered id is a Redis key (about 110 B) per customer and
   * notification; redeliveries and relay duplicates come within minutes.
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
        fields: { event, data: payload },
        message: { event, data: payload },
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

/**
 * The `notifier` consumer group on the transfer events: the sender gets `transfer.sent`, the
 * recipient `transfer.received`, each on their notification stream and their Pub/Sub channel.
 * A read's entries are handled together: script calls of up to 100 notifications, one XACK.
 */
export function createNotifier(options: NotifierOptions): StreamConsumer {
  const { redis, prefix, retention, dedupTtlMs, streamTtlMs } = options
  // A notification may wait 50 ms for others to share its read: one read and one XACK for many.
  return createTransferEventsConsumer(options, NOTIFIER_GROUP, 50, async (entries) => {
    await notifyCustomers(redis, prefix, entries.flatMap(notificationsOf), retention, dedupTtlMs, streamTtlMs)
  })
}
