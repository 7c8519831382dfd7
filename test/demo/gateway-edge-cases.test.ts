import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestDatabase,
} from '../helpers/gateway.ts'
import { scanKeys } from '../helpers/index.ts'

// Regressions of the demo gateway: what a key is bound to in Postgres, what a problem may disclose,
// what reaches Postgres, and what a replay invalidates.

let database: TestDatabase
before(async () => {
  database = await createTestDatabase()
})
after(async () => database.drop())

async function transfer(t: TestApp, cookie: string, key: string, body: object) {
  return t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { cookie, 'idempotency-key': key },
    payload: body,
  })
}

async function counts() {
  const [row] = await database.db.query<{ transfers: string; entries: string; customers: string }>(
    `SELECT (SELECT count(*) FROM transfers)::text AS transfers,
            (SELECT count(*) FROM ledger_entries)::text AS entries,
            (SELECT count(*) FROM customers)::text AS customers`,
  )
  return row
}

test('Redis lost the record: a reused key with a bad body is a mismatch, and the original retry still replays', async (context) => {
  // A private Redis: this test flushes it.
  const server = await startRedisServer()
  const admin = new Redis(server.url)
  const t = await buildTestApp({ REDIS_URL: server.url, RATE_LIMITS: 'off' }, { testDatabase: database })
  context.after(async () => {
    await t.close()
    admin.disconnect()
    await server.stop()
  })
  const alice = await createCustomer(database.db, `alice-${randomUUID().slice(0, 8)}`, [10_000])
  const bob = await createCustomer(database.db, `bob-${randomUUID().slice(0, 8)}`, [0])
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 700,
    currency: 'VND',
  }
  const first = await transfer(t, await login(t.app, alice), 'lost-1', body)
  assert.equal(first.statusCode, 201)
  await admin.flushall()
  const cookie = await login(t.app, alice)
  for (const bad of [
    { ...body, toAccountId: body.fromAccountId }, // same account: 400 without the key
    { ...body, toAccountId: 2_000_000_000 }, // unknown recipient: 404 without the key
    { ...body, fromAccountId: 2_000_000_001 }, // unknown source
  ]) {
    const res = await transfer(t, cookie, 'lost-1', bad)
    assert.equal(res.statusCode, 422, res.body)
    assert.equal(res.json().type, '/problems/idempotency-key-mismatch')
  }
  const retry = await transfer(t, cookie, 'lost-1', body)
  assert.equal(retry.statusCode, 201, retry.body)
  assert.equal(retry.headers['idempotent-replayed'], 'true')
  assert.deepEqual(retry.json(), first.json())
  // Without a key held by Postgres the same bodies still get their own problems.
  assert.equal(
    (await transfer(t, cookie, 'fresh-1', { ...body, toAccountId: body.fromAccountId })).statusCode,
    400,
  )
  assert.equal(
    (await transfer(t, cookie, 'fresh-2', { ...body, toAccountId: 2_000_000_000 })).statusCode,
    404,
  )
  const [row] = await database.db.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM transfers WHERE from_account_id = $1',
    [alice.accountIds[0]],
  )
  assert.equal(row!.n, '1')
})

test("a transfer to another customer's account in the wrong currency does not disclose that account's currency", async (context) => {
  const t = await buildTestApp({ RATE_LIMITS: 'off' }, { testDatabase: database })
  context.after(() => t.close())
  const alice = await createCustomer(database.db, `alice-${randomUUID().slice(0, 8)}`, [10_000])
  const bob = await createCustomer(database.db, `bob-${randomUUID().slice(0, 8)}`, [[0, 'USD']])
  const res = await transfer(t, await login(t.app, alice), randomUUID(), {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 1,
    currency: 'VND',
  })
  assert.equal(res.statusCode, 422)
  assert.equal(res.json().type, '/problems/currency-mismatch')
  assert.doesNotMatch(res.body, /USD/)
})

