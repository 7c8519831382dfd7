import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import postgres from '../../src/db/plugin.ts'
import metrics from '../../src/plugins/metrics/index.ts'
import { createTestDatabase, type TestDatabase } from '../helpers/gateway.ts'
import { delta, scrape } from '../helpers/metrics-scrape.ts'

// The demo's Postgres plugin under the metrics plugin: statements, transactions and the pool.

async function appWith(register: (app: FastifyInstance) => Promise<void>): Promise<FastifyInstance> {
  const app = Fastify({ logger: false })
  await app.register(metrics, { processMetrics: false })
  await register(app)
  await app.ready()
  return app
}

describe('Postgres statements, transactions and pool', () => {
  let database: TestDatabase
  let app: FastifyInstance
  before(async () => {
    database = await createTestDatabase()
    app = await appWith(async (a) => {
      await a.register(postgres, { database: database.db, migrate: false })
    })
  })
  after(async () => {
    await app?.close()
    await database?.drop()
  })

  test('statements by keyword and outcome, transactions by outcome', async () => {
    const before = await scrape(app)
    await app.db.query('SELECT 1')
    await app.db.transaction(async (tx) => tx.query('SELECT 2'))
    await assert.rejects(
      app.db.transaction(async (tx) => {
        await tx.query('SELECT 3')
        throw new Error('abandon')
      }),
      /abandon/,
    )
    await assert.rejects(app.db.query('SELECT no_such_column FROM customers'))
    const moved = delta(before, await scrape(app))
    const statements = (statement: string, outcome = 'ok') =>
      moved('db_query_duration_seconds_count', { statement, outcome })
    assert.equal(statements('SELECT'), 3)
    assert.equal(statements('SELECT', 'error'), 1)
    // PGlite runs BEGIN/COMMIT inside its own transaction(), not as statements of ours.
    if (database.db.kind === 'postgres') {
      assert.equal(statements('BEGIN'), 2)
      assert.equal(statements('COMMIT'), 1)
      assert.equal(statements('ROLLBACK'), 1)
    }
    assert.equal(moved('db_transaction_duration_seconds_count', { outcome: 'commit' }), 1)
    assert.equal(moved('db_transaction_duration_seconds_count', { outcome: 'rollback' }), 1)
  })

  test('pool gauges report the pool', async () => {
    // pg drops a connection whose query failed; one successful query leaves one idle.
    await app.db.query('SELECT 1')
    const now = await scrape(app)
    if (database.db.kind === 'pglite') {
      assert.equal(now.value('db_pool_connections'), 0)
      return
    }
    assert.equal(now.value('db_pool_connections', { state: 'max' }), 20)
    assert.equal(now.value('db_pool_connections', { state: 'active' }), 0)
    assert.ok(now.value('db_pool_connections', { state: 'idle' }) >= 1)
    assert.equal(now.value('db_pool_waiting_requests'), 0)
  })

  test('after close the database is no longer observed', async () => {
    const other = await appWith(async (a) => {
      await a.register(postgres, { database: database.db, migrate: false })
    })
    const read = () => other.metrics.registry.getSingleMetricAsString('db_query_duration_seconds')
    await other.db.query('SELECT 1')
    await other.close()
    const closed = await read()
    await database.db.query('SELECT 1')
    assert.equal(await read(), closed)
    assert.match(closed, /db_query_duration_seconds_count\{statement="SELECT",outcome="ok"\} 1/)
  })
})
