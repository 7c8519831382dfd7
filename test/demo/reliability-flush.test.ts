import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { openSse, type SseConnection } from '../helpers/events-sse.ts'
import {
  buildTestApp,
  createCustomer,
  ledgerInvariants,
  login,
  type TestApp,
  type TestCustomer,
} from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

// The fault suite's Redis data loss: a FLUSHALL of the gateway's Redis in the middle of a load of
// transfers and scheduled transfers, with every customer's notification stream open. Sessions,
// idempotency records, queue entries, notification streams and markers all go; Postgres keeps what
// the guarantees need. Afterwards every transfer and every schedule ran once, and every customer's
// open stream showed each of their notifications once (counted by event id).

const CUSTOMERS = 4
const REQUESTS = 240
const IN_FLIGHT = 16
const FLUSH_AT = 100

interface Customer extends TestCustomer {
  cookie: string
  relogin: Promise<void> | null
}

interface Attempt {
  path: '/transfers' | '/scheduled-transfers'
  key: string
  customer: Customer
  body: string
  statuses: number[]
}

const SETTLED = new Set([201, 400, 404, 409, 422])

async function send(url: string, attempt: Attempt): Promise<{ status: number; retryAfter: number }> {
  try {
    const res = await fetch(url + attempt.path, {
      method: 'POST',
      headers: {
        cookie: attempt.customer.cookie,
        'content-type': 'application/json',
        'idempotency-key': attempt.key,
      },
      body: attempt.body,
      signal: AbortSignal.timeout(10_000),
    })
    const text = await res.text()
    // 409 is settled for a schedule refused by its cap, not for a key still in progress.
    const status = res.status === 409 && text.includes('idempotency-key-in-flight') ? 425 : res.status
    return { status, retryAfter: Number(res.headers.get('retry-after')) }
  } catch {
    return { status: 0, retryAfter: 0 }
  }
}

