import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { Registry } from 'prom-client'
import type { Database } from '../../src/db/database.ts'
import { createBloomFilter } from '../../src/index.ts'
import { type AccountFilterState, createAccountFilter } from '../../src/ledger/account-filter.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestCustomer,
} from '../helpers/gateway.ts'
import { parse, scrape } from '../helpers/metrics-scrape.ts'

// The demo's account filter against accounts that appear behind the gateway's back: a bulk import
// larger than one call of the Bloom filter's `add` takes, and a database replaced by another whose
// ids start again. Every account that exists answers 200; a made-up id still costs no query.

let t: TestApp
let owner: TestCustomer
let cookie: string

before(async () => {
  t = await buildTestApp({ RATE_LIMITS: 'off' }, { accountFilter: 'on' })
  owner = await createCustomer(t.db, 'importer', [1_000])
  await t.app.accountFilter.catchUp()
  cookie = await login(t.app, owner)
})
after(() => t.close())

/** `count` accounts of `customerId`, inserted in one statement; their ids. */
async function bulkInsert(db: TestApp['db'], customerId: number, count: number): Promise<number[]> {
  const rows = await db.query<{ id: number }>(
    `INSERT INTO accounts (customer_id, currency, balance, opening_balance)
     SELECT $1, 'VND', 0, 0 FROM generate_series(1, $2::integer) RETURNING id`,
    [customerId, count],
  )
  return rows.map((row) => row.id).sort((a, b) => a - b)
}

/** The gateway's filter read directly: what it holds, not what a read falls through to. */
const bloomOf = (app: TestApp) =>
  createBloomFilter(app.redis, {
    key: `${app.prefix}accounts`,
    expectedItems: 1_000_000,
    falsePositiveRate: 0.01,
  })

const balance = (app: TestApp['app'], id: number, cookieHeader = cookie) =>
  app.inject({ method: 'GET', url: `/accounts/${id}/balance`, headers: { cookie: cookieHeader } })

test('accounts imported in bulk answer 200 at once and after every catch-up', async () => {
  const ids = await bulkInsert(t.db, owner.customerId, 6_001)
  // Before any catch-up: the filter has not seen them, Postgres has.
  for (const id of [ids[0]!, ids[3000]!, ids.at(-1)!])
    assert.equal((await balance(t.app, id)).statusCode, 200, `account ${id} before the catch-up`)

  await t.app.accountFilter.catchUp()
  const answers = await bloomOf(t).check(ids.slice(0, 5000).map(String))
  const rest = await bloomOf(t).check(ids.slice(5000).map(String))
  assert.deepEqual(
    [...answers, ...rest].filter((answer) => answer !== 'maybe'),
    [],
    'the catch-up added every imported id',
  )
  assert.equal((await t.redis.get(`${t.prefix}accounts:newest`))?.split(':')[0], String(ids.at(-1)))

  // One created after the import, behind the gateway's back too, then one more catch-up.
  const [later] = await bulkInsert(t.db, owner.customerId, 1)
  assert.equal((await balance(t.app, later!)).statusCode, 200)
  await t.app.accountFilter.catchUp()
  assert.equal(await bloomOf(t).check(String(later)), 'maybe')
  for (const id of [ids[0]!, ids[4999]!, ids[5000]!, ids.at(-1)!, later!])
    assert.equal((await balance(t.app, id)).statusCode, 200, `account ${id}`)

  // Made-up ids, below and above the newest account: 404, and none of them cached.
  for (const id of [later! + 1, later! + 1_000_000]) assert.equal((await balance(t.app, id)).statusCode, 404)
  assert.equal(await t.app.accountFilter.mightExist(later! + 1_000_000), false)
})