test('strings with NUL or lone surrogates are refused with 400 before they reach Postgres', async (context) => {
  const t = await buildTestApp({ RATE_LIMITS: 'on' }, { testDatabase: database, rateLimits: 'on' })
  context.after(() => t.close())
  const before = await counts()
  for (const username of ['a\u0000b', 'a\ud800b']) {
    const res = await t.app.inject({
      method: 'POST',
      url: '/session',
      headers: { 'content-type': 'application/json' },
      payload: JSON.stringify({ username, password: 'whatever-password' }),
    })
    assert.equal(res.statusCode, 400, res.body)
    assert.equal(res.json().type, '/problems/validation')
  }
  const alice = await createCustomer(database.db, `alice-${randomUUID().slice(0, 8)}`, [10_000])
  const res = await t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: {
      cookie: await login(t.app, alice),
      'idempotency-key': randomUUID(),
      'content-type': 'application/json',
    },
    payload: '{"fromAccountId":1,"toAccountId":2,"amount":1,"currency":"V\\u0000D"}',
  })
  assert.equal(res.statusCode, 400, res.body)
  const afterCounts = await counts()
  assert.deepEqual(
    { ...afterCounts, customers: before!.customers },
    { ...before, customers: before!.customers },
  )
})

test("a replay after a commit whose invalidation never ran refreshes the recipient's cached account list", async (context) => {
  const t = await buildTestApp({ RATE_LIMITS: 'off' }, { testDatabase: database })
  context.after(() => t.close())
  const alice = await createCustomer(database.db, `alice-${randomUUID().slice(0, 8)}`, [10_000])
  const bob = await createCustomer(database.db, `bob-${randomUUID().slice(0, 8)}`, [0])
  const bobCookie = await login(t.app, bob)
  const accounts = async () =>
    (await t.app.inject({ url: '/accounts', headers: { cookie: bobCookie } })).json()
  assert.equal((await accounts()).accounts[0].balance, 0)
  // The process that commits dies before invalidating: the cached list survives the transfer as it was.
  const [listKey] = (await scanKeys(t.redis, t.prefix)).filter((k) =>
    k.endsWith(`{accounts:${bob.customerId}}:v`),
  )
  assert.ok(listKey, "bob's account list is cached")
  const stale = await t.redis.dumpBuffer(listKey!)
  const ttl = await t.redis.pttl(listKey!)
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 300,
    currency: 'VND',
  }
  const cookie = await login(t.app, alice)
  assert.equal((await transfer(t, cookie, 'crash-1', body)).statusCode, 201)
  await t.redis.restore(listKey!, ttl, stale!, 'REPLACE')
  // Nor did it complete its Idempotency-Key record: its claim's lease ran out (here: it is gone).
  const records = (await scanKeys(t.redis, t.prefix)).filter((k) => k.includes(':idem:'))
  assert.equal(records.length, 1)
  await t.redis.del(records[0]!)
  assert.equal((await accounts()).accounts[0].balance, 0, 'the stale list is what a crash leaves')
  // Alice's client never saw its answer and retries: the replay drops both sides again.
  const retry = await transfer(t, cookie, 'crash-1', body)
  assert.equal(retry.statusCode, 201)
  assert.equal((await accounts()).accounts[0].balance, 300)
})

test('operator endpoints (/metrics, /docs) are outside the rate limits; every API route is inside', async (context) => {
  const t = await buildTestApp({ RATE_LIMITS: 'on' }, { testDatabase: database, rateLimits: 'on' })
  context.after(() => t.close())
  for (const url of ['/metrics', '/docs/json']) {
    const res = await t.app.inject(url)
    assert.equal(res.statusCode, 200, url)
    assert.equal(res.headers['ratelimit-policy'], undefined, `${url} is not limited`)
  }
  for (const [method, url] of [
    ['GET', '/health'],
    ['GET', '/accounts'],
    ['POST', '/session'],
    ['POST', '/transfers'],
  ] as const) {
    const res = await t.app.inject({ method, url })
    assert.match(String(res.headers['ratelimit-policy']), /"ip";q=\d+;w=\d+/, `${method} ${url} is limited`)
  }
})

test('one client trying a new username each time gets a bounded number of password checks', async (context) => {
  const t = await buildTestApp(
    { RATE_LIMITS: 'on', RATE_LIMIT_LOGIN_IP: '5/60s', RATE_LIMIT_LOGIN: '3/60s' },
    { testDatabase: database, rateLimits: 'on' },
  )
  context.after(() => t.close())
  const statuses = []
  for (let i = 0; i < 7; i++) {
    const res = await t.app.inject({
      method: 'POST',
      url: '/session',
      payload: { username: `nobody-${randomUUID()}`, password: 'not-the-password' },
    })
    statuses.push(res.statusCode)
    if (res.statusCode === 429) assert.equal(res.json().policy, 'login-ip')
  }
  // The per-username limit never trips (each name is new); the per-IP one does after 5 checks.
  assert.deepEqual(statuses, [401, 401, 401, 401, 401, 429, 429])
})
