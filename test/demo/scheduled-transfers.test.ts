import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { loadConfig } from '../../src/config.ts'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { executeScheduledTransfer } from '../../src/ledger/ledger.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  ledgerInvariants,
  login,
  type TestApp,
  type TestCustomer,
} from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'
import { delta, scrape } from '../helpers/metrics-scrape.ts'

// Scheduled transfers through HTTP, and their execution bound to the schedule row: a schedule moves
// money at most once whatever runs it (duplicate deliveries, a cancel racing its run).

const FAST = {
  transfers: { moveIntervalMs: 50, reconcileIntervalMs: 200, heartbeatTtlMs: 3000, retryDelayMs: () => 100 },
  reconciliation: { periodMs: 3_600_000 },
}

const inFuture = (ms: number) => new Date(Date.now() + ms).toISOString()

async function create(t: TestApp, cookie: string, body: Record<string, unknown>, key: string = randomUUID()) {
  return t.app.inject({
    method: 'POST',
    url: '/scheduled-transfers',
    headers: { cookie, 'idempotency-key': key },
    payload: body,
  })
}

async function statusOf(t: TestApp, scheduleId: number) {
  const [row] = await t.db.query<{ status: string; transfer_id: string | null; failure: unknown }>(
    'SELECT status, transfer_id, failure FROM scheduled_transfers WHERE id = $1',
    [scheduleId],
  )
  return row!
}

interface ScheduleJson {
  status: string
  transferId?: number
  failure: { type: string; title: string; detail: string }
}

async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | false>,
  timeoutMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value) return value as T
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

async function assertLedger(t: TestApp) {
  const { transfers, entries, ...invariants } = await ledgerInvariants(t.db)
  assert.equal(entries, transfers * 2)
  assert.deepEqual(invariants, {
    totalUnchanged: true,
    negativeBalances: 0,
    unbalancedTransfers: 0,
    accountsNotMatchingLedger: 0,
  })
}

/** Moves runAt to now by Postgres's clock, so a direct run is not early (its queue entry stays later). */
async function makeDue(t: TestApp, ids: number[]) {
  await t.db.query('UPDATE scheduled_transfers SET run_at = now() WHERE id = ANY($1::bigint[])', [ids])
}

async function balance(t: TestApp, accountId: number): Promise<number> {
  const [row] = await t.db.query<{ balance: string }>('SELECT balance FROM accounts WHERE id = $1', [
    accountId,
  ])
  return Number(row!.balance)
}

test('config: SCHEDULER, RECONCILIATION_PERIOD and SCHEDULED_TRANSFERS_MAX_PENDING; the workers are off under NODE_ENV=test unless asked', async (t) => {
  const base = { NODE_ENV: 'test', SESSION_SECRET: 'x'.repeat(32) } as const
  assert.deepEqual(loadConfig(base).scheduler, {
    enabled: true,
    reconciliationPeriodMs: 86_400_000,
    maxPending: 100,
  })
  assert.deepEqual(
    loadConfig({
      ...base,
      SCHEDULER: 'off',
      RECONCILIATION_PERIOD: '90s',
      SCHEDULED_TRANSFERS_MAX_PENDING: '7',
    }).scheduler,
    { enabled: false, reconciliationPeriodMs: 90_000, maxPending: 7 },
  )
  assert.throws(() => loadConfig({ ...base, RECONCILIATION_PERIOD: '0s' }), /RECONCILIATION_PERIOD/)
  for (const bad of ['0', '-1', '1.5', 'many'])
    assert.throws(
      () => loadConfig({ ...base, SCHEDULED_TRANSFERS_MAX_PENDING: bad }),
      /SCHEDULED_TRANSFERS_MAX_PENDING/,
    )
  assert.throws(() => loadConfig({ ...base, SCHEDULER: 'yes' }), /SCHEDULER/)
  const off = await buildTestApp()
  const on = await buildTestApp({}, { scheduler: 'on' })
  const disabled = await buildTestApp({ SCHEDULER: 'off' }, { scheduler: 'on' })
  t.after(() => Promise.all([off.close(), on.close(), disabled.close()]))
  assert.equal(off.app.scheduler.job, undefined)
  assert.ok(on.app.scheduler.job)
  assert.equal(disabled.app.scheduler.job, undefined)
})

