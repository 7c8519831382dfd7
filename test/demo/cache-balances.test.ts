import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify from 'fastify'
import { createPgDatabase } from '../../src/db/database.ts'
import { getAccountWithOwner } from '../../src/ledger/ledger.ts'
import cachePlugin from '../../src/plugins/cache/index.ts'
import metrics from '../../src/plugins/metrics/index.ts'
import { createRedisClient } from '../../src/plugins/redis/index.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestCustomer,
  type TestDatabase,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { scanKeys, startTcpProxy, testRedisConnection, uniquePrefix } from '../helpers/index.ts'
import { counter } from '../plugins/cache/fixtures.ts'

let database: TestDatabase
const closers: Array<() => Promise<unknown>> = []
before(async () => {
  database = await createTestDatabase()
})
after(async () => {
  for (const close of closers.reverse()) await close()
  await database.drop()
})

/** Two gateway instances on one database and one Redis key space, as behind a load balancer. */
async function twoInstances(env: Record<string, string> = {}): Promise<[TestApp, TestApp]> {
  const keyPrefix = uniquePrefix('g')
  const a = await buildTestApp(env, { testDatabase: database, keyPrefix })
  const b = await buildTestApp(env, { testDatabase: database, keyPrefix })
  closers.push(a.close, b.close)
  return [a, b]
}

let customers = 0
async function customer(balance = 1_000_000): Promise<TestCustomer> {
  return createCustomer(database.db, `cache-user-${++customers}-${randomUUID().slice(0, 8)}`, [balance])
}

async function balance(t: TestApp, cookie: string, accountId: number): Promise<number> {
  const res = await t.app.inject({ url: `/accounts/${accountId}/balance`, headers: { cookie } })
  assert.equal(res.statusCode, 200, res.body)
  return res.json().balance
}

async function transfer(t: TestApp, cookie: string, from: number, to: number, amount: number) {
  const res = await t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { cookie, 'idempotency-key': randomUUID() },
    payload: { fromAccountId: from, toAccountId: to, amount, currency: 'VND' },
  })
  assert.equal(res.statusCode, 201, res.body)
}

async function dbBalance(accountId: number): Promise<number> {
  return (await getAccountWithOwner(database.db, accountId))!.balance
}

test('without the L1, after a committed transfer the next read on either instance shows the new balances', async () => {
  // The other instance's L1 is told by pub/sub, after the 201: the L1 test below covers that.
  const [a, b] = await twoInstances({ CACHE_L1_TTL: '0s' })
  const alice = await customer()
  const bob = await customer()
  const aliceCookie = await login(a.app, alice)
  const bobCookie = await login(b.app, bob)
  const [from, to] = [alice.accountIds[0]!, bob.accountIds[0]!]
  // Prime every entry on both instances.
  for (const t of [a, b]) {
    assert.equal(await balance(t, aliceCookie, from), 1_000_000)
    assert.equal(await balance(t, bobCookie, to), 1_000_000)
    await t.app.inject({ url: '/accounts', headers: { cookie: bobCookie } })
  }
  assert.ok((await counter(b.app, 'cache_hits_total', 'account')) >= 2)

  await transfer(a, aliceCookie, from, to, 250)
  for (const t of [b, a]) {
    assert.equal(await balance(t, aliceCookie, from), 999_750)
    assert.equal(await balance(t, bobCookie, to), 1_000_250)
    const list = await t.app.inject({ url: '/accounts', headers: { cookie: bobCookie } })
    assert.equal(list.json().accounts[0].balance, 1_000_250)
  }
  assert.equal(await dbBalance(from), 999_750)
  assert.equal(await counter(a.app, 'cache_invalidation_failures_total', 'account'), 0)
})

describe('the stale-set race with a real transfer', () => {
  /**
   * A reader on a second cache instance reads the old balance from Postgres and is held back; the
   * transfer commits and invalidates; then the reader fills. What does the gateway serve next?
   */
  async function race(fence: boolean) {
    const [gateway] = await twoInstances()
    const reader = Fastify()
    // The reader's own connection, closed after the reader (closers run in reverse): the plugin never closes it.
    const readerRedis = createRedisClient(testRedisConnection())
    closers.push(async () => readerRedis.disconnect())
    await reader.register(metrics, { processMetrics: false, path: false })
    await reader.register(cachePlugin, {
      redis: readerRedis,
      keyPrefix: `${gateway.prefix}cache:`,
      fence,
    })
    await reader.ready()
    closers.push(() => reader.close())
    const alice = await customer()
    const bob = await customer()
    const cookie = await login(gateway.app, alice)
    const [from, to] = [alice.accountIds[0]!, bob.accountIds[0]!]

    let loaded!: () => void
    const hasLoaded = new Promise<void>((resolve) => {
      loaded = resolve
    })
    let release!: () => void
    const held = new Promise<void>((resolve) => {
      release = resolve
    })
    const slowRead = reader.cache.getOrLoad(`account:${from}`, async () => {
      const account = await getAccountWithOwner(database.db, from)
      loaded()
      await held
      return account
    })
    await hasLoaded
    await transfer(gateway, cookie, from, to, 100)
    release()
    assert.equal((await slowRead)?.balance, 1_000_000)
    return {
      served: await balance(gateway, cookie, from),
      truth: await dbBalance(from),
      rejections: await counter(reader, 'cache_fence_rejections_total', 'account'),
    }
  }

  test('without the fence the gateway keeps serving the balance from before the transfer', async () => {
    assert.deepEqual(await race(false), { served: 1_000_000, truth: 999_900, rejections: 0 })
  })

  test('with the fence the stale fill is refused and the gateway serves the new balance', async () => {
    assert.deepEqual(await race(true), { served: 999_900, truth: 999_900, rejections: 1 })
  })
})

