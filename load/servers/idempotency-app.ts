// The transfer path of the gateway (sessions, POST /transfers, the Postgres guard) with the
// idempotency plugin on a Redis of its own choosing, or without the plugin: the benchmark compares
// the two, and the tests use it to stop the idempotency Redis while sessions keep working.
import Fastify, { type FastifyInstance } from 'fastify'
import type { Database } from '../../src/db/database.ts'
import postgres from '../../src/db/plugin.ts'
import { registerProblemHandlers } from '../../src/errors.ts'
import cache from '../../src/plugins/cache/index.ts'
import idempotency, { type IdempotencyPluginOptions } from '../../src/plugins/idempotency/index.ts'
import metrics from '../../src/plugins/metrics/index.ts'
import redis from '../../src/plugins/redis/index.ts'
import session from '../../src/plugins/session/index.ts'
import type { RedisClient } from '../../src/redis/client.ts'
import sessionRoutes from '../../src/routes/session.ts'
import transferRoutes from '../../src/routes/transfers.ts'

export interface TransferAppOptions {
  /** Sessions' Redis. */
  redis: RedisClient
  database: Database
  keyPrefix: string
  sessionSecret: string
  /** Plugin options (its `redis` defaults to the sessions' one); false leaves the plugin out. */
  idempotency: IdempotencyPluginOptions | false
  logLevel?: string
}

export async function buildTransferApp(options: TransferAppOptions): Promise<FastifyInstance> {
  const app = Fastify({
    logger: { level: options.logLevel ?? 'silent' },
    bodyLimit: 16 * 1024,
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false } },
  })
  registerProblemHandlers(app)
  await app.register(metrics, { processMetrics: false })
  await app.register(redis, { redis: options.redis })
  await app.register(postgres, { database: options.database })
  await app.register(cache, { enabled: false })
  await app.register(session, { secrets: [options.sessionSecret], keyPrefix: `${options.keyPrefix}sess:` })
  if (options.idempotency) {
    await app.register(idempotency, { keyPrefix: `${options.keyPrefix}idem:`, ...options.idempotency })
  } else {
    // The baseline runs the same routes unprotected on purpose: without their `config.idempotency`
    // the boot's route coverage check (which refuses an unprotected route asking for it) passes.
    app.addHook('onRoute', (route) => {
      if (route.config) delete (route.config as { idempotency?: unknown }).idempotency
    })
  }
  await app.register(sessionRoutes)
  await app.register(transferRoutes)
  // Benchmarks read how many statements Postgres received (a replay storm must add none); same
  // path and shape as load/servers/chain.ts.
  app.get('/__bench/counters', { schema: { hide: true } }, async () => ({
    dbQueries: options.database.queryCount,
  }))
  await app.ready()
  return app
}
