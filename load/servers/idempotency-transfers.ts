// POST /transfers with the idempotency plugin (IDEMPOTENCY=on) or without it (off), everything else
// alike: sessions, the transfer transaction, no rate limits, no cache. Migrates, seeds alice and
// bob, and announces `LISTENING <url>`. Env: REDIS_URL, DATABASE_URL, SESSION_SECRET, IDEMPOTENCY.
import { createPgDatabase } from '../../src/db/database.ts'
import { seedDemo } from '../../src/ledger/seed.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import { buildTransferApp } from './idempotency-app.ts'

const env = process.env
if (!env.REDIS_URL || !env.DATABASE_URL || !env.SESSION_SECRET) {
  throw new Error('idempotency-transfers server: set REDIS_URL, DATABASE_URL and SESSION_SECRET')
}
const redis = createRedisClient({ url: env.REDIS_URL })
await connectRedis(redis)
const database = createPgDatabase({ connectionString: env.DATABASE_URL, max: 20 })
const app = await buildTransferApp({
  redis,
  database,
  keyPrefix: '',
  sessionSecret: env.SESSION_SECRET,
  idempotency: env.IDEMPOTENCY === 'off' ? false : {},
  logLevel: env.LOG_LEVEL ?? 'warn',
})
await seedDemo(database)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', async () => {
  await app.close()
  await database.close()
  redis.disconnect()
  process.exit(0)
})
console.log(`LISTENING ${url}`)
