import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { describe, test } from 'node:test'
import { buildTestApp, createCustomer, login } from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

const attempt = (app: Awaited<ReturnType<typeof buildTestApp>>['app'], username: string, password: string) =>
  app.inject({ method: 'POST', url: '/session', payload: { username, password } })

describe('login brute force', () => {
  test('failed logins per username are throttled; successes never count; other usernames unaffected', async (context) => {
    const t = await buildTestApp(
      { RATE_LIMIT_LOGIN: '3/60s', RATE_LIMIT_IP: '1000,1000' },
      { rateLimits: 'on' },
    )
    context.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice')
    const bob = await createCustomer(t.db, 'bob')
    for (let i = 0; i < 10; i++)
      assert.equal((await attempt(t.app, alice.username, alice.password)).statusCode, 200)
    for (let i = 0; i < 3; i++) assert.equal((await attempt(t.app, alice.username, 'guess')).statusCode, 401)
    const blocked = await attempt(t.app, alice.username, 'guess')
    assert.equal(blocked.statusCode, 429)
    assert.ok(Number(blocked.headers['retry-after']) > 0)
    assert.match(String(blocked.headers['content-type']), /^application\/problem\+json/)
    assert.match(blocked.json().detail + JSON.stringify(blocked.json()), /login/)
    assert.equal(
      (await attempt(t.app, alice.username, alice.password)).statusCode,
      429,
      'the right password waits too',
    )
    assert.equal((await attempt(t.app, bob.username, bob.password)).statusCode, 200)
  })
})

describe('X-Forwarded-For spoofing', () => {
  const spoofed = (t: Awaited<ReturnType<typeof buildTestApp>>, ip: string) =>
    t.app.inject({ url: '/health', headers: { 'x-forwarded-for': ip } })

  test('trustProxy off: a forged X-Forwarded-For does not buy a fresh IP bucket', async (context) => {
    const t = await buildTestApp({ RATE_LIMIT_IP: '3,0.001' }, { rateLimits: 'on' })
    context.after(() => t.close())
    const statuses = []
    for (let i = 0; i < 5; i++) statuses.push((await spoofed(t, `203.0.113.${i}`)).statusCode)
    assert.deepEqual(statuses, [200, 200, 200, 429, 429])
  })

  test('trustProxy on: each forwarded client has its own bucket', async (context) => {
    const t = await buildTestApp({ RATE_LIMIT_IP: '3,0.001', TRUST_PROXY: 'true' }, { rateLimits: 'on' })
    context.after(() => t.close())
    const distinct = []
    for (let i = 0; i < 5; i++) distinct.push((await spoofed(t, `203.0.113.${i}`)).statusCode)
    assert.deepEqual(distinct, [200, 200, 200, 200, 200])
    const same = []
    for (let i = 0; i < 4; i++) same.push((await spoofed(t, '198.51.100.7')).statusCode)
    assert.deepEqual(same, [200, 200, 200, 429])
  })
})

describe('oversized input', () => {
  test('headers beyond the server limit get 431 and bodies beyond 16 KiB get 413; nothing is written', async (context) => {
    const t = await buildTestApp()
    context.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1000])
    const bob = await createCustomer(t.db, 'bob', [1000])
    const cookie = await login(t.app, alice)
    const url = await listen(t.app)
    const transfer = {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 1,
      currency: 'VND',
    }
    const huge = await fetch(`${url}/transfers`, {
      method: 'POST',
      headers: {
        cookie,
        'content-type': 'application/json',
        'idempotency-key': randomUUID(),
        'x-pad': 'x'.repeat(20_000),
      },
      body: JSON.stringify(transfer),
    })
    assert.equal(huge.status, 431)
    const big = await fetch(`${url}/transfers`, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/json', 'idempotency-key': randomUUID() },
      body: JSON.stringify({ ...transfer, pad: 'x'.repeat(17_000) }),
    })
    assert.equal(big.status, 413)
    const [row] = await t.db.query<{ n: string }>('SELECT count(*)::text AS n FROM transfers')
    assert.equal(row!.n, '0')
  })
})

describe("another customer's resources", () => {
  test("the same Idempotency-Key from two customers: two transfers, neither sees the other's response", async (context) => {
    const t = await buildTestApp()
    context.after(() => t.close())
    const alice = await createCustomer(t.db, 'alice', [1000])
    const bob = await createCustomer(t.db, 'bob', [1000])
    const key = randomUUID()
    const send = async (who: typeof alice, to: number, amount: number) =>
      t.app.inject({
        method: 'POST',
        url: '/transfers',
        headers: { cookie: await login(t.app, who), 'idempotency-key': key },
        payload: { fromAccountId: who.accountIds[0], toAccountId: to, amount, currency: 'VND' },
      })
    const a = await send(alice, bob.accountIds[0]!, 10)
    const b = await send(bob, alice.accountIds[0]!, 20)
    assert.equal(a.statusCode, 201)
    assert.equal(b.statusCode, 201)
    assert.equal(b.headers['idempotent-replayed'], undefined)
    assert.notEqual(a.json().transferId, b.json().transferId)
    assert.equal(b.json().amount, 20)
  })
})