describe('routes (workers off)', () => {
  let t: TestApp
  let alice: TestCustomer
  let bob: TestCustomer
  let cookie: string
  before(async () => {
    t = await buildTestApp()
    alice = await createCustomer(t.db, 'alice', [1_000_000, [500, 'USD']])
    bob = await createCustomer(t.db, 'bob', [0])
    cookie = await login(t.app, alice)
  })
  after(() => t?.close())

  test('create, list newest first, get, cancel; idempotent create', async () => {
    const body = {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1000,
      currency: 'VND',
      runAt: inFuture(3_600_000),
    }
    const key = randomUUID()
    const first = await create(t, cookie, body, key)
    assert.equal(first.statusCode, 201, first.body)
    const created = first.json()
    assert.equal(created.status, 'scheduled')
    assert.equal(created.runAt, new Date(body.runAt).toISOString())
    const replay = await create(t, cookie, body, key)
    assert.equal(replay.statusCode, 201)
    assert.equal(replay.headers['idempotent-replayed'], 'true')
    assert.deepEqual(replay.json(), created)
    const second = (await create(t, cookie, { ...body, amount: 2000 })).json()

    const list = await t.app.inject({ url: '/scheduled-transfers', headers: { cookie } })
    assert.equal(list.statusCode, 200)
    assert.deepEqual(
      list.json().scheduledTransfers.map((s: { scheduleId: number }) => s.scheduleId),
      [second.scheduleId, created.scheduleId],
    )
    const one = await t.app.inject({ url: `/scheduled-transfers/${created.scheduleId}`, headers: { cookie } })
    assert.deepEqual(one.json(), {
      scheduleId: created.scheduleId,
      status: 'scheduled',
      runAt: created.runAt,
    })

    // Queued in Redis under its id, due at runAt.
    const queue = t.app.scheduler.worker.queue
    assert.equal(
      Number(await t.redis.zscore(queue.keys.delayed(queue.instanceId), String(created.scheduleId))),
      Date.parse(created.runAt),
    )

    const cancel = await t.app.inject({
      method: 'DELETE',
      url: `/scheduled-transfers/${created.scheduleId}`,
      headers: { cookie },
    })
    assert.equal(cancel.statusCode, 204)
    assert.equal((await statusOf(t, created.scheduleId)).status, 'cancelled')
    const again = await t.app.inject({
      method: 'DELETE',
      url: `/scheduled-transfers/${created.scheduleId}`,
      headers: { cookie },
    })
    assert.equal(again.statusCode, 409)
    assert.equal(again.json().type, '/problems/schedule-not-cancellable')
    assert.equal(again.headers['retry-after'], '1')
    // A cancelled schedule that is delivered anyway moves nothing.
    assert.deepEqual(await executeScheduledTransfer(t.db, created.scheduleId), {
      status: 'skipped',
      current: 'cancelled',
    })
  })

  test('cancelling takes the schedule out of the queue', async () => {
    const res = await create(t, cookie, {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1000,
      currency: 'VND',
      runAt: inFuture(3_600_000),
    })
    const { scheduleId } = res.json()
    const queue = t.app.scheduler.worker.queue
    const id = String(scheduleId)
    // Also in the ready list and in another instance's delayed set (a reconciler elsewhere queued it).
    await t.redis.rpush(queue.keys.ready, id)
    await t.redis.sadd(queue.keys.instances, 'other-instance')
    await t.redis.zadd(queue.keys.delayed('other-instance'), Date.now() + 3_600_000, id)
    const cancel = await t.app.inject({
      method: 'DELETE',
      url: `/scheduled-transfers/${scheduleId}`,
      headers: { cookie },
    })
    assert.equal(cancel.statusCode, 204)
    assert.equal(await t.redis.zscore(queue.keys.delayed(queue.instanceId), id), null)
    assert.equal(await t.redis.zscore(queue.keys.delayed('other-instance'), id), null)
    assert.equal(await t.redis.lpos(queue.keys.ready, id), null)
  })

  test('4xx: runAt past or beyond a year, bad bodies, accounts, another customer, no session', async () => {
    const base = {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1000,
      currency: 'VND',
      runAt: inFuture(60_000),
    }
    const cases: Array<[Record<string, unknown>, number, string]> = [
      [{ ...base, runAt: inFuture(-1000) }, 400, '/problems/run-at-out-of-range'],
      [{ ...base, runAt: inFuture(400 * 86_400_000) }, 400, '/problems/run-at-out-of-range'],
      [{ ...base, runAt: 'tomorrow' }, 400, '/problems/validation'],
      [{ ...base, runAt: '2030-01-01T09:00:00' }, 400, '/problems/validation'],
      [{ ...base, amount: 0 }, 400, '/problems/validation'],
      [{ ...base, extra: 1 }, 400, '/problems/validation'],
      [{ ...base, toAccountId: base.fromAccountId }, 400, '/problems/same-account'],
      [
        { ...base, fromAccountId: bob.accountIds[0], toAccountId: alice.accountIds[0] },
        404,
        '/problems/account-not-found',
      ],
      [{ ...base, toAccountId: 999_999 }, 404, '/problems/account-not-found'],
      [{ ...base, fromAccountId: alice.accountIds[1] }, 422, '/problems/currency-mismatch'],
    ]
    for (const [body, status, type] of cases) {
      const res = await create(t, cookie, body)
      assert.equal(res.statusCode, status, `${JSON.stringify(body)}: ${res.body}`)
      assert.equal(res.json().type, type)
    }
    const noKey = await t.app.inject({
      method: 'POST',
      url: '/scheduled-transfers',
      headers: { cookie },
      payload: base,
    })
    assert.equal(noKey.json().type, '/problems/idempotency-key-missing')
    for (const [method, url] of [
      ['GET', '/scheduled-transfers'],
      ['GET', '/scheduled-transfers/1'],
      ['DELETE', '/scheduled-transfers/1'],
    ] as const) {
      const res = await t.app.inject({ method, url })
      assert.equal(res.statusCode, 401, `${method} ${url}`)
    }
    // Bob sees neither alice's schedule nor can he cancel it: 404 exactly like a missing one.
    const mine = (await create(t, cookie, base)).json()
    const bobCookie = await login(t.app, bob)
    for (const id of [mine.scheduleId, 987_654]) {
      for (const method of ['GET', 'DELETE'] as const) {
        const res = await t.app.inject({
          method,
          url: `/scheduled-transfers/${id}`,
          headers: { cookie: bobCookie },
        })
        assert.equal(res.statusCode, 404)
        assert.equal(res.json().type, '/problems/schedule-not-found')
      }
    }
    const bad = await t.app.inject({ url: '/scheduled-transfers/0', headers: { cookie } })
    assert.equal(bad.statusCode, 400)
    assert.equal((await statusOf(t, mine.scheduleId)).status, 'scheduled')
    const bobList = await t.app.inject({ url: '/scheduled-transfers', headers: { cookie: bobCookie } })
    assert.deepEqual(bobList.json(), { scheduledTransfers: [] })
  })
})

