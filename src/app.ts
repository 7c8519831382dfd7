import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import Fastify, { type FastifyInstance } from 'fastify'
import {
  cache,
  closeWith,
  createRedisClient,
  idempotency,
  metrics,
  type RedisClient,
  rateLimit,
  redis,
  session,
} from 'fastify-redis-gateway'
import campaigns from './campaigns/plugin.ts'
import { type Config, NO_EVENT_WORKERS } from './config.ts'
import type { Database } from './db/database.ts'
import { settleDatabaseIdentity } from './db/identity.ts'
import postgres from './db/plugin.ts'
import { registerProblemHandlers, scheduleFailureOf } from './errors.ts'
import events from './events/plugin.ts'
import { type AccountFilter, createAccountFilter } from './ledger/account-filter.ts'
import publicAccounts from './public-accounts/plugin.ts'
import { demoRateLimits, TRANSFERS_SHADOW } from './rate-limits.ts'
import accountRoutes from './routes/accounts.ts'
import campaignRoutes from './routes/campaigns.ts'
import healthRoutes from './routes/health.ts'
import historyRoutes from './routes/history.ts'
import { readIntegerParams, refuseUnstorableText } from './routes/input.ts'
import notificationRoutes from './routes/notifications.ts'
import { openapiOptions, sessionCookieName } from './routes/openapi.ts'
import problemRoutes from './routes/problems.ts'
import publicAccountRoutes from './routes/public-accounts.ts'
import scheduledTransferRoutes from './routes/scheduled-transfers.ts'
import sessionRoutes from './routes/session.ts'
import statementRoutes from './routes/statement.ts'
import transferRoutes from './routes/transfers.ts'
import { registerScheduler, type SchedulerTuning } from './scheduler/service.ts'

export interface GatewayDependencies {
  /** An existing client (tests, embedding); otherwise one is created from config.redis. */
  redis?: RedisClient
  database?: Database
  /**
   * Prepended to every Redis key the gateway writes, so several gateways can share one Redis. The
   * keys go under `<keyPrefix><database identity>:` (`app.keyPrefix`, src/db/identity.ts).
   */
  keyPrefix?: string
  /**
   * The demo rate limits (RATE_LIMITS=off always wins). Under NODE_ENV=test they are off unless this
   * says 'on', so other suites' bursts from 127.0.0.1 are never limited; production is unchanged.
   */
  rateLimits?: 'on' | 'off'
  /**
   * The transfer-event workers (outbox relay, notifier, leaderboard and daily totals; EVENT_WORKERS
   * chooses which, and its choice always wins). Under NODE_ENV=test they run only when this says
   * 'on', so other suites' statement and round-trip counts see no background work; production is
   * unchanged.
   */
  eventWorkers?: 'on' | 'off'
  /** Consumer tuning for tests (a short visibility timeout, fewer deliveries before the dead letter). */
  eventConsumer?: { visibilityTimeoutMs?: number; maxDeliveries?: number }
  /**
   * The scheduled-transfer workers and the reconciliation job (SCHEDULER=off always wins): under
   * NODE_ENV=test off unless this says 'on' (or gives their timings); elsewhere on.
   */
  scheduler?: 'on' | 'off' | SchedulerTuning
  /**
   * The account-id Bloom filter (ACCOUNT_FILTER=off always wins): under NODE_ENV=test off unless
   * this says 'on', since suites insert accounts straight into Postgres; elsewhere on.
   */
  accountFilter?: 'on' | 'off'
}

declare module 'fastify' {
  interface FastifyInstance {
    lifecycle: { draining: boolean }
    /** What every Redis key of the gateway starts with: the given prefix and the database's identity. */
    keyPrefix: string
    /** Which account ids exist (docs/bloom.md); when off, every id might. */
    accountFilter: Pick<AccountFilter, 'mightExist' | 'add' | 'catchUp' | 'settled'>
  }
}

