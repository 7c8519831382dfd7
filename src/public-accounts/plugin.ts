import { randomBytes } from 'node:crypto'
import { hostname } from 'node:os'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import {
  closeWith,
  createFeed,
  type FanoutWorker,
  type Feed,
  type FeedItem,
  type StreamConsumer,
} from 'fastify-redis-gateway'
import { Histogram } from 'prom-client'
import { createTransferEventsConsumer } from '../events/consumer.ts'
import type { TransferEvent } from '../events/outbox-relay.ts'
import { feedItemId, feedSource, publicAmong } from './store.ts'

export interface PublicAccountsPluginOptions {
  /** Prepended to every key (the gateway's key prefix). */
  prefix: string
  /** Run the `feed` consumer group and the fan-out worker in this process. */
  workers: boolean
  pushMaxFollowers: number
  activeWindowMs: number
  deadLetterMaxLen?: number
  /** Consumer tuning (tests shorten the visibility timeout). */
  visibilityTimeoutMs?: number
  maxDeliveries?: number
}

export interface PublicAccountsApi {
  feed: Feed
  /** Null when the feed's workers run elsewhere (EVENT_WORKERS, or tests that did not ask for them). */
  consumer: StreamConsumer | null
  fanout: FanoutWorker | null
}

declare module 'fastify' {
  interface FastifyInstance {
    publicAccounts: PublicAccountsApi
  }
}

export const FEED_GROUP = 'feed'
/** Seconds from a movement to its fan-out's end: the outbox relay, the feed group and the fan-out queue. */
const FANOUT_LAG_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]

/** The feed items of a read of transfer events: one per transfer and public account it touched. */
async function itemsOf(app: FastifyInstance, data: readonly string[]): Promise<FeedItem[]> {
  const events = data
    .map((json) => JSON.parse(json) as TransferEvent)
    .filter((event) => event.type === 'transfer.completed')
  if (events.length === 0) return []
  const accounts = [...new Set(events.flatMap((e) => [e.fromAccountId, e.toAccountId]))]
  const publicIds = await publicAmong(app.db, accounts)
  return events.flatMap((event) =>
    [event.fromAccountId, event.toAccountId]
      .filter((accountId) => publicIds.has(accountId))
      .map((accountId) => ({
        id: feedItemId(event.transferId, accountId),
        producer: String(accountId),
        at: Date.parse(event.occurredAt),
      })),
  )
}

/**
 * Public accounts' feed (docs/feed.md, the demo): `app.publicAccounts.feed` for the routes, and,
 * when `workers`, the `feed` consumer group of the transfer events (a movement of a public account
 * is published to its followers) and the fan-out worker.
 */
async function publicAccountsPlugin(
  app: FastifyInstance,
  options: PublicAccountsPluginOptions,
): Promise<void> {
  const feed = createFeed(app.redis, {
    source: feedSource(app.db),
    keyPrefix: `${options.prefix}feed:`,
    // Readers are customers and producers accounts: ids of two kinds, equal by chance.
    ownItems: false,
    pushMaxFollowers: options.pushMaxFollowers,
    activeWindowMs: options.activeWindowMs,
  })
  const onError = (err: unknown) => app.log.warn({ err }, 'public accounts feed')
  const consumerName = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`
  const consumer = options.workers
    ? createTransferEventsConsumer(
        {
          redis: app.redis,
          stream: app.events.stream,
          consumer: consumerName,
          visibilityTimeoutMs: options.visibilityTimeoutMs,
          maxDeliveries: options.maxDeliveries,
          deadLetterMaxLen: options.deadLetterMaxLen,
          onError,
        },
        FEED_GROUP,
        50,
        async (entries) => {
          const items = await itemsOf(
            app,
            entries.map((entry) => entry.fields.data ?? ''),
          )
          // A redelivered event publishes again: its item lands once (same id, same time).
          await Promise.all(items.map((item) => feed.publish(item)))
        },
      )
    : null
  // Where the fan-out runs: each job's end, timed from its item's time (the transfer's).
  const fanoutLag = options.workers
    ? new Histogram({
        name: 'feed_fanout_lag_seconds',
        help: "Time from a public account's movement to the end of its fan-out to its followers' feeds (pushed accounts)",
        buckets: FANOUT_LAG_BUCKETS,
        registers: app.hasDecorator('metrics') ? [app.metrics.registry] : [],
      })
    : null
  const fanout = options.workers
    ? feed.createFanoutWorker({
        consumer: consumerName,
        onError,
        onJobDone: ({ item }) => fanoutLag?.observe(Math.max(0, Date.now() - item.at) / 1000),
      })
    : null
  app.decorate('publicAccounts', { feed, consumer, fanout })

  // Redis unreachable at the start: each loop creates its group once Redis answers.
  if (consumer) closeWith(app, consumer, { name: 'public accounts feed consumer', start: true })
  if (fanout) closeWith(app, fanout, { name: 'feed fan-out', start: true })
}

export default fp(publicAccountsPlugin, { name: 'public-accounts', dependencies: ['transfer-events'] })