describe('execution (workers on)', () => {
  let t: TestApp
  let alice: TestCustomer
  let bob: TestCustomer
  let cookie: string
  before(async () => {
    t = await buildTestApp({}, { scheduler: FAST })
    alice = await createCustomer(t.db, 'alice', [1_000_000])
    bob = await createCustomer(t.db, 'bob', [0])
    cookie = await login(t.app, alice)
  })
  after(() => t?.close())

  const schedule = async (amount: number, inMs: number) => {
    const res = await create(t, cookie, {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount,
      currency: 'VND',
      runAt: inFuture(inMs),
    })
    assert.equal(res.statusCode, 201, res.body)
    return res.json().scheduleId as number
  }

  test('a due schedule completes with exactly one transfer and exact balances', async () => {
    const before = [await balance(t, alice.accountIds[0]!), await balance(t, bob.accountIds[0]!)]
    const id = await schedule(12_345, 300)
    const done = await waitFor<ScheduleJson>('completed', async () => {
      const res = await t.app.inject({ url: `/scheduled-transfers/${id}`, headers: { cookie } })
      return res.json().status === 'completed' ? res.json() : undefined
    })
    const [transfer] = await t.db.query<{ amount: string; from_account_id: number; to_account_id: number }>(
      'SELECT amount::text, from_account_id, to_account_id FROM transfers WHERE id = $1',
      [done.transferId],
    )
    assert.deepEqual(transfer, {
      amount: '12345',
      from_account_id: alice.accountIds[0],
      to_account_id: bob.accountIds[0],
    })
    assert.equal(await balance(t, alice.accountIds[0]!), before[0]! - 12_345)
    assert.equal(await balance(t, bob.accountIds[0]!), before[1]! + 12_345)
    await assertLedger(t)
    // Nothing left in the queue.
    const queue = t.app.scheduler.worker.queue
    await waitFor(
      'acknowledged',
      async () => (await t.redis.llen(queue.keys.processing(queue.instanceId))) === 0,
    )
    const cancel = await t.app.inject({
      method: 'DELETE',
      url: `/scheduled-transfers/${id}`,
      headers: { cookie },
    })
    assert.equal(cancel.statusCode, 409)
  })

  test('a schedule executed many times at once (duplicate deliveries) moves money once', async () => {
    const id = await schedule(777, 3_600_000)
    await makeDue(t, [id])
    const transfersBefore = await t.db.query<{ n: string }>('SELECT count(*)::text AS n FROM transfers')
    const alicesBefore = await balance(t, alice.accountIds[0]!)
    const worker = t.app.scheduler.worker
    const runs = await Promise.all([
      worker.run(id),
      worker.run(id),
      executeScheduledTransfer(t.db, id),
      executeScheduledTransfer(t.db, id),
      worker.run(id),
    ])
    const completed = runs.filter((r) => typeof r === 'object' && r.status === 'completed')
    assert.equal(completed.length, 1, JSON.stringify(runs))
    const transfersAfter = await t.db.query<{ n: string }>('SELECT count(*)::text AS n FROM transfers')
    assert.equal(Number(transfersAfter[0]!.n), Number(transfersBefore[0]!.n) + 1)
    assert.equal(await balance(t, alice.accountIds[0]!), alicesBefore - 777)
    const row = await statusOf(t, id)
    assert.equal(row.status, 'completed')
    // And once more later (a redelivery after the watchdog): still nothing.
    assert.deepEqual(await worker.run(id), 'finished')
    assert.equal(await balance(t, alice.accountIds[0]!), alicesBefore - 777)
  })

  test('a delivery before runAt by Postgres’s clock moves nothing and goes back into the queue', async () => {
    const alices = await balance(t, alice.accountIds[0]!)
    const id = await schedule(500, 3_600_000)
    const [{ run_at: runAt }] = (await t.db.query<{ run_at: Date }>(
      'SELECT run_at FROM scheduled_transfers WHERE id = $1',
      [id],
    )) as [{ run_at: Date }]
    // The queue delivers it now, an hour early (a clock ahead, a producer's mistake).
    const queue = t.app.scheduler.worker.queue
    assert.equal(await queue.remove(String(id)), true)
    assert.equal(await queue.schedule(String(id), Date.now() - 1000), true)
    const score = await waitFor('back in the queue, or run', async () => {
      const due = await t.redis.zscore(queue.keys.delayed(queue.instanceId), String(id))
      if (due !== null && Number(due) > Date.now() + 60_000) return Number(due)
      return (await statusOf(t, id)).status !== 'scheduled' ? -1 : undefined
    })
    // Due again at about runAt (Redis's clock plus what Postgres said was left).
    assert.ok(Math.abs(score - runAt.getTime()) < 60_000, `${score} vs ${runAt.getTime()}`)
    const [row] = await t.db.query<{ status: string; attempts: number; transfer_id: unknown }>(
      'SELECT status, attempts, transfer_id FROM scheduled_transfers WHERE id = $1',
      [id],
    )
    assert.deepEqual(row, { status: 'scheduled', attempts: 0, transfer_id: null })
    assert.equal(await balance(t, alice.accountIds[0]!), alices)
    // A direct run says the same and marks nothing.
    const direct = await t.app.scheduler.worker.run(id)
    assert.equal(typeof direct === 'object' && direct.status, 'not-due')
    assert.equal((await statusOf(t, id)).status, 'scheduled')
  })

  test('insufficient funds at run time: failed with the reason, nothing moved', async () => {
    const alices = await balance(t, alice.accountIds[0]!)
    const id = await schedule(alices + 1, 200)
    const failed = await waitFor<ScheduleJson>('failed', async () => {
      const res = await t.app.inject({ url: `/scheduled-transfers/${id}`, headers: { cookie } })
      return res.json().status === 'failed' ? res.json() : undefined
    })
    assert.equal(failed.failure.type, '/problems/insufficient-funds')
    assert.equal(failed.failure.title, 'Insufficient funds')
    assert.match(failed.failure.detail, /does not hold/)
    assert.equal(failed.transferId, undefined)
    assert.equal(await balance(t, alice.accountIds[0]!), alices)
  })

  test('cancel racing the run: exactly one wins for each schedule', async () => {
    const ids: number[] = []
    for (let i = 0; i < 30; i++) ids.push(await schedule(10, 3_600_000))
    await makeDue(t, ids)
    const alices = await balance(t, alice.accountIds[0]!)
    const worker = t.app.scheduler.worker
    const outcomes = await Promise.all(
      ids.map(async (id, i) => {
        const cancel = () =>
          t.app.inject({ method: 'DELETE', url: `/scheduled-transfers/${id}`, headers: { cookie } })
        // Alternate who starts first; both are in flight together.
        const [res] =
          i % 2
            ? await Promise.all([cancel(), worker.run(id)])
            : (await Promise.all([worker.run(id), cancel()])).reverse()
        return { id, status: (res as { statusCode: number }).statusCode }
      }),
    )
    let ran = 0
    for (const { id, status } of outcomes) {
      const row = await statusOf(t, id)
      if (status === 204) assert.equal(row.status, 'cancelled', `${id}`)
      else {
        assert.equal(status, 409, `${id}`)
        assert.equal(row.status, 'completed', `${id}`)
        ran++
      }
      const transfers = await t.db.query(
        'SELECT 1 FROM scheduled_transfers WHERE id = $1 AND transfer_id IS NOT NULL',
        [id],
      )
      assert.equal(transfers.length, row.status === 'completed' ? 1 : 0)
    }
    assert.equal(await balance(t, alice.accountIds[0]!), alices - 10 * ran)
    await assertLedger(t)
  })

  test('metrics: each run observed once by outcome, as late as Postgres says; the due count', async () => {
    const late = await schedule(321, 3_600_000)
    const refused = await schedule((await balance(t, alice.accountIds[0]!)) + 1, 3_600_000)
    const before = await scrape(t.app)
    // Due two seconds ago by Postgres's clock; their queue entries stay an hour ahead, so only the
    // direct runs below take them.
    await t.db.query(
      "UPDATE scheduled_transfers SET run_at = now() - interval '2 seconds' WHERE id = ANY($1::bigint[])",
      [[late, refused]],
    )
    const due = await scrape(t.app)
    assert.equal(delta(before, due)('scheduled_transfers_due'), 2)
    const worker = t.app.scheduler.worker
    const status = async (id: number) => {
      const run = await worker.run(id)
      return typeof run === 'object' ? run.status : run
    }
    assert.equal(await status(late), 'completed')
    assert.equal(await status(refused), 'failed')
    // Finished: not run again, not observed.
    assert.equal(await status(late), 'finished')
    const moved = delta(due, await scrape(t.app))
    assert.equal(moved('scheduled_transfers_due'), -2)
    assert.equal(moved('scheduled_transfers_lateness_seconds_count'), 2)
    for (const outcome of ['completed', 'failed']) {
      assert.equal(moved('scheduled_transfers_lateness_seconds_count', { outcome }), 1, outcome)
      // Marked running after the update that put runAt two seconds back: at least that late.
      assert.equal(moved('scheduled_transfers_lateness_seconds_bucket', { outcome, le: '1' }), 0, outcome)
      assert.equal(moved('scheduled_transfers_lateness_seconds_bucket', { outcome, le: '+Inf' }), 1, outcome)
      assert.ok(moved('scheduled_transfers_lateness_seconds_sum', { outcome }) >= 2, outcome)
    }
  })
})