test('a database whose ids start again is met with a rebuild, not with the old filter', async () => {
  // The old database: 1,500 accounts with a gap at the 10th (an insert rolled back, a deletion).
  const old = await createTestDatabase()
  const replaced = await createTestDatabase()
  const keyPrefix = `${t.prefix}restore:`
  let first: TestApp | undefined
  let second: TestApp | undefined
  try {
    first = await buildTestApp({ RATE_LIMITS: 'off' }, { accountFilter: 'on', testDatabase: old, keyPrefix })
    const oldOwner = await createCustomer(old.db, 'old', [])
    const oldIds = await bulkInsert(old.db, oldOwner.customerId, 1_500)
    await old.db.query('DELETE FROM accounts WHERE id = $1', [oldIds[9]])
    await first.app.accountFilter.catchUp()
    assert.equal(await bloomOf(first).check(String(oldIds[9])), 'absent')
    await first.close()
    first = undefined

    // The same Redis, a new database: its 10th account exists.
    const newOwner = await createCustomer(replaced.db, 'new', [])
    const newIds = await bulkInsert(replaced.db, newOwner.customerId, 1_500)
    assert.equal(newIds[9], oldIds[9])
    second = await buildTestApp(
      { RATE_LIMITS: 'off' },
      { accountFilter: 'on', testDatabase: replaced, keyPrefix },
    )
    await second.app.accountFilter.settled()
    assert.equal(await bloomOf(second).check(String(newIds[9])), 'maybe')
    const newCookie = await login(second.app, newOwner)
    for (const id of [newIds[0]!, newIds[9]!, newIds.at(-1)!])
      assert.equal((await balance(second.app, id, newCookie)).statusCode, 200, `account ${id}`)
  } finally {
    await first?.close()
    await second?.close()
    await old.drop()
    await replaced.drop()
  }
})

const STATES: AccountFilterState[] = ['starting', 'building', 'ready', 'degraded']

/** The state whose `account_filter_state` series is 1 (every other at 0). */
function reportedState(metrics: ReturnType<typeof parse>): AccountFilterState {
  const on = STATES.filter((state) => metrics.value('account_filter_state', { state }) === 1)
  const off = STATES.filter((state) => metrics.value('account_filter_state', { state }) === 0)
  assert.equal(on.length, 1, `one state at 1: ${on}`)
  assert.equal(off.length, STATES.length - 1)
  return on[0]!
}

test('metrics: the filter reports its state (starting, building, degraded, ready) and how far Postgres is ahead of its catch-up', async () => {
  // The gateway's filter, on GET /metrics.
  await t.app.accountFilter.catchUp()
  assert.equal(reportedState(await scrape(t.app)), 'ready')

  // A filter of its own (not started: no timer), whose rebuild's first query fails while `gated`.
  let gated = false
  let arrived = () => {}
  let fail: (err: Error) => void = () => {}
  const db = {
    query: async (sql: string, params?: unknown[]) => {
      if (gated && /ORDER BY id DESC LIMIT 1/.test(sql)) {
        arrived()
        await new Promise((_, reject) => {
          fail = reject
        })
      }
      return t.db.query(sql, params)
    },
  } as unknown as Database
  const registry = new Registry()
  const filter = createAccountFilter({
    db,
    redis: t.redis,
    key: `${t.prefix}metrics-filter`,
    capacity: 10_000,
    registry,
  })
  const read = async () => parse(await registry.metrics())
  assert.equal(reportedState(await read()), 'starting')

  // Never built: the catch-up rebuilds it, and the rebuild fails.
  gated = true
  const waiting = new Promise<void>((resolve) => {
    arrived = resolve
  })
  const failing = filter.catchUp()
  await waiting
  assert.equal(filter.state(), 'building')
  assert.equal(reportedState(await read()), 'building')
  fail(new Error('Postgres unreachable'))
  await failing
  assert.equal(reportedState(await read()), 'degraded')

  // Built at the next catch-up: ready, nothing behind.
  gated = false
  await filter.catchUp()
  let metrics = await read()
  assert.equal(reportedState(metrics), 'ready')
  assert.equal(metrics.value('account_filter_catch_up_lag'), 0)

  // Accounts inserted behind its back: once the filter has read Postgres' newest id (a read of an
  // id above what it covers asks), it is ahead by their ids, until a catch-up. A scrape itself
  // never queries Postgres.
  const newest = async () =>
    (await t.db.query<{ id: number }>('SELECT max(id)::int AS id FROM accounts'))[0]!.id
  const covered = await newest()
  await bulkInsert(t.db, owner.customerId, 3)
  assert.equal((await read()).value('account_filter_catch_up_lag'), 0, 'nothing read yet')
  assert.equal(await filter.mightExist((await newest()) + 1), false)
  metrics = await read()
  assert.equal(metrics.value('account_filter_catch_up_lag'), (await newest()) - covered)
  assert.ok(metrics.value('account_filter_catch_up_lag') >= 3)
  await filter.catchUp()
  metrics = await read()
  assert.equal(metrics.value('account_filter_catch_up_lag'), 0)
  assert.equal(reportedState(metrics), 'ready')
  await filter.stop()
})
