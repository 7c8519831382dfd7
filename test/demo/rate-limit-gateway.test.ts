import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { runLimits } from '../../src/limits-cli.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestDatabase,
} from '../helpers/gateway.ts'
import { deleteKeys, keysWithoutTtl, listen, TEST_REDIS_URL } from '../helpers/index.ts'

// The demo gateway's wiring (docs/demo/http-api.md): token bucket per IP on every route, sliding log per
// username on POST /session counting failed logins only, fixed window per customer on POST /transfers.
// REDIS_CLUSTER_NODES (set by `npm run test:cluster`) runs it on a Redis Cluster.
const cluster: Record<string, string> = process.env.REDIS_CLUSTER_NODES
  ? { REDIS_CLUSTER_NODES: process.env.REDIS_CLUSTER_NODES }
  : {}

let database: TestDatabase
const apps: TestApp[] = []
before(async () => {
  database = await createTestDatabase()
})
after(async () => {
  for (const t of apps) {
    assert.deepEqual(await keysWithoutTtl(t.redis, `${t.prefix}rl:`), [], 'every rate-limit key has a TTL')
    await t.close()
  }
  await database.drop()
})

async function gateway(env: Record<string, string>, rateLimits?: 'on' | 'off'): Promise<TestApp> {
  const t = await buildTestApp({ ...cluster, ...env }, { testDatabase: database, rateLimits })
  apps.push(t)
  return t
}

test('failed logins are limited per username; successful ones do not count', async () => {
  const { app, db } = await gateway({ RATE_LIMIT_LOGIN: '3/60s', RATE_LIMIT_IP: '1000,1000' }, 'on')
  const erin = await createCustomer(db, 'erin')
  const frank = await createCustomer(db, 'frank')
  const attempt = (username: string, password: string) =>
    app.inject({ method: 'POST', url: '/session', payload: { username, password } })

  for (let i = 0; i < 5; i++) assert.equal((await attempt(frank.username, frank.password)).statusCode, 200)
  const statuses = []
  for (let i = 0; i < 4; i++) statuses.push((await attempt(erin.username, 'wrong password')).statusCode)
  assert.deepEqual(statuses, [401, 401, 401, 429])
  const blocked = await attempt(erin.username, erin.password)
  assert.equal(blocked.statusCode, 429, 'the right password is refused too while blocked')
  assert.equal(blocked.json().policy, 'login')
  assert.match(String(blocked.headers['ratelimit-policy']), /"login";q=3;w=60/)
  // Another username is not affected, and frank's five successes left his quota whole.
  for (let i = 0; i < 3; i++) assert.equal((await attempt(frank.username, 'nope')).statusCode, 401)
  assert.equal((await attempt(frank.username, 'nope')).statusCode, 429)
})

test('transfers are limited per customer with a fixed window', async () => {
  const { app, db } = await gateway({ RATE_LIMIT_TRANSFERS: '2/60s', RATE_LIMIT_IP: '1000,1000' }, 'on')
  const gina = await createCustomer(db, 'gina', [1000, 1000])
  const hank = await createCustomer(db, 'hank', [1000, 1000])
  const transfer = async (customer: typeof gina, cookie: string) =>
    app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': randomUUID() },
      payload: {
        fromAccountId: customer.accountIds[0],
        toAccountId: customer.accountIds[1],
        amount: 1,
        currency: 'VND',
      },
    })
  const ginaCookie = await login(app, gina)
  const hankCookie = await login(app, hank)
  const statuses = []
  for (let i = 0; i < 3; i++) statuses.push((await transfer(gina, ginaCookie)).statusCode)
  assert.deepEqual(statuses, [201, 201, 429])
  const limited = await transfer(gina, ginaCookie)
  assert.equal(limited.json().policy, 'transfers')
  assert.ok(Number(limited.headers['retry-after']) >= 1)
  assert.equal((await transfer(hank, hankCookie)).statusCode, 201, 'another customer has its own window')
  const [row] = await db.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM transfers WHERE from_account_id = $1',
    [gina.accountIds[0]],
  )
  assert.equal(row!.n, '2', 'the rejected transfers never reached the ledger')
})