test('FLUSHALL during transfers, schedules and open notification streams: each ran once, each notification shown once', async (context) => {
  const redis = await startRedisServer()
  const t: TestApp = await buildTestApp(
    {
      REDIS_URL: redis.url,
      RATE_LIMITS: 'off',
      OUTBOX_RELAY_INTERVAL: '200ms',
      // The open streams outlive the flush that ends their sessions: no session check meanwhile.
      SSE_HEARTBEAT: '1h',
    },
    {
      eventWorkers: 'on',
      scheduler: {
        transfers: {
          moveIntervalMs: 50,
          reconcileIntervalMs: 200,
          heartbeatTtlMs: 3000,
          retryDelayMs: () => 100,
        },
        reconciliation: { periodMs: 3_600_000 },
      },
    },
  )
  const streams: SseConnection[] = []
  context.after(async () => {
    for (const stream of streams) stream.close()
    await t.close()
    await redis.stop()
  })
  const url = await listen(t.app)
  const customers: Customer[] = []
  for (let i = 0; i < CUSTOMERS; i++) {
    const customer = await createCustomer(t.db, `c${i}`, [10_000_000])
    customers.push({ ...customer, cookie: await login(t.app, customer), relogin: null })
  }
  const streamOf = new Map<number, SseConnection>()
  for (const customer of customers) {
    const stream = await openSse(`${url}/notifications`, { cookie: customer.cookie })
    assert.equal(stream.status, 200)
    streams.push(stream)
    streamOf.set(customer.customerId, stream)
  }
  // A 401 after the flush: the session is gone; the customer logs in again (once for all requests).
  const relogin = (customer: Customer) => {
    customer.relogin ??= login(t.app, customer).then((cookie) => {
      customer.cookie = cookie
      customer.relogin = null
    })
    return customer.relogin
  }

  const attempts: Attempt[] = []
  let started = 0
  let done = 0
  let flushed: Promise<unknown> | null = null
  const worker = async () => {
    while (started < REQUESTS) {
      const i = started++
      const customer = customers[i % CUSTOMERS]!
      const to = customers[(i + 1) % CUSTOMERS]!
      const fields = {
        fromAccountId: customer.accountIds[0],
        toAccountId: to.accountIds[0],
        currency: 'VND',
      }
      let attempt: Attempt
      if (i % 5 === 4 && attempts.length > 0)
        attempt = attempts[(i * 7) % attempts.length]! // a retry
      else if (i % 5 === 3) {
        // Due within a few seconds: some run before the flush, some after.
        const runAt = new Date(Date.now() + 3000 + (i % 20) * 150).toISOString()
        attempt = {
          path: '/scheduled-transfers',
          key: randomUUID(),
          customer,
          body: JSON.stringify({ ...fields, amount: 1000 + i, runAt }),
          statuses: [],
        }
        attempts.push(attempt)
      } else {
        attempt = {
          path: '/transfers',
          key: randomUUID(),
          customer,
          body: JSON.stringify({ ...fields, amount: 1 + i }),
          statuses: [],
        }
        attempts.push(attempt)
      }
      // A 401 is retried at once, logged in again: a schedule's runAt stays ahead of its retries.
      for (let n = 0; n < 3; n++) {
        const { status } = await send(url, attempt)
        attempt.statuses.push(status)
        if (status !== 401) break
        await relogin(attempt.customer)
      }
      if (++done === FLUSH_AT) flushed = t.redis.flushall()
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker))
  assert.ok(flushed, 'the flush happened during the load')
  await flushed
  // The flush lost every session: a request reading Redis gets a 401 at once; one answered by the
  // session L1 (an instance that loaded the session less than its ttlMs ago, which nothing can
  // tell of a flush) gets it once that ttl has passed.
  if (!attempts.some((a) => a.statuses.includes(401))) {
    await sleep(t.app.sessions.l1?.settings.ttlMs ?? 0)
    const customer = customers[0]!
    const res = await fetch(`${url}/accounts/${customer.accountIds[0]}/balance`, {
      headers: { cookie: customer.cookie },
    })
    assert.equal(res.status, 401, 'requests after the flush met their lost sessions')
  }

  // Every attempt is retried with its key and body until it settles, as a client would.
  for (const attempt of attempts) {
    for (let n = 0; n < 60 && !SETTLED.has(attempt.statuses.at(-1)!); n++) {
      if (attempt.statuses.at(-1) === 401) await relogin(attempt.customer)
      const { status, retryAfter } = await send(url, attempt)
      attempt.statuses.push(status)
      if (!SETTLED.has(status)) await sleep(Math.min(Math.max(retryAfter, 0.1), 1) * 1000)
    }
    assert.equal(
      attempt.statuses.at(-1),
      201,
      `${attempt.path} ${attempt.key}: ${attempt.statuses.join(',')}`,
    )
  }

  // Every schedule ran; the relay, the refill and the notifier are through.
  const schedules = attempts.filter((a) => a.path === '/scheduled-transfers')
  const transfers = attempts.filter((a) => a.path === '/transfers')
  const until = async (what: string, check: () => Promise<boolean>) => {
    const deadline = Date.now() + 60_000
    while (!(await check())) {
      assert.ok(Date.now() < deadline, what)
      await sleep(50)
    }
  }
  await until('every schedule completed', async () => {
    const [row] = await t.db.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM scheduled_transfers WHERE status = 'completed'",
    )
    return row!.n === schedules.length
  })
  const [counts] = await t.db.query<{ transfers: number }>('SELECT count(*)::int AS transfers FROM transfers')
  await until('every transfer notified', async () => {
    const [row] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM notified_events')
    return row!.n === counts!.transfers
  })
  // The refill (the stream's relay epoch set again) has been through the notifier as well.
  await until('the refill went through the notifier', async () => {
    if ((await t.redis.exists(`${t.app.events.stream}:relay-epoch`)) === 0) return false
    const groups = (await t.redis.xinfo('GROUPS', t.app.events.stream)) as unknown[][]
    const group = groups.find((g) => g[g.indexOf('name') + 1] === 'notifier') ?? []
    const info = new Map<string, unknown>()
    for (let i = 0; i + 1 < group.length; i += 2) info.set(String(group[i]), group[i + 1])
    return Number(info.get('lag')) === 0 && Number(info.get('pending')) === 0
  })

  // Each key ran once: one transfer per transfer key, one schedule per schedule key, each
  // schedule one transfer.
  const [rows] = await t.db.query<{
    keyed: number
    keys: number
    schedules: number
    scheduleKeys: number
    runs: number
  }>(
    `SELECT (SELECT count(*) FROM transfers WHERE idempotency_key IS NOT NULL)::int AS keyed,
              (SELECT count(DISTINCT (customer_id, idempotency_key)) FROM transfers
                WHERE idempotency_key IS NOT NULL)::int AS keys,
              (SELECT count(*) FROM scheduled_transfers)::int AS schedules,
              (SELECT count(DISTINCT (customer_id, idempotency_key)) FROM scheduled_transfers)::int AS "scheduleKeys",
              (SELECT count(DISTINCT transfer_id) FROM scheduled_transfers)::int AS runs`,
  )
  assert.deepEqual(rows, {
    keyed: transfers.length,
    keys: transfers.length,
    schedules: schedules.length,
    scheduleKeys: schedules.length,
    runs: schedules.length,
  })
  assert.equal(counts!.transfers, transfers.length + schedules.length)
  const ledger = await ledgerInvariants(t.db)
  assert.deepEqual(
    { ...ledger, transfers: undefined, entries: undefined },
    {
      totalUnchanged: true,
      negativeBalances: 0,
      unbalancedTransfers: 0,
      accountsNotMatchingLedger: 0,
      transfers: undefined,
      entries: undefined,
    },
  )

  // A fence per customer: a transfer made now reaches every stream; what came before it is all.
  const fence = customers[0]!
  await relogin(fence)
  for (const to of customers.slice(1)) {
    const res = await fetch(`${url}/transfers`, {
      method: 'POST',
      headers: {
        cookie: fence.cookie,
        'content-type': 'application/json',
        'idempotency-key': randomUUID(),
      },
      body: JSON.stringify({
        fromAccountId: fence.accountIds[0],
        toAccountId: to.accountIds[0],
        amount: 1,
        currency: 'VND',
      }),
    })
    assert.equal(res.status, 201)
  }
  const all = await t.db.query<{ id: number; sender: number; recipient: number }>(
    `SELECT t.id::int, t.customer_id AS sender, a.customer_id AS recipient
       FROM transfers t JOIN accounts a ON a.id = t.to_account_id ORDER BY t.id`,
  )
  for (const customer of customers) {
    const expected =
      all.filter((r) => r.sender === customer.customerId).length +
      all.filter((r) => r.recipient === customer.customerId).length
    await streamOf.get(customer.customerId)!.waitFor(expected, 30_000)
  }
  // Counted by event id: every transfer's two notifications, each shown once on its customer's stream.
  for (const customer of customers) {
    const shown = streamOf.get(customer.customerId)!.messages.map((m) => `${m.event} ${m.data.eventId}`)
    const expected = [
      ...all.filter((r) => r.sender === customer.customerId).map((r) => `transfer.sent ${r.id}`),
      ...all.filter((r) => r.recipient === customer.customerId).map((r) => `transfer.received ${r.id}`),
    ]
    assert.deepEqual([...shown].sort(), expected.sort(), `customer ${customer.username}: each once`)
  }
})
