import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import type { FastifyInstance } from 'fastify'
import { openSse } from '../helpers/events-sse.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

function postTransfer(
  app: FastifyInstance,
  cookie: string,
  payload: unknown,
  headers: Record<string, string> = {},
) {
  return app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { cookie, 'idempotency-key': randomUUID(), 'content-type': 'application/json', ...headers },
    payload: typeof payload === 'string' ? payload : JSON.stringify(payload),
  })
}

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let aliceCookie: string
let bobCookie: string

before(async () => {
  t = await buildTestApp({ RATE_LIMITS: 'off' })
  alice = await createCustomer(t.db, 'alice', [1000, [500, 'USD']])
  bob = await createCustomer(t.db, 'bob', [2000])
  aliceCookie = await login(t.app, alice)
  bobCookie = await login(t.app, bob)
})
after(() => t.close())

async function snapshot() {
  const [row] = await t.db.query<{ balances: string; transfers: string; entries: string }>(
    `SELECT (SELECT string_agg(id || ':' || balance, ',' ORDER BY id) FROM accounts) AS balances,
            (SELECT count(*) FROM transfers)::text AS transfers,
            (SELECT count(*) FROM ledger_entries)::text AS entries`,
  )
  return row
}

describe('operations', () => {
  test('GET /health answers 200', async () => {
    const res = await t.app.inject({ url: '/health' })
    assert.equal(res.statusCode, 200)
    assert.deepEqual(res.json(), { status: 'ok' })
  })

  test('GET /ready reports both dependencies', async () => {
    const res = await t.app.inject({ url: '/ready' })
    assert.equal(res.statusCode, 200)
    assert.deepEqual(res.json(), { status: 'ready', redis: 'ok', postgres: 'ok' })
  })

  test('GET /docs/json is the OpenAPI document with every route', async () => {
    const res = await t.app.inject({ url: '/docs/json' })
    assert.equal(res.statusCode, 200)
    const paths = Object.keys(res.json().paths)
    for (const path of [
      '/session',
      '/accounts',
      '/accounts/{accountId}/balance',
      '/transfers',
      '/health',
      '/ready',
    ]) {
      assert.ok(paths.includes(path), `${path} documented`)
    }
  })

  test('unknown routes answer a problem+json 404', async () => {
    const res = await t.app.inject({ url: '/nope' })
    assert.equal(res.statusCode, 404)
    assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
    assert.equal(res.json().type, '/problems/not-found')
  })
})

describe('session routes', () => {
  test('bad credentials: 401 with its own type, no cookie', async () => {
    for (const payload of [
      { username: 'alice', password: 'wrong' },
      { username: 'nobody', password: 'whatever' },
    ]) {
      const res = await t.app.inject({ method: 'POST', url: '/session', payload })
      assert.equal(res.statusCode, 401)
      assert.equal(res.json().type, '/problems/bad-credentials')
      assert.equal(res.headers['set-cookie'], undefined)
    }
  })

  test('malformed login bodies: 400', async () => {
    for (const payload of [
      '{',
      '{"username":"alice"}',
      '{"username":1,"password":"x"}',
      '{"username":"a","password":"b","x":1}',
    ]) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/session',
        headers: { 'content-type': 'application/json' },
        payload,
      })
      assert.equal(res.statusCode, 400, payload)
      assert.match(res.headers['content-type'] as string, /^application\/problem\+json/)
    }
  })

  test('GET /session describes the session; without a cookie 401', async () => {
    const res = await t.app.inject({ url: '/session', headers: { cookie: aliceCookie } })
    assert.equal(res.statusCode, 200)
    const body = res.json()
    assert.equal(body.customerId, alice.customerId)
    assert.ok(Date.parse(body.createdAt) <= Date.parse(body.expiresAt))
    assert.ok(Date.parse(body.expiresAt) <= Date.parse(body.absoluteExpiresAt))
    assert.equal((await t.app.inject({ url: '/session' })).statusCode, 401)
  })
})

