import { randomBytes } from 'node:crypto'
import { hostname } from 'node:os'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { closeWith, createLeaderboard, type Leaderboard, type StreamConsumer } from 'fastify-redis-gateway'
import { createLeaderboardConsumer, LEADERBOARD_GROUP } from './leaderboard.ts'
import { createStatsConsumer, STATS_GROUP } from './stats.ts'

export interface CampaignsPluginOptions {
  /** Prepended to every key (the gateway's key prefix). */
  prefix: string
  /** Run the `leaderboard` and `daily-stats` consumer groups in this process. */
  workers: boolean
  /** Approximate dead letters kept on the transfer events' dead-letter stream. Default 10 000. */
  deadLetterMaxLen?: number
  /** Consumer tuning (tests shorten the visibility timeout). */
  visibilityTimeoutMs?: number
  maxDeliveries?: number
}

export interface CampaignsApi {
  /** The gateway's key prefix, for the daily totals' keys (src/campaigns/stats.ts). */
  prefix: string
  leaderboard: Leaderboard
  /** Empty when these consumers run elsewhere (EVENT_WORKERS, or tests that did not ask for them). */
  consumers: StreamConsumer[]
}

declare module 'fastify' {
  interface FastifyInstance {
    campaigns: CampaignsApi
  }
}

/**
 * The weekly leaderboard and the daily totals (docs/leaderboard.md): their two consumer groups on
 * the transfer events (when `workers`), and `app.campaigns` for the routes that read them.
 */
async function campaignsPlugin(app: FastifyInstance, options: CampaignsPluginOptions): Promise<void> {
  const { prefix } = options
  const redis = app.redis
  const leaderboard = createLeaderboard(redis, { keyPrefix: `${prefix}lb:` })
  const onError = (err: unknown) => app.log.warn({ err }, 'campaign events')
  const common = {
    redis,
    stream: app.events.stream,
    consumer: `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`,
    visibilityTimeoutMs: options.visibilityTimeoutMs,
    maxDeliveries: options.maxDeliveries,
    deadLetterMaxLen: options.deadLetterMaxLen,
    onError,
  }
  const consumers = options.workers
    ? [createLeaderboardConsumer({ ...common, leaderboard }), createStatsConsumer({ ...common, prefix })]
    : []
  app.decorate('campaigns', { prefix, leaderboard, consumers })
  // Reported wherever they run: the groups live in Redis, shared by every instance.
  app.events.reportGroup(LEADERBOARD_GROUP)
  app.events.reportGroup(STATS_GROUP)

  // Redis unreachable at the start: each loop creates its group once Redis answers. On close, entries
  // being handled finish and are acknowledged; those delivered and not started are handed back.
  for (const consumer of consumers)
    closeWith(app, consumer, {
      name: 'campaign events consumer',
      start: true,
    })
}

export default fp(campaignsPlugin, { name: 'campaigns', dependencies: ['transfer-events'] })