describe('Redis loses the queue', () => {
  test('FLUSHALL mid-run: the reconciler re-queues from Postgres and every schedule runs exactly once', async (context) => {
    const redis = await startRedisServer()
    const t = await buildTestApp({ REDIS_URL: redis.url }, { scheduler: FAST })
    context.after(async () => {
      await t.close()
      await redis.stop()
    })
    const alice = await createCustomer(t.db, 'alice', [1_000_000])
    const bob = await createCustomer(t.db, 'bob', [0])
    const cookie = await login(t.app, alice)
    const ids: number[] = []
    const start = Date.now()
    for (let i = 0; i < 40; i++) {
      const res = await create(t, cookie, {
        fromAccountId: alice.accountIds[0],
        toAccountId: bob.accountIds[0],
        amount: 100 + i,
        currency: 'VND',
        // Half due soon, half after the flush; each in the future when sent, on a slow machine too.
        runAt: new Date(
          i % 2 === 0 ? Date.now() + 800 + i * 10 : Math.max(start + 6000, Date.now() + 1000) + i * 10,
        ).toISOString(),
      })
      assert.equal(res.statusCode, 201, res.body)
      ids.push(res.json().scheduleId)
    }
    await waitFor('some completed', async () => {
      const [row] = await t.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM scheduled_transfers WHERE status = 'completed'",
      )
      return row!.n > 0
    })
    const queue = t.app.scheduler.worker.queue
    assert.ok((await t.redis.zcard(queue.keys.delayed(queue.instanceId))) > 0, 'some still queued')
    await t.redis.flushall()
    await waitFor(
      'all completed',
      async () => {
        const [row] = await t.db.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM scheduled_transfers WHERE status = 'completed'",
        )
        return row!.n === ids.length
      },
      30_000,
    )
    const rows = await t.db.query<{ id: string; amount: string; transfers: number }>(
      `SELECT s.id, s.amount, (SELECT count(*)::int FROM transfers t WHERE t.id = s.transfer_id) AS transfers
         FROM scheduled_transfers s ORDER BY s.id`,
    )
    assert.ok(rows.every((r) => r.transfers === 1))
    const [count] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM transfers')
    assert.equal(count!.n, ids.length)
    const total = ids.reduce((sum, _, i) => sum + 100 + i, 0)
    assert.equal(await balance(t, bob.accountIds[0]!), total)
    assert.equal(await balance(t, alice.accountIds[0]!), 1_000_000 - total)
    await assertLedger(t)
  })
})