describe('accounts', () => {
  test('GET /accounts lists only your accounts', async () => {
    const res = await t.app.inject({ url: '/accounts', headers: { cookie: aliceCookie } })
    assert.equal(res.statusCode, 200)
    assert.deepEqual(res.json(), {
      accounts: [
        { accountId: alice.accountIds[0], currency: 'VND', balance: 1000 },
        { accountId: alice.accountIds[1], currency: 'USD', balance: 500 },
      ],
    })
    assert.equal((await t.app.inject({ url: '/accounts' })).statusCode, 401)
  })

  test('balance of your account: 200; of another customer or unknown: the same 404', async () => {
    const own = await t.app.inject({
      url: `/accounts/${alice.accountIds[0]}/balance`,
      headers: { cookie: aliceCookie },
    })
    assert.equal(own.statusCode, 200)
    assert.deepEqual(own.json(), { accountId: alice.accountIds[0], currency: 'VND', balance: 1000 })
    const other = await t.app.inject({
      url: `/accounts/${bob.accountIds[0]}/balance`,
      headers: { cookie: aliceCookie },
    })
    const unknown = await t.app.inject({ url: '/accounts/999999/balance', headers: { cookie: aliceCookie } })
    assert.equal(other.statusCode, 404)
    assert.equal(unknown.statusCode, 404)
    assert.equal(other.json().type, unknown.json().type)
  })

  test('malformed account ids: 400', async () => {
    for (const id of ['abc', '0', '-1', '1.5', '99999999999', '1e3']) {
      const res = await t.app.inject({ url: `/accounts/${id}/balance`, headers: { cookie: aliceCookie } })
      assert.equal(res.statusCode, 400, id)
    }
  })
})

describe('transfers', () => {
  test('a transfer moves the money and writes two balanced ledger entries', async () => {
    const res = await postTransfer(t.app, aliceCookie, {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 300,
      currency: 'VND',
    })
    assert.equal(res.statusCode, 201)
    const body = res.json()
    assert.equal(body.amount, 300)
    assert.equal(body.fromAccountId, alice.accountIds[0])
    const entries = await t.db.query<{ account_id: number; amount: string }>(
      'SELECT account_id, amount::text FROM ledger_entries WHERE transfer_id = $1 ORDER BY amount',
      [body.transferId],
    )
    assert.deepEqual(entries, [
      { account_id: alice.accountIds[0], amount: '-300' },
      { account_id: bob.accountIds[0], amount: '300' },
    ])
    const [a] = await t.db.query<{ balance: string }>('SELECT balance::text FROM accounts WHERE id = $1', [
      alice.accountIds[0],
    ])
    assert.equal(a!.balance, '700')
  })

  test('bad input gets a clear 4xx and writes nothing', async () => {
    const from = alice.accountIds[0]!
    const to = bob.accountIds[0]!
    const cases: Array<[string, unknown, number, string?]> = [
      ['malformed JSON', '{"fromAccountId":', 400],
      ['not an object', '[]', 400],
      ['amount as text', { fromAccountId: from, toAccountId: to, amount: '10', currency: 'VND' }, 400],
      ['negative amount', { fromAccountId: from, toAccountId: to, amount: -5, currency: 'VND' }, 400],
      ['zero amount', { fromAccountId: from, toAccountId: to, amount: 0, currency: 'VND' }, 400],
      ['fractional amount', { fromAccountId: from, toAccountId: to, amount: 1.5, currency: 'VND' }, 400],
      [
        'unsafe integer',
        '{"fromAccountId":1,"toAccountId":2,"amount":9007199254740993,"currency":"VND"}',
        400,
      ],
      ['huge amount', { fromAccountId: from, toAccountId: to, amount: 1e300, currency: 'VND' }, 400],
      ['missing field', { fromAccountId: from, toAccountId: to, amount: 1 }, 400],
      ['extra field', { fromAccountId: from, toAccountId: to, amount: 1, currency: 'VND', memo: 'x' }, 400],
      ['bad currency', { fromAccountId: from, toAccountId: to, amount: 1, currency: 'vnd' }, 400],
      ['id beyond integer', { fromAccountId: from, toAccountId: 2 ** 31, amount: 1, currency: 'VND' }, 400],
      [
        'same account',
        { fromAccountId: from, toAccountId: from, amount: 1, currency: 'VND' },
        400,
        '/problems/same-account',
      ],
      ['unknown target', { fromAccountId: from, toAccountId: 999_999, amount: 1, currency: 'VND' }, 404],
      ['unknown source', { fromAccountId: 999_999, toAccountId: to, amount: 1, currency: 'VND' }, 404],
      [
        "another customer's source",
        { fromAccountId: to, toAccountId: from, amount: 1, currency: 'VND' },
        404,
      ],
      [
        'currency mismatch',
        { fromAccountId: alice.accountIds[1], toAccountId: to, amount: 1, currency: 'USD' },
        422,
        '/problems/currency-mismatch',
      ],
      [
        'insufficient funds',
        { fromAccountId: from, toAccountId: to, amount: 10_000_000, currency: 'VND' },
        422,
        '/problems/insufficient-funds',
      ],
      ['oversized body', JSON.stringify({ fromAccountId: from, pad: 'x'.repeat(20_000) }), 413],
    ]
    const before = await snapshot()
    for (const [name, payload, status, type] of cases) {
      const res = await postTransfer(t.app, aliceCookie, payload)
      assert.equal(res.statusCode, status, `${name}: ${res.body}`)
      assert.match(res.headers['content-type'] as string, /^application\/problem\+json/, name)
      const problem = res.json()
      assert.equal(problem.status, status, name)
      assert.ok(problem.title && problem.detail && problem.type, name)
      if (type) assert.equal(problem.type, type, name)
    }
    assert.deepEqual(await snapshot(), before)
  })

  test('wrong content type: 415, nothing written', async () => {
    const before = await snapshot()
    const res = await postTransfer(t.app, aliceCookie, 'fromAccountId=1', { 'content-type': 'text/plain' })
    assert.equal(res.statusCode, 415)
    assert.deepEqual(await snapshot(), before)
  })

  test('without a session: 401, nothing written', async () => {
    const before = await snapshot()
    const res = await postTransfer(t.app, 'sid=nothing', {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1,
      currency: 'VND',
    })
    assert.equal(res.statusCode, 401)
    assert.deepEqual(await snapshot(), before)
  })

  test('bob can pay alice back', async () => {
    const res = await postTransfer(t.app, bobCookie, {
      fromAccountId: bob.accountIds[0],
      toAccountId: alice.accountIds[0],
      amount: 300,
      currency: 'VND',
    })
    assert.equal(res.statusCode, 201)
  })
})

