import assert from 'node:assert/strict'
import { test } from 'node:test'
import type { FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { buildTransferApp } from '../../load/servers/idempotency-app.ts'
import { createPgDatabase } from '../../src/db/database.ts'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  ledgerInvariants,
  login,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { listen, TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from '../helpers/index.ts'

// Each test runs its own redis-server: these flush it or stop it, which the shared one must never see.

async function post(url: string, cookie: string, key: string, body: object) {
  const res = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { cookie, 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  })
  return {
    status: res.status,
    body: await res.text(),
    replayed: res.headers.get('idempotent-replayed') === 'true',
  }
}

test('Redis flushed between a transfer and its retry: the retry replays from Postgres, no second debit', async (context) => {
  const server = await startRedisServer()
  const admin = new Redis(server.url)
  const t = await buildTestApp({
    REDIS_URL: server.url,
    RATE_LIMITS: 'off',
    REDIS_COMMAND_TIMEOUT_MS: '5000',
  })
  context.after(async () => {
    await t.close()
    admin.disconnect()
    await server.stop()
  })
  const url = await listen(t.app)
  const alice = await createCustomer(t.db, 'alice', [10_000])
  const bob = await createCustomer(t.db, 'bob', [0])
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 2500,
    currency: 'VND',
  }
  const first = await post(url, await login(t.app, alice), 'flushed-1', body)
  assert.equal(first.status, 201)

  await admin.flushall()
  // The flush ended the session too: the client logs in again (same customer, same key scope) and retries.
  const cookie = await login(t.app, alice)
  const retries = await Promise.all(Array.from({ length: 30 }, () => post(url, cookie, 'flushed-1', body)))
  for (const r of retries) {
    if (r.status !== 409) assert.deepEqual([r.status, r.body, r.replayed], [201, first.body, true])
  }
  const mismatch = await post(url, cookie, 'flushed-1', { ...body, amount: 2400 })
  assert.equal(mismatch.status, 422)
  assert.equal(JSON.parse(mismatch.body).type, '/problems/idempotency-key-mismatch')
  await admin.flushall()
  const cookieAgain = await login(t.app, alice)
  assert.equal((await post(url, cookieAgain, 'flushed-1', { ...body, amount: 2400 })).status, 422)
  // That 422 came from the database guard: it must not have claimed the key for the other body.
  const original = await post(url, cookieAgain, 'flushed-1', body)
  assert.deepEqual([original.status, original.body, original.replayed], [201, first.body, true])

  const [row] = await t.db.query<{ transfers: string; balance: string }>(
    `SELECT (SELECT count(*) FROM transfers)::text AS transfers,
              (SELECT balance FROM accounts WHERE id = $1)::text AS balance`,
    [alice.accountIds[0]],
  )
  assert.deepEqual(row, { transfers: '1', balance: '7500' })
  assert.equal((await ledgerInvariants(t.db)).totalUnchanged, true)
})

const twoPools = { skip: USE_PGLITE && 'two instances need two connection pools to one Postgres server' }

test(
  'idempotency Redis stopped, two instances racing one key: exactly one transfer (the database guard)',
  twoPools,
  async (t) => {
    const server = await startRedisServer()
    const database = await createTestDatabase()
    // Generous timeouts: on a loaded machine a session or pool timeout (503) would hide what this
    // test checks, while 100 requests queue on one account lock.
    const sessions = createRedisClient({ url: TEST_REDIS_URL, commandTimeoutMs: 5000 })
    const idempotencyRedis = createRedisClient({ url: server.url })
    const pools = [0, 1].map(() =>
      createPgDatabase({
        connectionString: database.url!,
        max: 10,
        connectionTimeoutMs: 15_000,
        statementTimeoutMs: 15_000,
      }),
    )
    const apps: FastifyInstance[] = []
    t.after(async () => {
      for (const app of apps) await app.close()
      for (const pool of pools) await pool.close()
      sessions.disconnect()
      idempotencyRedis.disconnect()
      await server.stop()
      await database.drop()
    })
    const keyPrefix = uniquePrefix('idemloss')
    for (const pool of pools) {
      apps.push(
        await buildTransferApp({
          redis: sessions,
          database: pool,
          keyPrefix,
          sessionSecret: TEST_SECRET,
          idempotency: { redis: idempotencyRedis },
        }),
      )
    }
    const urls = await Promise.all(apps.map((app) => listen(app)))
    // Connected before it stops (the plugin already connects it at boot; this waits until it is ready).
    await connectRedis(idempotencyRedis)
    const alice = await createCustomer(database.db, 'alice', [10_000])
    const bob = await createCustomer(database.db, 'bob', [0])
    const cookie = await login(apps[0]!, alice)
    await server.stop()

    const body = {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1000,
      currency: 'VND',
    }
    const responses = await Promise.all(
      Array.from({ length: 100 }, (_, i) => post(urls[i % 2]!, cookie, 'redis-down-1', body)),
    )
    const originals = responses.filter((r) => r.status === 201 && !r.replayed)
    assert.equal(originals.length, 1, JSON.stringify(responses.filter((r) => r.status !== 201).slice(0, 3)))
    for (const r of responses) assert.deepEqual([r.status, r.body], [201, originals[0]!.body])
    const mismatch = await post(urls[1]!, cookie, 'redis-down-1', { ...body, amount: 999 })
    assert.equal(mismatch.status, 422)

    const [row] = await database.db.query<{ transfers: string; balance: string }>(
      `SELECT (SELECT count(*) FROM transfers)::text AS transfers,
              (SELECT balance FROM accounts WHERE id = $1)::text AS balance`,
      [alice.accountIds[0]],
    )
    assert.deepEqual(row, { transfers: '1', balance: '9000' })
    const metrics = await apps[0]!.inject({ url: '/metrics' })
    assert.match(metrics.body, /idempotency_requests_total\{outcome="unavailable"\} [1-9]/)
  },
)

test('the gateway with its one Redis stopped refuses transfers (503: sessions cannot be checked)', async (context) => {
  const server = await startRedisServer()
  const t = await buildTestApp({ REDIS_URL: server.url, RATE_LIMITS: 'off' })
  context.after(async () => {
    await t.close()
    await server.stop()
  })
  const alice = await createCustomer(t.db, 'alice', [10_000])
  const bob = await createCustomer(t.db, 'bob', [0])
  const cookie = await login(t.app, alice)
  await server.stop()
  const res = await t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { cookie, 'idempotency-key': 'gateway-down-1' },
    payload: {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1,
      currency: 'VND',
    },
  })
  assert.equal(res.statusCode, 503)
  assert.equal(res.headers['retry-after'], '1')
  assert.equal((await ledgerInvariants(t.db)).transfers, 0)
})