describe('the guarantees of POST /transfers', () => {
  const body = (alice: TestCustomer, bob: TestCustomer, runAt: string, amount = 1000) => ({
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount,
    currency: 'VND',
    runAt,
  })
  const countSchedules = async (t: TestApp) =>
    (await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM scheduled_transfers'))[0]!.n

  test('Redis lost the idempotency record: a retry replays from Postgres, one schedule, one run', async (c) => {
    const redis = await startRedisServer()
    c.after(() => redis.stop())
    const t = await buildTestApp({ REDIS_URL: redis.url }, { scheduler: FAST })
    c.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1_000_000])
    const bob = await createCustomer(t.db, 'bob', [0])
    const key = randomUUID()
    const request = body(alice, bob, inFuture(1500), 4321)
    const first = await create(t, await login(t.app, alice), request, key)
    assert.equal(first.statusCode, 201, first.body)

    await t.redis.flushall()
    // The session went with it.
    const cookie = await login(t.app, alice)
    const mismatch = await create(t, cookie, { ...request, amount: 4322 }, key)
    assert.equal(mismatch.statusCode, 422, mismatch.body)
    assert.equal(mismatch.json().type, '/problems/idempotency-key-mismatch')
    const retry = await create(t, cookie, request, key)
    assert.equal(retry.statusCode, 201, retry.body)
    assert.equal(retry.headers['idempotent-replayed'], 'true')
    assert.equal(retry.body, first.body)
    assert.equal(await countSchedules(t), 1)

    const { scheduleId } = first.json()
    await waitFor('completed', async () => (await statusOf(t, scheduleId)).status === 'completed')
    const [transfers] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM transfers')
    assert.equal(transfers!.n, 1)
    assert.equal(await balance(t, alice.accountIds[0]!), 1_000_000 - 4321)
    assert.equal(await balance(t, bob.accountIds[0]!), 4321)
    await assertLedger(t)
  })

  test('creating a schedule counts against the per-customer transfers rate limit', async (c) => {
    const t = await buildTestApp({ RATE_LIMIT_TRANSFERS: '2/60s' }, { rateLimits: 'on' })
    c.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1_000_000])
    const bob = await createCustomer(t.db, 'bob', [0])
    const cookie = await login(t.app, alice)
    for (let i = 0; i < 2; i++) {
      const res = await create(t, cookie, body(alice, bob, inFuture(3_600_000)))
      assert.equal(res.statusCode, 201, res.body)
    }
    const limited = await create(t, cookie, body(alice, bob, inFuture(3_600_000)))
    assert.equal(limited.statusCode, 429, limited.body)
    assert.equal(limited.json().type, '/problems/rate-limited')
    assert.equal(limited.json().policy, 'transfers')
    // One budget with POST /transfers.
    const transfer = await t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': randomUUID() },
      payload: {
        fromAccountId: alice.accountIds[0],
        toAccountId: bob.accountIds[0],
        amount: 1,
        currency: 'VND',
      },
    })
    assert.equal(transfer.statusCode, 429)
    assert.equal(await countSchedules(t), 2)
  })

  test('a cap on pending schedules per customer holds under concurrent requests', async (c) => {
    const t = await buildTestApp({ SCHEDULED_TRANSFERS_MAX_PENDING: '3' })
    c.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1_000_000])
    const bob = await createCustomer(t.db, 'bob', [0])
    const cookie = await login(t.app, alice)
    const bobCookie = await login(t.app, bob)
    const url = await listen(t.app)
    const post = (cookieHeader: string, payload: unknown) =>
      fetch(`${url}/scheduled-transfers`, {
        method: 'POST',
        headers: {
          cookie: cookieHeader,
          'idempotency-key': randomUUID(),
          'content-type': 'application/json',
        },
        body: JSON.stringify(payload),
      })
    const runAt = inFuture(3_600_000)
    const responses = await Promise.all(
      Array.from({ length: 12 }, () => post(cookie, body(alice, bob, runAt))),
    )
    const statuses = responses.map((r) => r.status).sort()
    assert.deepEqual(statuses, [...Array(3).fill(201), ...Array(9).fill(409)])
    for (const res of responses.filter((r) => r.status === 409)) {
      const problem = (await res.json()) as { type: string }
      assert.equal(problem.type, '/problems/too-many-pending-schedules')
      // Until the earliest pending one is due, about an hour.
      assert.ok(Number(res.headers.get('retry-after')) > 60, String(res.headers.get('retry-after')))
    }
    const pending = async (customerId: number) =>
      (
        await t.db.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM scheduled_transfers WHERE customer_id = $1 AND status IN ('scheduled', 'running')",
          [customerId],
        )
      )[0]!.n
    assert.equal(await pending(alice.customerId), 3)
    // Per customer: bob is not held back by alice's schedules.
    assert.equal((await post(bobCookie, body(bob, alice, runAt))).status, 201)
    // Finished and cancelled ones do not count.
    const [oldest] = await t.db.query<{ id: string }>(
      'SELECT id FROM scheduled_transfers WHERE customer_id = $1 ORDER BY id LIMIT 1',
      [alice.customerId],
    )
    const cancel = await t.app.inject({
      method: 'DELETE',
      url: `/scheduled-transfers/${oldest!.id}`,
      headers: { cookie },
    })
    assert.equal(cancel.statusCode, 204)
    assert.equal((await post(cookie, body(alice, bob, runAt))).status, 201)
    assert.equal(await pending(alice.customerId), 3)
  })

  test('schedules created while transfers run between the same two accounts: no deadlock, every request a 201', async (c) => {
    const t = await buildTestApp({ SCHEDULED_TRANSFERS_MAX_PENDING: '1000' })
    c.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1_000_000])
    const bob = await createCustomer(t.db, 'bob', [1_000_000])
    const [aliceCookie, bobCookie] = [await login(t.app, alice), await login(t.app, bob)]
    const url = await listen(t.app)
    // bob's account has the higher id: a schedule from it checks its two accounts' keys high then
    // low, while a transfer locks them low then high.
    assert.ok(bob.accountIds[0]! > alice.accountIds[0]!)
    const post = (path: string, cookie: string, payload: unknown) =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: { cookie, 'idempotency-key': randomUUID(), 'content-type': 'application/json' },
        body: JSON.stringify(payload),
      })
    const runAt = inFuture(3_600_000)
    const responses = await Promise.all(
      Array.from({ length: 160 }, (_, i) =>
        i % 2 === 0
          ? post('/scheduled-transfers', bobCookie, body(bob, alice, runAt))
          : post('/transfers', aliceCookie, {
              fromAccountId: alice.accountIds[0],
              toAccountId: bob.accountIds[0],
              amount: 1,
              currency: 'VND',
            }),
      ),
    )
    const statuses = new Map<number, number>()
    for (const res of responses) statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
    assert.deepEqual([...statuses], [[201, 160]])
    const [rows] = await t.db.query<{ schedules: number; transfers: number }>(
      'SELECT (SELECT count(*) FROM scheduled_transfers)::int AS schedules, (SELECT count(*) FROM transfers)::int AS transfers',
    )
    assert.deepEqual(rows, { schedules: 80, transfers: 80 })
  })
})