describe('notifications', () => {
  test('a session ended on another instance closes its stream at the next heartbeat, whatever slot its key is in', async (t) => {
    const here = await buildTestApp({ RATE_LIMITS: 'off', SSE_HEARTBEAT: '100ms' })
    const elsewhere = await buildTestApp(
      { RATE_LIMITS: 'off' },
      { testDatabase: { db: here.db, drop: async () => {} }, keyPrefix: here.basePrefix },
    )
    t.after(async () => {
      await elsewhere.close()
      await here.close()
    })
    const url = await listen(here.app)
    // Several customers' sessions: on a Redis Cluster their keys sit in different slots.
    const customers = await Promise.all(
      ['carol', 'dave', 'erin'].map((name) => createCustomer(here.db, name, [1000])),
    )
    const cookies = await Promise.all(customers.map((c) => login(here.app, c)))
    const streams = await Promise.all(cookies.map((cookie) => openSse(`${url}/notifications`, { cookie })))
    assert.deepEqual(
      streams.map((s) => s.status),
      [200, 200, 200],
    )
    const out = await elsewhere.app.inject({
      method: 'DELETE',
      url: '/session',
      headers: { cookie: cookies[0]! },
    })
    assert.equal(out.statusCode, 204)
    const timedOut = new Promise<string>((resolve) => setTimeout(resolve, 10_000, 'still open').unref())
    assert.equal(await Promise.race([streams[0]!.ended.then(() => 'ended'), timedOut]), 'ended')
    assert.equal(here.app.events.hub.count(customers[1]!.customerId), 1, 'the others stay open')
    for (const s of streams) s.close()
  })
})