test('a stricter transfers limit in shadow mode refuses nothing and counts what it would refuse', async () => {
  const { app, db } = await gateway(
    { RATE_LIMIT_TRANSFERS: '5/60s', RATE_LIMIT_TRANSFERS_SHADOW: '2/60s', RATE_LIMIT_IP: '1000,1000' },
    'on',
  )
  const jane = await createCustomer(db, 'jane', [1000, 1000])
  const cookie = await login(app, jane)
  const statuses = []
  for (let i = 0; i < 6; i++) {
    const res = await app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': randomUUID() },
      payload: {
        fromAccountId: jane.accountIds[0],
        toAccountId: jane.accountIds[1],
        amount: 1,
        currency: 'VND',
      },
    })
    statuses.push(res.statusCode)
    assert.doesNotMatch(String(res.headers['ratelimit-policy']), /transfers-shadow/, 'no shadow headers')
  }
  assert.deepEqual(statuses, [201, 201, 201, 201, 201, 429], 'only the enforced limit of 5 refuses')
  const metrics = (await app.inject({ url: '/metrics' })).body
  // The shadow limit of 2 would have refused the 3rd to the 6th, the one the enforced limit refused included.
  assert.match(metrics, /rate_limit_decisions_total\{policy="transfers-shadow",outcome="would_reject"\} 4\n/)
  assert.match(metrics, /rate_limit_decisions_total\{policy="transfers-shadow",outcome="allowed"\} 2\n/)
  const [row] = await db.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM transfers WHERE from_account_id = $1',
    [jane.accountIds[0]],
  )
  assert.equal(row!.n, '5')
})

test('npm run limits: an override set from the command line is applied by the running gateway', async () => {
  const t = await gateway({ RATE_LIMIT_TRANSFERS: '1/60s', RATE_LIMIT_IP: '1000,1000' }, 'on')
  const kim = await createCustomer(t.db, 'kim', [1000, 1000])
  const cookie = await login(t.app, kim)
  const key = `customer:${kim.customerId}`
  const env = { NODE_ENV: 'test', DATABASE_URL: database.url!, REDIS_URL: TEST_REDIS_URL, ...cluster }
  const limits = (...args: string[]) => runLimits([...args, '--key-prefix', t.basePrefix], env)
  assert.match(
    await limits('set', 'transfers', key, '3', '--ttl', '10m', '--reason', 'vip', '--by', 'ci'),
    new RegExp(`^set: transfers ${key} limit 3 until \\d{4}-`),
  )
  // The gateway learns it from the channel (its poll, 5 s, is the bound when a message is lost).
  for (let i = 0; (await t.app.rateLimiter.consume('transfers', key, 0)).limit !== 3; i++) {
    assert.ok(i < 500, 'the gateway applied the override')
    await sleep(10)
  }
  const statuses = []
  for (let i = 0; i < 4; i++) {
    const res = await t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': randomUUID() },
      payload: {
        fromAccountId: kim.accountIds[0],
        toAccountId: kim.accountIds[1],
        amount: 1,
        currency: 'VND',
      },
    })
    statuses.push(res.statusCode)
  }
  assert.deepEqual(statuses, [201, 201, 201, 429], 'the override of 3 replaces the limit of 1')
  assert.match(await limits('list'), new RegExp(`^transfers ${key} limit 3 until .* \\(vip, by ci\\)$`))
  assert.match(
    await limits('history'),
    new RegExp(`set transfers ${key} limit 3 for 600000 ms \\(vip\\) by ci`),
  )
  assert.equal(await limits('remove', 'transfers', key, '--by', 'ci'), `removed: transfers ${key}`)
  assert.equal(await limits('list'), 'no overrides in force')
  await assert.rejects(limits('set', 'nope', key, '3', '--ttl', '1m'), /unknown policy 'nope'/)
})

