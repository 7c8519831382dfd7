import {
  createStreamConsumer,
  type RedisClient,
  type StreamConsumer,
  type StreamEntry,
} from 'fastify-redis-gateway'

/** What every consumer group of the transfer events is given (the events plugin's tuning included). */
export interface TransferEventsConsumerOptions {
  redis: RedisClient
  stream: string
  /** This process's name in the group. */
  consumer: string
  visibilityTimeoutMs?: number
  maxDeliveries?: number
  /** Approximate dead letters kept on `<stream>:dead` (EVENTS_DEAD_LETTER_RETENTION). Default 10 000. */
  deadLetterMaxLen?: number
  blockMs?: number
  onError?: (err: unknown) => void
}

/**
 * A consumer group of the transfer events that handles each read as one batch (up to 100 entries)
 * and, after a partial read, waits `batchWaitMs` so that under load reads are few and full.
 */
export function createTransferEventsConsumer(
  options: TransferEventsConsumerOptions,
  group: string,
  batchWaitMs: number,
  handleBatch: (entries: StreamEntry[]) => Promise<void>,
): StreamConsumer {
  return createStreamConsumer(options.redis, {
    stream: options.stream,
    group,
    consumer: options.consumer,
    visibilityTimeoutMs: options.visibilityTimeoutMs ?? 30_000,
    maxDeliveries: options.maxDeliveries ?? 5,
    deadLetterMaxLen: options.deadLetterMaxLen ?? 10_000,
    blockMs: options.blockMs ?? 2000,
    batch: 100,
    batchWaitMs,
    onError: options.onError,
    handleBatch,
  })
}
