import { appendOnce, createStreamConsumer, type RedisClient, type StreamConsumer } from '../index.ts'
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

export interface NotifierOptions {
  redis: RedisClient
  prefix: string
  stream: string
  consumer: string
  /** Approximate notifications kept per customer (MAXLEN ~). */
  retention: number
  /** How long an event id is remembered per customer, so a redelivery is not shown twice. Default 7 days. */
  dedupTtlMs?: number
  visibilityTimeoutMs?: number
  maxDeliveries?: number
  blockMs?: number
  onError?: (err: unknown) => void
}

export const NOTIFIER_GROUP = 'notifier'

/** Appends one notification for one customer, once per event id and name; resolves with its stream id. */
export async function notifyCustomer(
  redis: RedisClient,
  prefix: string,
  customerId: number,
  event: NotificationEvent,
  data: NotificationData,
  retention: number,
  dedupTtlMs: number,
): Promise<string> {
  const keys = notificationKeys(prefix, customerId)
  const payload = JSON.stringify(data)
  const { id } = await appendOnce(redis, {
    stream: keys.stream,
    marker: keys.marker(data.eventId, event),
    markerTtlMs: dedupTtlMs,
    maxLen: retention,
    fields: { event, data: payload },
    channel: keys.channel,
    message: { event, data: payload },
  })
  return id
}

/**
 * The `notifier` consumer group on the transfer events: the sender gets `transfer.sent`, the
 * recipient `transfer.received`, each on their notification stream and their Pub/Sub channel.
 */
export function createNotifier(options: NotifierOptions): StreamConsumer {
  const { redis, prefix, retention, dedupTtlMs = 7 * 24 * 3_600_000, onError } = options
  return createStreamConsumer(redis, {
    stream: options.stream,
    group: NOTIFIER_GROUP,
    consumer: options.consumer,
    visibilityTimeoutMs: options.visibilityTimeoutMs ?? 30_000,
    maxDeliveries: options.maxDeliveries ?? 5,
    blockMs: options.blockMs ?? 2000,
    onError,
    async handler(entry) {
      const event = JSON.parse(entry.fields.data ?? '') as TransferEvent
      if (event.type !== 'transfer.completed') return
      const data: NotificationData = {
        eventId: event.eventId,
        transferId: event.transferId,
        fromAccountId: event.fromAccountId,
        toAccountId: event.toAccountId,
        amount: event.amount,
        currency: event.currency,
        occurredAt: event.occurredAt,
      }
      await notifyCustomer(redis, prefix, event.fromCustomerId, 'transfer.sent', data, retention, dedupTtlMs)
      await notifyCustomer(
        redis,
        prefix,
        event.toCustomerId,
        'transfer.received',
        data,
        retention,
        dedupTtlMs,
      )
    },
  })
}
