import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { freePort, type RedisServerProcess, startRedisServer } from '../../src/embedded/redis-server.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestDatabase,
} from '../helpers/gateway.ts'
import { listen, startTcpProxy } from '../helpers/index.ts'
import { counter } from '../plugins/cache/fixtures.ts'

let database: TestDatabase
before(async () => {
  database = await createTestDatabase()
})
after(() => database.drop())

test("the cache's own Redis stopped mid-test: balances stay served, transfers still invalidate or count", async (context) => {
  const cacheServer = await startRedisServer()
  const t = await buildTestApp({ CACHE_REDIS_URL: cacheServer.url }, { testDatabase: database })
  const probe = new Redis(cacheServer.url)
  let again: RedisServerProcess | undefined
  context.after(async () => {
    probe.disconnect()
    await t.close()
    await cacheServer.stop()
    await again?.stop()
  })
  const alice = await createCustomer(database.db, `outage-a-${randomUUID()}`, [1_000_000])
  const bob = await createCustomer(database.db, `outage-b-${randomUUID()}`, [1_000_000])
  const cookie = await login(t.app, alice)
  const url = await listen(t.app)
  const from = alice.accountIds[0]!
  const read = async () => {
    const res = await fetch(`${url}/accounts/${from}/balance`, { headers: { cookie } })
    return { status: res.status, balance: ((await res.json()) as { balance: number }).balance }
  }
  assert.deepEqual(await read(), { status: 200, balance: 1_000_000 })
  // The entry lives in the cache's own Redis, not in the main one.
  assert.equal((await probe.keys(`*{account:${from}}:v`)).length, 1)
  probe.disconnect()

  await cacheServer.stop()
  const reads = await Promise.all(Array.from({ length: 200 }, read))
  assert.ok(
    reads.every((r) => r.status === 200 && r.balance === 1_000_000),
    JSON.stringify(reads[0]),
  )
  assert.ok((await counter(t.app, 'cache_redis_errors_total', 'account')) > 0)

  const res = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { cookie, 'content-type': 'application/json', 'idempotency-key': randomUUID() },
    body: JSON.stringify({
      fromAccountId: from,
      toAccountId: bob.accountIds[0],
      amount: 500,
      currency: 'VND',
    }),
  })
  assert.equal(res.status, 201)
  assert.equal(await counter(t.app, 'cache_invalidation_failures_total', 'account'), 2)
  assert.equal(await counter(t.app, 'cache_invalidation_failures_total', 'accounts'), 2)
  assert.deepEqual(await read(), { status: 200, balance: 999_500 })
  const list = await fetch(`${url}/accounts`, { headers: { cookie } })
  assert.equal(list.status, 200)

  // Back on the same port: reads fill the cache again.
  again = await startRedisServer(cacheServer.port)
  const check = new Redis(again.url)
  let filled = 0
  for (let i = 0; i < 100 && filled === 0; i++) {
    assert.deepEqual(await read(), { status: 200, balance: 999_500 })
    filled = (await check.keys(`*{account:${from}}:v`)).length
    if (!filled) await sleep(50)
  }
  check.disconnect()
  assert.equal(filled, 1)
})

test('a failed invalidation is retried: once the cache Redis is reachable again, the old entry is gone', async (context) => {
  const cacheServer = await startRedisServer()
  const proxy = await startTcpProxy(cacheServer.port)
  const t = await buildTestApp(
    { CACHE_REDIS_URL: `redis://127.0.0.1:${proxy.port}` },
    { testDatabase: database },
  )
  const direct = new Redis(cacheServer.url)
  context.after(async () => {
    direct.disconnect()
    await t.close()
    await proxy.close()
    await cacheServer.stop()
  })
  const alice = await createCustomer(database.db, `retry-a-${randomUUID()}`, [1_000_000])
  const bob = await createCustomer(database.db, `retry-b-${randomUUID()}`, [1_000_000])
  const cookie = await login(t.app, alice)
  const from = alice.accountIds[0]!
  const entry = `${t.prefix}cache:{account:${from}}:v`
  const read = async () =>
    (await t.app.inject({ url: `/accounts/${from}/balance`, headers: { cookie } })).json().balance as number
  assert.equal(await read(), 1_000_000)
  assert.equal(await direct.exists(entry), 1)

  // The gateway loses its cache Redis; the entry stays there, as in a network partition.
  proxy.cut()
  await sleep(100)
  const res = await t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { cookie, 'idempotency-key': randomUUID() },
    payload: { fromAccountId: from, toAccountId: bob.accountIds[0], amount: 300, currency: 'VND' },
  })
  assert.equal(res.statusCode, 201)
  assert.equal(await counter(t.app, 'cache_invalidation_failures_total', 'account'), 2)
  assert.match((await direct.get(entry)) ?? '', /"balance":1000000[,}]/)
  assert.equal(await read(), 999_700)

  proxy.restore()
  // The entry's TTL is a minute: only the background retry can remove it this soon.
  let stale = 1
  for (let i = 0; i < 200 && stale; i++) {
    await sleep(50)
    stale = await direct.exists(entry)
  }
  assert.equal(stale, 0, 'the stale entry is still there')
  assert.equal(await read(), 999_700)
})

test('a gateway boots and serves balances while its cache Redis is unreachable', async (context) => {
  const port = await freePort()
  const t = await buildTestApp({ CACHE_REDIS_URL: `redis://127.0.0.1:${port}` }, { testDatabase: database })
  context.after(() => t.close())
  const alice = await createCustomer(database.db, `boot-${randomUUID()}`, [777])
  const cookie = await login(t.app, alice)
  const res = await t.app.inject({ url: `/accounts/${alice.accountIds[0]}/balance`, headers: { cookie } })
  assert.equal(res.statusCode, 200)
  assert.equal(res.json().balance, 777)
})