test('unknown ids are cached as not found: repeated lookups reach Postgres once', async () => {
  const [a] = await twoInstances()
  const alice = await customer()
  const bob = await customer()
  const cookie = await login(a.app, alice)
  const unknown = 2_000_000_000
  const before = a.db.queryCount
  const statuses = await Promise.all(
    Array.from({ length: 20 }, () =>
      a.app.inject({ url: `/accounts/${unknown}/balance`, headers: { cookie } }).then((r) => r.statusCode),
    ),
  )
  for (let i = 0; i < 20; i++) {
    statuses.push(
      (await a.app.inject({ url: `/accounts/${unknown}/balance`, headers: { cookie } })).statusCode,
    )
  }
  assert.ok(statuses.every((s) => s === 404))
  assert.equal(a.db.queryCount - before, 1)
  assert.equal(await counter(a.app, 'cache_loads_total', 'account'), 1)

  // Another customer's account answers exactly like a missing one, also from the cache.
  const other = await a.app.inject({ url: `/accounts/${bob.accountIds[0]}/balance`, headers: { cookie } })
  const missing = await a.app.inject({ url: `/accounts/${unknown}/balance`, headers: { cookie } })
  assert.equal(other.statusCode, 404)
  assert.equal(other.json().type, missing.json().type)

  // Ids beyond Postgres integer are answered without building a key or sending a query.
  const queries = a.db.queryCount
  const huge = await a.app.inject({ url: '/accounts/9999999999/balance', headers: { cookie } })
  assert.equal(huge.statusCode, 404)
  assert.equal(a.db.queryCount, queries)
  const keys = await scanKeys(a.redis, `${a.prefix}cache:`)
  assert.ok(!keys.some((k) => k.includes('9999999999')))
})

test('with the L1 on, the instance that committed reads the new balance at once and the other once pub/sub tells it', async () => {
  const [a, b] = await twoInstances({ CACHE_L1_TTL: '60s' })
  const alice = await customer()
  const bob = await customer()
  const cookie = await login(a.app, alice)
  const [from, to] = [alice.accountIds[0]!, bob.accountIds[0]!]
  for (const t of [a, b]) for (let i = 0; i < 3; i++) assert.equal(await balance(t, cookie, from), 1_000_000)
  assert.ok((await counter(a.app, 'cache_l1_hits_total', 'account')) >= 2)
  assert.ok((await counter(b.app, 'cache_l1_hits_total', 'account')) >= 2)
  await transfer(a, cookie, from, to, 40)
  // a dropped its L1 entry before answering 201.
  assert.equal(await balance(a, cookie, from), 999_960)
  // b's L1 entry lives a minute: only the pub/sub invalidation can replace it this soon.
  let seen = 1_000_000
  for (let i = 0; i < 100 && seen === 1_000_000; i++) {
    seen = await balance(b, cookie, from)
    if (seen === 1_000_000) await sleep(20)
  }
  assert.equal(seen, 999_960)
})

test('with Postgres down a cached balance is still served and a miss answers 503', {
  skip: USE_PGLITE && 'PGlite runs in-process',
}, async (context) => {
  const proxy = await startTcpProxy(5432)
  const url = new URL(database.url!)
  url.port = String(proxy.port)
  const proxied = createPgDatabase({ connectionString: url.toString(), connectionTimeoutMs: 500 })
  const t = await buildTestApp({}, { testDatabase: { db: proxied, drop: async () => {} } })
  context.after(async () => {
    await t.close()
    await proxied.close()
    await proxy.close()
  })
  const alice = await createCustomer(database.db, `pgdown-${randomUUID()}`, [1_000, 2_000])
  const cookie = await login(t.app, alice)
  const [cached, cold] = alice.accountIds as [number, number]
  assert.equal(await balance(t, cookie, cached), 1_000)
  proxy.cut()
  assert.equal(await balance(t, cookie, cached), 1_000)
  const miss = await t.app.inject({ url: `/accounts/${cold}/balance`, headers: { cookie } })
  assert.equal(miss.statusCode, 503)
  assert.equal(miss.json().type, '/problems/database-unavailable')
  proxy.restore()
  assert.equal(await balance(t, cookie, cold), 2_000)
})