/** The account filter when it is off: the database answers every id. */
const NO_ACCOUNT_FILTER: Pick<AccountFilter, 'mightExist' | 'add' | 'catchUp' | 'settled'> = {
  mightExist: async () => true,
  add: async () => {},
  catchUp: async () => {},
  settled: async () => {},
}

/** The demo banking gateway: plugins in order (storage, sessions, protections), then routes. */
export async function buildApp(config: Config, deps: GatewayDependencies = {}): Promise<FastifyInstance> {
  const app = Fastify({
    logger: { level: config.logLevel },
    trustProxy: config.trustProxy,
    bodyLimit: 16 * 1024,
    // Bodies are checked as sent: "10" is not an amount, and unknown fields are an error, not dropped.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false } },
    // While closing (docs/demo/operations.md), requests on open keep-alive connections are answered with
    // `Connection: close` rather than 503, and only idle connections are closed at once.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
  }).withTypeProvider<TypeBoxTypeProvider>()
  // Set by the process entry on SIGTERM/SIGINT: GET /ready answers 503 from then on.
  app.decorate('lifecycle', { draining: false })
  // Every body is JSON; anything else is refused with 415 instead of reaching validation as text.
  app.removeContentTypeParser('text/plain')

  registerProblemHandlers(app)
  refuseUnstorableText(app)
  readIntegerParams(app)
  await app.register(metrics, { names: config.metricsNames })
  await app.register(redis, { redis: deps.redis, ...config.redis })
  await app.register(postgres, { database: deps.database, connectionString: config.databaseUrl })
  // Redis keys derived from the database's ids (feeds, notification markers, the leaderboard, the
  // cache) live under its identity: a new or restored database never meets another's keys. The
  // redis plugin has connected app.redis (it fails the boot otherwise).
  const basePrefix = deps.keyPrefix ?? ''
  const identity = await settleDatabaseIdentity(app.db, app.redis, basePrefix, (from, to) =>
    app.log.warn(
      { from, to },
      'the database is older than what Redis has seen (restored from an older backup): it gets a new identity, and the keys of the old one are left behind',
    ),
  )
  const prefix = `${basePrefix}${identity}:`
  app.decorate('keyPrefix', prefix)
  // The cache uses the main client unless CACHE_REDIS_URL names an instance of its own (one with an
  // eviction policy). On one client a request's session load, rate limit and cache read leave in one
  // write and come back in one read, on both sides (write batching, docs/redis.md).
  const cacheRedis =
    config.cache.enabled && config.cacheRedisUrl
      ? createRedisClient({ ...config.redis, url: config.cacheRedisUrl, clusterNodes: undefined })
      : undefined
  if (cacheRedis)
    app.addHook('onClose', async () => void (await cacheRedis.quit().catch(() => cacheRedis.disconnect())))
  await app.register(cache, {
    enabled: config.cache.enabled,
    redis: cacheRedis,
    sharedWithDurableData: !config.cacheRedisUrl,
    keyPrefix: `${prefix}cache:`,
    ttlMs: config.cache.ttlMs,
    l1TtlMs: config.cache.l1TtlMs,
    leaseWaitMs: config.cache.leaseWaitMs,
    leaseTtlMs: Math.max(5000, config.cache.leaseWaitMs),
  })
  // The OpenAPI document (/docs/json): operations, security, headers and problem types (src/routes/openapi.ts).
  await app.register(swagger, openapiOptions(config))
  await app.register(swaggerUi, { routePrefix: '/docs' })
  await app.register(session, {
    secrets: config.session.secrets,
    secure: config.session.secure,
    idleTimeoutMs: config.session.idleTimeoutMs,
    absoluteTimeoutMs: config.session.absoluteTimeoutMs,
    // Sessions answered without Redis, kept honest by pub/sub invalidations (docs/session.md).
    l1: config.session.l1TtlMs > 0 && { ttlMs: config.session.l1TtlMs },
    keyPrefix: `${prefix}sess:`,
  })

  const limits = config.rateLimits
  if (limits.enabled && (deps.rateLimits ?? (config.nodeEnv === 'test' ? 'off' : 'on')) === 'on') {
    // After sessions, so the per-customer key can read request.session; routes name the others.
    await app.register(rateLimit, {
      keyPrefix: `${prefix}rl:`,
      ...demoRateLimits(limits),
      // Changed with `npm run limits` (docs/demo/operations.md): seen by every instance at once,
      // or within 5 s when a message is lost.
      overrides: true,
    })
  }

  // After sessions: the default key scope is the session's principal.
  await app.register(idempotency, { keyPrefix: `${prefix}idem:` })

  // Transfer events before the routes: the transfer and session routes tell it of commits and logouts.
  const eventWorkers =
    (deps.eventWorkers ?? (config.nodeEnv === 'test' ? 'off' : 'on')) === 'on'
      ? config.events.workers
      : NO_EVENT_WORKERS
  await app.register(events, {
    prefix,
    database: { basePrefix, identity },
    ...config.events,
    workers: eventWorkers,
    // The relay's own connection, off the request path's pool (not for an injected database).
    relayDatabaseUrl: deps.database ? undefined : config.databaseUrl,
    ...deps.eventConsumer,
  })

  await app.register(healthRoutes)
  await app.register(sessionRoutes, { sessionCookie: sessionCookieName(config) })
  const accountFilter =
    config.accountFilter.enabled &&
    (deps.accountFilter === undefined ? config.nodeEnv !== 'test' : deps.accountFilter === 'on')
      ? createAccountFilter({
          db: app.db,
          redis: app.redis,
          key: `${prefix}accounts`,
          capacity: config.accountFilter.capacity,
          onError: (err) => app.log.warn({ err }, 'account filter'),
          registry: app.metrics?.registry,
        })
      : null
  app.decorate('accountFilter', accountFilter ?? NO_ACCOUNT_FILTER)
  if (accountFilter)
    closeWith(app, accountFilter, {
      name: 'account filter',
      start: true,
    })
  await app.register(accountRoutes)
  // History cursors are signed with keys derived from the session secrets (src/routes/history.ts).
  await app.register(historyRoutes, { secrets: config.session.secrets })
  await app.register(statementRoutes, {
    rateLimits: app.hasDecorator('rateLimiter') ? ['exports', 'export-bytes'] : false,
  })
  // The leaderboard and daily totals: two more consumer groups on the transfer events.
  await app.register(campaigns, {
    prefix,
    workers: eventWorkers.campaigns,
    deadLetterMaxLen: config.events.deadLetterRetention,
    ...deps.eventConsumer,
  })
  // Public accounts' feed: one more consumer group on the transfer events, and its fan-out worker.
  await app.register(publicAccounts, {
    prefix,
    workers: eventWorkers.feed,
    ...config.feed,
    deadLetterMaxLen: config.events.deadLetterRetention,
    ...deps.eventConsumer,
  })
  await app.register(transferRoutes, {
    outbox: config.events.outbox,
    rateLimits: !app.hasDecorator('rateLimiter')
      ? false
      : config.rateLimits.transfersShadow
        ? ['transfers', TRANSFERS_SHADOW]
        : 'transfers',
  })
  await app.register(notificationRoutes)
  await app.register(campaignRoutes)
  await app.register(publicAccountRoutes)
  await registerScheduler(app, {
    config,
    keyPrefix: prefix,
    run:
      config.scheduler.enabled &&
      (deps.scheduler === undefined ? config.nodeEnv !== 'test' : deps.scheduler !== 'off'),
    describeRefusal: scheduleFailureOf,
    tuning: typeof deps.scheduler === 'object' ? deps.scheduler : undefined,
  })
  await app.register(scheduledTransferRoutes, {
    worker: app.scheduler.worker,
    maxPending: config.scheduler.maxPending,
  })
  await app.register(problemRoutes)
  return app
}
