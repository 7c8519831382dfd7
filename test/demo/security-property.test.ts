import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import fc from 'fast-check'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'

// Arbitrary JSON, as a hostile or broken client sends it, to every route of the demo: never a 5xx,
// and a 4xx never writes (no transfer, no ledger entry, no balance change, no customer).

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let cookie: string
before(async () => {
  t = await buildTestApp({ RATE_LIMITS: 'off' })
  alice = await createCustomer(t.db, `prop-alice-${randomUUID().slice(0, 8)}`, [1_000_000])
  bob = await createCustomer(t.db, `prop-bob-${randomUUID().slice(0, 8)}`, [0])
  cookie = await login(t.app, alice)
})
after(async () => t?.close())

const oddString = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.constantFrom('\u0000', 'a\u0000b', '\ud800', 'x\udfffy', '\ud83d\ude00', '__proto__', 'constructor', ''),
  fc.string({ maxLength: 2000 }),
)
const oddNumber = fc.oneof(
  fc.double(),
  fc.constantFrom(1e308, -1e308, 2 ** 53 + 1, -0, 0.1, 2 ** 31, -1),
  fc.integer(),
)
const anyJson = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small' },
    oddString,
    oddNumber,
    fc.boolean(),
    fc.constant(null),
    fc.array(tie('value'), { maxLength: 5 }),
    fc.dictionary(oddString, tie('value'), { maxKeys: 5 }),
  ),
})).value
/** Mostly-right bodies reach the handlers rather than the schema: fields of the right names, odd values. */
// Account ids are known once the customers exist: read them when a value is drawn.
const aliceAccount = fc.constant(0).map(() => alice.accountIds[0]!)
const bobAccount = fc.constant(0).map(() => bob.accountIds[0]!)
const nearTransfer = fc.record(
  {
    fromAccountId: fc.oneof(aliceAccount, bobAccount, oddNumber, oddString, anyJson),
    toAccountId: fc.oneof(bobAccount, aliceAccount, oddNumber, oddString),
    amount: fc.oneof(fc.integer({ min: 1, max: 2_000_000 }), oddNumber, oddString),
    currency: fc.oneof(fc.constantFrom('VND', 'USD', 'V\u0000D'), oddString),
  },
  { requiredKeys: [] },
)
/** Right shape, plausible values: most reach the ledger (201, 400, 404, 422). */
const plausibleTransfer = fc.record({
  fromAccountId: fc.oneof(aliceAccount, bobAccount),
  toAccountId: fc.oneof(bobAccount, aliceAccount, fc.integer({ min: 1, max: 2 ** 31 - 1 })),
  amount: fc.oneof(fc.integer({ min: 1, max: 2_000_000 }), oddNumber),
  currency: fc.oneof(fc.constant('VND'), fc.constant('USD'), oddString),
})
const nearLogin = fc.record(
  { username: fc.oneof(oddString, anyJson), password: fc.oneof(oddString, anyJson) },
  {
    requiredKeys: [],
  },
)
const deep = fc.integer({ min: 1_000, max: 20_000 }).map((n) => `${'['.repeat(n)}${']'.repeat(n)}`)

const routes = [
  { method: 'POST', url: '/transfers' },
  { method: 'POST', url: '/session' },
  { method: 'GET', url: '/session' },
  { method: 'DELETE', url: '/session' },
  { method: 'GET', url: '/accounts' },
  { method: 'GET', url: '/health' },
  { method: 'GET', url: '/ready' },
] as const

/** Percent-encoded; a lone surrogate (no UTF-8 form) goes as the bytes a broken client would send. */
function pathSegment(text: string): string {
  try {
    return encodeURIComponent(text)
  } catch {
    return `${encodeURIComponent(text.replace(/[\ud800-\udfff]/g, ''))}%ED%A0%80`
  }
}

