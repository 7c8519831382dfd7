import assert from 'node:assert/strict'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { createPgDatabase } from '../../src/db/database.ts'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { listen, startTcpProxy } from '../helpers/index.ts'
import { type Actor, mixedLoad, moneyAndKeyInvariants, settle } from '../helpers/mixed-load.ts'

const REQUESTS = 600
const IN_FLIGHT = 40
const EXPECTED_INVARIANTS = {
  totalUnchanged: true,
  negativeBalances: 0,
  unbalancedTransfers: 0,
  accountsNotMatchingLedger: 0,
  keysRunTwice: 0,
  keysAnsweredWithoutRow: 0,
  rowsWithoutA201: 0,
}

async function actorsFor(t: TestApp, count = 4): Promise<Actor[]> {
  const actors: Actor[] = []
  for (let i = 0; i < count; i++) {
    const customer = await createCustomer(t.db, `c${i}`, [1_000_000])
    actors.push({ cookie: await login(t.app, customer), accountId: customer.accountIds[0]! })
  }
  return actors
}

async function waitUntilReady(url: string) {
  for (let i = 0; i < 100; i++) {
    if ((await fetch(`${url}/ready`).catch(() => null))?.status === 200) return
    await sleep(100)
  }
  throw new Error('not ready again')
}

function check(invariants: Record<string, unknown>) {
  const { transfers: _t, entries: _e, keysAnswered201WithoutRow, ...rest } = invariants
  assert.deepEqual({ ...rest, keysAnsweredWithoutRow: keysAnswered201WithoutRow }, EXPECTED_INVARIANTS)
}

/** Redis with an append-only file synced on every write: killed and restarted, it keeps sessions. */
const durableRedisArgs = () => [
  '--appendonly',
  'yes',
  '--appendfsync',
  'always',
  '--dir',
  mkdtempSync(join(tmpdir(), 'redis-')),
]

describe('main Redis faults', () => {
  test('Redis killed during mixed load: 503 + Retry-After at once, nothing runs twice, service returns', async (context) => {
    const args = durableRedisArgs()
    const redis = await startRedisServer(undefined, 'redis-server', args)
    const t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_URL: redis.url })
    let restarted: Awaited<ReturnType<typeof startRedisServer>> | undefined
    context.after(async () => {
      await t.close()
      await restarted?.stop()
      await redis.stop()
    })
    const actors = await actorsFor(t)
    const url = await listen(t.app)
    let outage: Promise<void> | undefined
    const report = await mixedLoad(() => url, actors, {
      requests: REQUESTS,
      inFlight: IN_FLIGHT,
      onProgress: (done) => {
        if (done === 150) outage = redis.kill()
        if (done === 350)
          return outage!.then(async () => {
            // While Redis is down: the process is alive and says what is missing.
            assert.equal((await fetch(`${url}/health`)).status, 200)
            const ready = await fetch(`${url}/ready`)
            assert.equal(ready.status, 503)
            assert.equal(((await ready.json()) as { redis: string }).redis, 'down')
            const denied = await fetch(`${url}/accounts`, { headers: { cookie: actors[0]!.cookie } })
            assert.equal(denied.status, 503)
            assert.equal(denied.headers.get('retry-after'), '1')
            restarted = await startRedisServer(redis.port, 'redis-server', args)
          })
      },
    })
    assert.equal(report.statuses.get('timeout') ?? 0, 0, 'no request hung past the timeout')
    assert.ok((report.statuses.get(503) ?? 0) > 0, 'the outage was seen')
    const unexpected = [...report.statuses.keys()].filter(
      (s) => ![200, 201, 409, 422, 503].includes(s as number),
    )
    assert.deepEqual(unexpected, [], JSON.stringify([...report.statuses]))
    await waitUntilReady(url)
    const accounts = await fetch(`${url}/accounts`, { headers: { cookie: actors[0]!.cookie } })
    assert.equal(accounts.status, 200, 'sessions survived the restart of a persistent Redis')
    await settle(() => url, report.attempts)
    check(await moneyAndKeyInvariants(t.db, report.attempts))
  })

  test('Redis slower than the command timeout behaves like Redis down, and recovers', async (context) => {
    const redis = await startRedisServer()
    const proxy = await startTcpProxy(redis.port)
    const t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_URL: `redis://127.0.0.1:${proxy.port}` })
    context.after(async () => {
      await t.close()
      await proxy.close()
      await redis.stop()
    })
    const actors = await actorsFor(t)
    const url = await listen(t.app)
    const report = await mixedLoad(() => url, actors, {
      requests: 400,
      inFlight: IN_FLIGHT,
      onProgress: (done) => {
        if (done === 100) proxy.delay(1500)
        if (done === 250) proxy.delay(0)
      },
    })
    assert.equal(
      report.statuses.get('timeout') ?? 0,
      0,
      'no request waited on the slow Redis past the timeout',
    )
    assert.ok((report.statuses.get(503) ?? 0) > 0, 'the slowness was seen as unavailability')
    await waitUntilReady(url)
    await settle(() => url, report.attempts)
    check(await moneyAndKeyInvariants(t.db, report.attempts))
  })
})