test('transfer replays and key mismatches give their quota back; real transfers keep counting', async () => {
  const { app, db, redis, prefix } = await gateway(
    { RATE_LIMIT_TRANSFERS: '3/60s', RATE_LIMIT_IP: '1000,1000' },
    'on',
  )
  const ivan = await createCustomer(db, 'ivan', [1000, 1000])
  const cookie = await login(app, ivan)
  const base = await listen(app)
  const post = async (key: string, amount: number) => {
    const response = await fetch(`${base}/transfers`, {
      method: 'POST',
      headers: { cookie, 'idempotency-key': key, 'content-type': 'application/json' },
      body: JSON.stringify({
        fromAccountId: ivan.accountIds[0],
        toAccountId: ivan.accountIds[1],
        amount,
        currency: 'VND',
      }),
    })
    const body = (await response.json()) as { type?: string }
    return { status: response.status, replayed: response.headers.get('idempotent-replayed'), type: body.type }
  }
  const mismatch = { status: 422, replayed: null, type: '/problems/idempotency-key-mismatch' }
  const first = randomUUID()
  assert.equal((await post(first, 1)).status, 201)
  // Far more than the limit of 3: replays (from the Redis record) and the key reused with another body.
  for (let i = 0; i < 8; i++) {
    assert.deepEqual(await post(first, 1), { status: 201, replayed: 'true', type: undefined })
    assert.deepEqual(await post(first, 2), mismatch)
  }
  // Redis loses the records: the transfer row answers the replay and the mismatch.
  await deleteKeys(redis, `${prefix}idem:`)
  for (let i = 0; i < 3; i++) {
    assert.deepEqual(await post(first, 1), { status: 201, replayed: 'true', type: undefined })
    await deleteKeys(redis, `${prefix}idem:`)
    assert.deepEqual(await post(first, 2), mismatch)
  }
  // POST /scheduled-transfers shares the policy, and its replays and mismatches are free too.
  const runAt = new Date(Date.now() + 86_400_000).toISOString()
  const schedule = async (key: string, amount: number) => {
    const response = await fetch(`${base}/scheduled-transfers`, {
      method: 'POST',
      headers: { cookie, 'idempotency-key': key, 'content-type': 'application/json' },
      body: JSON.stringify({
        fromAccountId: ivan.accountIds[0],
        toAccountId: ivan.accountIds[1],
        amount,
        currency: 'VND',
        runAt,
      }),
    })
    return { status: response.status, replayed: response.headers.get('idempotent-replayed') }
  }
  const scheduleKey = randomUUID()
  assert.equal((await schedule(scheduleKey, 1)).status, 201)
  for (let i = 0; i < 4; i++) {
    assert.deepEqual(await schedule(scheduleKey, 1), { status: 201, replayed: 'true' })
    assert.deepEqual(await schedule(scheduleKey, 2), { status: 422, replayed: null })
  }
  // The quota is whole but for the real transfer and the real schedule: one more, then the limit.
  const statuses = []
  for (let i = 0; i < 2; i++) statuses.push((await post(randomUUID(), 1)).status)
  assert.deepEqual(statuses, [201, 429])
  const [row] = await db.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM transfers WHERE from_account_id = $1',
    [ivan.accountIds[0]],
  )
  assert.equal(row!.n, '2')
})

test('a token bucket per client IP covers every route', async () => {
  const { app } = await gateway({ RATE_LIMIT_IP: '3,0.01' }, 'on')
  const statuses = []
  for (let i = 0; i < 4; i++) statuses.push((await app.inject('/health')).statusCode)
  assert.deepEqual(statuses, [200, 200, 200, 429])
  const res = await app.inject('/health')
  assert.equal(res.headers['ratelimit-policy'], '"ip";q=3;w=300')
  assert.match(String(res.headers.ratelimit), /^"ip";r=0;t=\d+$/)
  assert.equal(res.json().policy, 'ip')
})

test('requests no route matches use the same IP bucket: after the limit, a 404 becomes a 429', async () => {
  const { app } = await gateway({ RATE_LIMIT_IP: '3,0.01' }, 'on')
  const first = await app.inject('/no-such-route')
  assert.equal(first.statusCode, 404)
  assert.equal(first.json().type, '/problems/not-found')
  assert.equal(first.headers['ratelimit-policy'], '"ip";q=3;w=300')
  assert.equal((await app.inject('/health')).statusCode, 200, 'one bucket with the routes')
  assert.equal((await app.inject({ method: 'DELETE', url: '/nowhere' })).statusCode, 404)
  const limited = await app.inject('/no-such-route')
  assert.equal(limited.statusCode, 429)
  assert.equal(limited.json().policy, 'ip')
  assert.equal(limited.headers['ratelimit-policy'], '"ip";q=3;w=300')
  assert.match(String(limited.headers.ratelimit), /^"ip";r=0;t=\d+$/)
  assert.ok(Number(limited.headers['retry-after']) >= 1)
})

test('RATE_LIMITS=off disables every limit; tests get no demo limits unless they ask', async () => {
  for (const t of [await gateway({ RATE_LIMITS: 'off', RATE_LIMIT_IP: '1,0.01' }, 'on'), await gateway({})]) {
    for (let i = 0; i < 3; i++) {
      const res = await t.app.inject('/health')
      assert.equal(res.statusCode, 200)
      assert.equal(res.headers['ratelimit-policy'], undefined)
    }
  }
})
