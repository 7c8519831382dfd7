import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { loadConfig } from '../src/config.ts'
import { startRedisServer } from '../src/embedded/redis-server.ts'
import { executeScheduledTransfer } from '../src/ledger/ledger.ts'
import {
  buildTestApp,
  createCustomer,
  ledgerInvariants,
  login,
  type TestApp,
  type TestCustomer,
} from './helpers.ts'

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

async function balance(t: TestApp, accountId: number): Promise<number> {
  const [row] = await t.db.query<{ balance: string }>('SELECT balance FROM accounts WHERE id = $1', [
    accountId,
  ])
  return Number(row!.balance)
}

test('config: SCHEDULER and RECONCILIATION_PERIOD; the workers are off under NODE_ENV=test unless asked', async () => {
  const base = { NODE_ENV: 'test', SESSION_SECRET: 'x'.repeat(32) } as const
  assert.deepEqual(loadConfig(base).scheduler, { enabled: true, reconciliationPeriodMs: 86_400_000 })
  assert.deepEqual(loadConfig({ ...base, SCHEDULER: 'off', RECONCILIATION_PERIOD: '90s' }).scheduler, {
    enabled: false,
    reconciliationPeriodMs: 90_000,
  })
  assert.throws(() => loadConfig({ ...base, RECONCILIATION_PERIOD: '0s' }), /RECONCILIATION_PERIOD/)
  assert.throws(() => loadConfig({ ...base, SCHEDULER: 'yes' }), /SCHEDULER/)
  const off = await buildTestApp()
  const on = await buildTestApp({}, { scheduler: 'on' })
  const disabled = await buildTestApp({ SCHEDULER: 'off' }, { scheduler: 'on' })
  try {
    assert.equal(off.app.scheduler.job, undefined)
    assert.ok(on.app.scheduler.job)
    assert.equal(disabled.app.scheduler.job, undefined)
  } finally {
    await Promise.all([off.close(), on.close(), disabled.close()])
  }
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
})

describe('Redis loses the queue', () => {
  test('FLUSHALL mid-run: the reconciler re-queues from Postgres and every schedule runs exactly once', async () => {
    const redis = await startRedisServer()
    const t = await buildTestApp({ REDIS_URL: redis.url }, { scheduler: FAST })
    try {
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
    } finally {
      await t.close()
      await redis.stop()
    }
  })
})

describe('reconciliation job', () => {
  test('runs each period, records the run with its fence, and reports violations (log, metric)', async () => {
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
    try {
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
    } finally {
      await t.close()
    }
  })
})