describe('cache Redis faults', () => {
  test("the cache's Redis killed during mixed load: every read still answers 200 from Postgres", async (context) => {
    const cacheRedis = await startRedisServer()
    const t = await buildTestApp({ RATE_LIMITS: 'off', CACHE_REDIS_URL: cacheRedis.url })
    context.after(async () => {
      await t.close()
      await cacheRedis.stop()
    })
    const actors = await actorsFor(t)
    const url = await listen(t.app)
    const report = await mixedLoad(() => url, actors, {
      requests: REQUESTS,
      inFlight: IN_FLIGHT,
      onProgress: (done) => (done === 150 ? cacheRedis.kill() : undefined),
    })
    assert.equal(report.statuses.get('timeout') ?? 0, 0)
    const unexpected = [...report.statuses.keys()].filter((s) => ![200, 201, 409, 422].includes(s as number))
    assert.deepEqual(
      unexpected,
      [],
      `no client sees the cache's outage: ${JSON.stringify([...report.statuses])}`,
    )
    const balance = await fetch(`${url}/accounts/${actors[0]!.accountId}/balance`, {
      headers: { cookie: actors[0]!.cookie },
    })
    const [row] = await t.db.query<{ balance: string }>('SELECT balance::text FROM accounts WHERE id = $1', [
      actors[0]!.accountId,
    ])
    assert.equal(
      ((await balance.json()) as { balance: number }).balance,
      Number(row!.balance),
      'served from Postgres, current',
    )
    await settle(() => url, report.attempts)
    check(await moneyAndKeyInvariants(t.db, report.attempts))
  })
})

describe('Postgres faults', { skip: USE_PGLITE && 'PGlite runs in-process' }, () => {
  test('Postgres cut during transfers: 503 + Retry-After, no partial transfer, claims released, retries run once', async (context) => {
    const database = await createTestDatabase()
    const proxy = await startTcpProxy(5432)
    const proxiedUrl = new URL(database.url!)
    proxiedUrl.port = String(proxy.port)
    const proxied = createPgDatabase({ connectionString: proxiedUrl.toString(), connectionTimeoutMs: 500 })
    const t = await buildTestApp(
      { RATE_LIMITS: 'off' },
      { testDatabase: { db: proxied, drop: async () => {} } },
    )
    context.after(async () => {
      await t.close()
      await proxied.close()
      await proxy.close()
      await database.drop()
    })
    const actors = await actorsFor(t)
    const url = await listen(t.app)
    const report = await mixedLoad(() => url, actors, {
      requests: REQUESTS,
      inFlight: IN_FLIGHT,
      onProgress: (done) => {
        if (done === 150) proxy.cut()
        if (done === 350) proxy.restore()
      },
    })
    assert.equal(report.statuses.get('timeout') ?? 0, 0)
    assert.ok((report.statuses.get(503) ?? 0) > 0, 'the outage was seen')
    const unexpected = [...report.statuses.keys()].filter(
      (s) => ![200, 201, 409, 422, 503].includes(s as number),
    )
    assert.deepEqual(unexpected, [], JSON.stringify([...report.statuses]))
    await waitUntilReady(url)
    const retries = await settle(() => url, report.attempts)
    assert.equal(retries.filter((s) => s === 409).length, 0, 'no claim was left behind by a failed transfer')
    check(await moneyAndKeyInvariants(database.db, report.attempts))
  })
})