async function writes() {
  const [row] = await t.db.query<Record<string, string>>(
    `SELECT (SELECT count(*) FROM transfers)::text AS transfers,
            (SELECT count(*) FROM ledger_entries)::text AS entries,
            (SELECT count(*) FROM customers)::text AS customers,
            (SELECT sum(balance) FILTER (WHERE id = $1))::text AS alice,
            (SELECT sum(balance) FILTER (WHERE id = $2))::text AS bob
     FROM accounts`,
    [alice.accountIds[0], bob.accountIds[0]],
  )
  return row
}

test('arbitrary JSON to every demo route: no 5xx, and no write on a 4xx', async () => {
  const body = fc.oneof(
    anyJson.map((v) => JSON.stringify(v)),
    nearTransfer.map((v) => JSON.stringify(v)),
    nearLogin.map((v) => JSON.stringify(v)),
    deep,
    // Numbers JSON can spell but a double cannot hold.
    fc.constantFrom(
      '{"fromAccountId":1,"toAccountId":2,"amount":9007199254740993,"currency":"VND"}',
      '{"amount":1e400}',
    ),
  )
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...routes),
      body,
      fc.boolean(),
      fc.oneof(oddString, fc.uuid()),
      fc.oneof(oddString, fc.integer().map(String)),
      async (route, payload, signedIn, key, accountId) => {
        const before = await writes()
        const target =
          route.url === '/accounts' && signedIn ? `/accounts/${pathSegment(accountId)}/balance` : route.url
        const res = await t.app.inject({
          method: route.method,
          url: target,
          headers: {
            'content-type': 'application/json',
            // Logging out ends the session it presents: that one is a fresh session of its own.
            ...(signedIn ? { cookie: route.method === 'DELETE' ? await login(t.app, alice) : cookie } : {}),
            // Header values must be Latin-1 to be sent at all: what cannot be is sent as a UUID.
            'idempotency-key': /^[\x20-\x7e]*$/.test(key) ? key : randomUUID(),
          },
          payload: route.method === 'GET' ? undefined : payload,
        })
        assert.ok(
          res.statusCode < 500,
          `${route.method} ${target} answered ${res.statusCode}: ${res.body.slice(0, 300)}`,
        )
        if (res.statusCode >= 400) assert.deepEqual(await writes(), before, `${res.statusCode} wrote`)
      },
    ),
    { numRuns: 300 },
  )
})

test('plausible and broken transfers from a signed-in customer: no 5xx, no write on a 4xx, the ledger balanced', async () => {
  const body = fc.oneof(
    { weight: 3, arbitrary: plausibleTransfer.map((v) => JSON.stringify(v)) },
    { weight: 1, arbitrary: nearTransfer.map((v) => JSON.stringify(v)) },
    { weight: 1, arbitrary: anyJson.map((v) => JSON.stringify(v)) },
    // Surely valid ones too, so that some money always moves (a plausible body is often refused).
    {
      weight: 1,
      arbitrary: fc.integer({ min: 1, max: 1000 }).map((amount) =>
        JSON.stringify({
          fromAccountId: alice.accountIds[0],
          toAccountId: bob.accountIds[0],
          amount,
          currency: 'VND',
        }),
      ),
    },
  )
  // The first property may have ended the shared session (logins and logouts among its requests).
  cookie = await login(t.app, alice)
  const start = await writes()
  await fc.assert(
    fc.asyncProperty(body, async (payload) => {
      const before = await writes()
      const res = await t.app.inject({
        method: 'POST',
        url: '/transfers',
        headers: { 'content-type': 'application/json', cookie, 'idempotency-key': randomUUID() },
        payload,
      })
      assert.ok(res.statusCode < 500, `answered ${res.statusCode}: ${res.body.slice(0, 300)}`)
      if (res.statusCode >= 400) assert.deepEqual(await writes(), before, `${res.statusCode} wrote`)
    }),
    { numRuns: 300 },
  )
  const end = await writes()
  assert.ok(Number(end!.transfers) > Number(start!.transfers), 'some transfers went through')
  // What succeeded moved money within the ledger: two entries per transfer, the total unchanged.
  assert.equal(Number(end!.entries), 2 * Number(end!.transfers))
  assert.equal(Number(end!.alice) + Number(end!.bob), 1_000_000)
})
