import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { pathToFileURL } from 'node:url'
import { createPgDatabase } from '../../src/db/database.ts'
import { migrate } from '../../src/db/migrate.ts'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  ledgerInvariants,
  login,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { startTcpProxy } from '../helpers/index.ts'

describe('Redis down', () => {
  test('routes that need a session answer 503 with Retry-After; /health stays up; /ready names Redis; service returns', async (context) => {
    const redis = await startRedisServer()
    const t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_URL: redis.url })
    context.after(() => redis.stop())
    const alice = await createCustomer(t.db, 'alice')
    const cookie = await login(t.app, alice)
    assert.equal((await t.app.inject({ url: '/accounts', headers: { cookie } })).statusCode, 200)

    await redis.stop()
    assert.equal((await t.app.inject({ url: '/health' })).statusCode, 200)
    // /ready first: its PING waits on Redis's socket, so by its answer the gateway has seen the
    // connections close. A request sent before that may still find the session in the L1, which
    // serves until its subscriber's drop is seen.
    const ready = await t.app.inject({ url: '/ready' })
    assert.equal(ready.statusCode, 503)
    assert.equal(ready.json().redis, 'down')
    assert.equal(ready.json().postgres, 'ok')
    assert.match(ready.json().detail, /Redis/)
    const accounts = await t.app.inject({ url: '/accounts', headers: { cookie } })
    assert.equal(accounts.statusCode, 503)
    assert.equal(accounts.headers['retry-after'], '1')
    assert.equal(accounts.json().type, '/problems/session-store-unavailable')

    const restarted = await startRedisServer(redis.port)
    try {
      let status = 0
      for (let i = 0; i < 50 && status !== 200; i++) {
        status = (await t.app.inject({ url: '/ready' })).statusCode
        if (status !== 200) await new Promise((r) => setTimeout(r, 100))
      }
      assert.equal(status, 200, 'ready again once Redis is back')
      // The restarted Redis kept nothing (persistence off): the old session is gone, a new login works.
      assert.equal((await t.app.inject({ url: '/accounts', headers: { cookie } })).statusCode, 401)
      const again = await login(t.app, alice)
      assert.equal((await t.app.inject({ url: '/accounts', headers: { cookie: again } })).statusCode, 200)
    } finally {
      await t.close()
      await restarted.stop()
    }
  })
})

describe('Postgres down', { skip: USE_PGLITE && 'PGlite runs in-process' }, () => {
  test('transfers answer 503 with Retry-After and write nothing; they succeed after recovery', async (context) => {
    const database = await createTestDatabase()
    const proxy = await startTcpProxy(5432)
    const url = new URL(database.url!)
    url.port = String(proxy.port)
    const proxied = createPgDatabase({ connectionString: url.toString(), connectionTimeoutMs: 500 })
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
    const alice = await createCustomer(database.db, 'alice', [1000])
    const bob = await createCustomer(database.db, 'bob', [0])
    const cookie = await login(t.app, alice)
    const transfer = (key: string) =>
      t.app.inject({
        method: 'POST',
        url: '/transfers',
        headers: { cookie, 'idempotency-key': key },
        payload: {
          fromAccountId: alice.accountIds[0],
          toAccountId: bob.accountIds[0],
          amount: 100,
          currency: 'VND',
        },
      })

    proxy.cut()
    const key = randomUUID()
    const failed = await transfer(key)
    assert.equal(failed.statusCode, 503, failed.body)
    assert.ok(Number(failed.headers['retry-after']) > 0)
    assert.equal(failed.json().type, '/problems/database-unavailable')
    assert.equal((await t.app.inject({ url: '/health' })).statusCode, 200)
    assert.equal((await t.app.inject({ url: '/ready' })).json().postgres, 'down')

    proxy.restore()
    const retried = await transfer(key)
    assert.equal(retried.statusCode, 201, retried.body)
    const invariants = await ledgerInvariants(database.db)
    assert.equal(invariants.transfers, 1)
    assert.equal(invariants.totalUnchanged, true)
    assert.equal(invariants.unbalancedTransfers, 0)
  })
})

describe('migrations', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>
  before(async () => {
    database = await createTestDatabase()
  })
  after(() => database.drop())

  test('are recorded and applied once', async () => {
    const rows = await database.db.query<{ name: string }>('SELECT name FROM schema_migrations ORDER BY name')
    assert.ok(rows.some((r) => r.name === '001_ledger.sql'))
    assert.deepEqual(await migrate(database.db), [], 'nothing left to apply')
  })

  test('a failing migration names its file and leaves nothing applied', async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'migrations-'))
    writeFileSync(join(dir, '001_ok.sql'), 'CREATE TABLE migration_probe (id integer);')
    writeFileSync(join(dir, '002_broken.sql'), 'CREATE TABLE oops (id nosuchtype);')
    const scratch = await createTestDatabase()
    t.after(() => scratch.drop())
    await assert.rejects(
      migrate(scratch.db, pathToFileURL(`${dir}/`)),
      /^Error: Migration 002_broken\.sql failed: /,
    )
    const [probe] = await scratch.db.query<{ exists: boolean }>(
      "SELECT to_regclass('migration_probe') IS NOT NULL AS exists",
    )
    assert.equal(probe!.exists, false, 'the whole run rolled back')
  })
})