describe('reconciliation job', () => {
  test('runs each period, records the run with its fence, and reports violations (log, metric)', async (context) => {
    const t = await buildTestApp(
      {},
      {
        scheduler: {
          ...FAST,
          reconciliation: {
            periodMs: 200,
            maxWorkTimeMs: 1000,
            bufferMs: 500,
            watchdogIntervalMs: 2000,
            moveIntervalMs: 50,
          },
        },
      },
    )
    context.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1000])
    const ok = await waitFor('a consistent run', async () => {
      const rows = await t.db.query<{ result: string; fence: string; instance_id: string }>(
        "SELECT result, fence::text, instance_id FROM reconciliation_runs WHERE result = 'ok'",
      )
      return rows[0]
    })
    assert.equal(ok.instance_id, t.app.scheduler.worker.queue.instanceId)
    assert.ok(Number(ok.fence) > 0)
    // A balance that its entries do not explain.
    await t.db.query('UPDATE accounts SET balance = balance + 5 WHERE id = $1', [alice.accountIds[0]])
    const bad = await waitFor('a run with violations', async () => {
      const rows = await t.db.query<{ violations: unknown; violation_count: number }>(
        "SELECT violations, violation_count FROM reconciliation_runs WHERE result = 'violations'",
      )
      return rows[0]
    })
    assert.equal(bad.violation_count, 1)
    assert.deepEqual(bad.violations, [{ kind: 'balance-mismatch', id: alice.accountIds[0], amount: '5' }])
    const metrics = await t.app.inject({ url: '/metrics' })
    assert.match(metrics.body, /reconciliation_runs_total\{result="violations"\} [1-9]/)
    assert.match(metrics.body, /reconciliation_violations 1/)
    // Fences grow with the runs.
    const runs = await t.db.query<{ fence: string }>(
      'SELECT fence::text FROM reconciliation_runs ORDER BY started_at',
    )
    const fences = runs.map((r) => BigInt(r.fence))
    assert.ok(fences.every((f, i) => i === 0 || f > fences[i - 1]!))
  })

  test('a run that fails is retried with backoff until the period has a completed run', async (t) => {
    const database = await createTestDatabase()
    t.after(() => database.drop())
    // The transient failure: the ledger's entries are missing for the first attempts.
    await database.db.query('ALTER TABLE ledger_entries RENAME TO ledger_entries_away')
    const app = await buildTestApp(
      {},
      {
        testDatabase: database,
        scheduler: {
          ...FAST,
          reconciliation: {
            // One period is the whole test, and the watchdog never re-seeds within it: only the
            // trigger's retries can complete the period.
            periodMs: 3_600_000,
            maxWorkTimeMs: 1000,
            bufferMs: 500,
            watchdogIntervalMs: 600_000,
            moveIntervalMs: 50,
            retryDelayMs: (attempt) => 50 * attempt,
          },
        },
      },
    )
    t.after(() => app.close())
    const runs = () =>
      database.db.query<{ result: string | null; fence: string }>(
        'SELECT result, fence::text FROM reconciliation_runs ORDER BY id',
      )
    await waitFor('a failed run', async () => (await runs()).some((r) => r.result === 'error'))
    await database.db.query('ALTER TABLE ledger_entries_away RENAME TO ledger_entries')
    await waitFor('a completed run', async () => (await runs()).some((r) => r.result === 'ok'))
    const list = await runs()
    // Failed runs first, then exactly one completed run, which re-armed the trigger for the next period.
    assert.deepEqual(
      list.map((r) => r.result),
      [...list.slice(0, -1).map(() => 'error'), 'ok'],
    )
    const fences = list.map((r) => BigInt(r.fence))
    assert.ok(fences.every((f, i) => i === 0 || f > fences[i - 1]!))
    const job = app.app.scheduler.job!
    const due = await waitFor('the trigger re-armed', () =>
      app.redis.zscore(job.queue.keys.delayed(job.queue.instanceId), job.token),
    )
    assert.ok(Number(due) > Date.now() + 1_800_000, 'due about one period later')
    const metrics = await app.app.inject({ url: '/metrics' })
    assert.match(metrics.body, /reconciliation_runs_total\{result="error"\} [1-9]/)
    assert.match(metrics.body, /reconciliation_runs_total\{result="ok"\} 1/)
  })
})
