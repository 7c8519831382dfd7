import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import {
  type Gateways,
  loginDemo,
  stampede,
  startGateways,
  sumMetric,
} from '../../load/servers/cache-cluster.ts'
import { type RedisServerProcess, startRedisServer } from '../../src/embedded/redis-server.ts'
import { createTestDatabase, type TestDatabase, USE_PGLITE } from '../helpers/gateway.ts'

// Four gateway processes share one Postgres database and one Redis (a dedicated redis-server).
let database: TestDatabase
let redis: RedisServerProcess
let gateways: Gateways
before(async () => {
  if (USE_PGLITE) return
  database = await createTestDatabase()
  redis = await startRedisServer()
  // A generous lease wait: on a loaded two-core machine the lease holder may need seconds to fill.
  gateways = await startGateways(4, {
    REDIS_URL: redis.url,
    DATABASE_URL: database.url!,
    CACHE_LEASE_WAIT: '10s',
    REDIS_COMMAND_TIMEOUT_MS: '5000',
  })
})
after(async () => {
  if (USE_PGLITE) return
  await gateways?.stop()
  await redis?.stop()
  await database?.drop()
})

test('four processes, 250 simultaneous reads each of one cold balance: Postgres loads it once, none fails', {
  skip: USE_PGLITE && 'needs a Postgres server shared by several processes',
}, async () => {
  const { cookie, accountId } = await loginDemo(gateways.urls[0]!)
  // The accounts table is locked while the reads arrive, so the first load cannot finish before
  // every process has missed: the stampede is real, not won by whoever happened to be first.
  const locker = new pg.Client({ connectionString: database.url })
  await locker.connect()
  await locker.query('BEGIN')
  await locker.query('LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE')
  let missedBeforeRelease = 0
  const result = await stampede(gateways.urls, cookie, accountId, 250, async () => {
    // Released once every process has missed, or after 3 s: inside the 10 s lease wait and the
    // holder's 5 s statement timeout.
    const until = Date.now() + 3000
    while (missedBeforeRelease < 4 && Date.now() < until) {
      missedBeforeRelease = await sumMetric(gateways.urls, 'cache_misses_total{name="account"}')
      if (missedBeforeRelease < 4) await sleep(10)
    }
    await locker.query('COMMIT')
  })
  await locker.end()
  assert.ok(missedBeforeRelease >= 2, `only ${missedBeforeRelease} process(es) missed`)
  assert.equal(result.requests, 1000)
  assert.deepEqual(result.statuses, { 200: 1000 }, JSON.stringify(result))
  assert.deepEqual(result.balances, [100_000_000])
  assert.equal(result.loads, 1)
  // The processes without the lease waited for the holder's fill instead of loading.
  const waits = await sumMetric(gateways.urls, 'cache_lease_waits_total{name="account"}')
  const misses = await sumMetric(gateways.urls, 'cache_misses_total{name="account"}')
  assert.equal(waits, misses - 1)
})
