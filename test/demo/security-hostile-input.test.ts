import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import fc from 'fast-check'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { scanKeys } from '../helpers/index.ts'

const RUNS = 400

let t: TestApp
let alice: TestCustomer
let cookie: string

before(async () => {
  // Limits high enough that requests reach the routes (429s would hide their behaviour).
  t = await buildTestApp(
    { RATE_LIMIT_IP: '1000000,1000000', RATE_LIMIT_LOGIN: '100000/60s', RATE_LIMIT_TRANSFERS: '100000/60s' },
    { rateLimits: 'on' },
  )
  alice = await createCustomer(t.db, 'alice', [1000])
  await createCustomer(t.db, 'bob', [1000])
  cookie = await login(t.app, alice)
})
after(() => t.close())

const visibleAscii = (maxLength: number) =>
  fc.string({ unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)), maxLength })
const anyText = (maxLength: number) => fc.string({ unit: 'grapheme', maxLength })

const pathSegment = fc.oneof(
  fc.constantFrom('1', '2', '0', '-1', '1.5', '1e3', '99999999999999999999', '%00', '..', 'null'),
  anyText(40).map(encodeURIComponent),
)
const path = fc.oneof(
  fc.constantFrom('/session', '/accounts', '/transfers', '/health', '/ready', '/metrics', '/docs/json'),
  pathSegment.map((id) => `/accounts/${id}/balance`),
  fc.array(pathSegment, { maxLength: 4 }).map((parts) => `/${parts.join('/')}`),
)
const query = fc.option(
  fc
    .dictionary(visibleAscii(12).map(encodeURIComponent), anyText(30).map(encodeURIComponent), { maxKeys: 4 })
    .map(
      (q) =>
        `?${Object.entries(q)
          .map(([k, v]) => `${k}=${v}`)
          .join('&')}`,
    ),
  { nil: '' },
)
const transferLike = fc.record(
  {
    fromAccountId: fc.oneof(fc.constant(1), fc.integer(), fc.double(), anyText(10), fc.constant(null)),
    toAccountId: fc.oneof(fc.constant(2), fc.integer(), fc.bigInt().map(String), fc.constant(null)),
    amount: fc.oneof(fc.integer(), fc.double(), fc.constant(2 ** 53 + 1), anyText(10), fc.constant(-1)),
    currency: fc.oneof(fc.constant('VND'), anyText(5)),
    username: anyText(80),
    password: anyText(80),
  },
  { requiredKeys: [] },
)
const body = fc.oneof(
  fc.constant(undefined),
  fc.json({ maxDepth: 3 }),
  transferLike.map((b) => JSON.stringify(b)),
  anyText(200),
  fc.constant('{"a":'.repeat(1000)),
  fc.constant(JSON.stringify({ pad: 'x'.repeat(20_000) })),
)
const headers = fc.record(
  {
    cookie: fc.oneof(
      fc.constant(''),
      visibleAscii(300),
      visibleAscii(60).map((v) => `sid=${v}`),
      fc.constant('CURRENT'),
    ),
    'idempotency-key': fc.oneof(
      visibleAscii(300),
      visibleAscii(20).map((v) => `"${v}"`),
      fc.uuid(),
    ),
    'content-type': fc.constantFrom(
      'application/json',
      'text/plain',
      'application/x-www-form-urlencoded',
      'nonsense/x',
      '',
    ),
    'x-forwarded-for': visibleAscii(60),
    accept: visibleAscii(40),
    'x-random': visibleAscii(200),
  },
  { requiredKeys: [] },
)

async function writes() {
  const [row] = await t.db.query<{ state: string }>(
    `SELECT (SELECT count(*) FROM transfers) || '/' || (SELECT count(*) FROM ledger_entries) || '/' ||
            (SELECT string_agg(balance::text, ',' ORDER BY id) FROM accounts) AS state`,
  )
  return row!.state
}

test(`${RUNS} random requests: never a 5xx, never a write on a 4xx, no unbounded Redis keys`, async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('GET', 'POST', 'DELETE', 'PUT', 'PATCH'),
      path,
      query,
      headers,
      body,
      async (method, p, q, h, payload) => {
        const sent = { ...h }
        if (sent.cookie === 'CURRENT') sent.cookie = cookie
        const before = await writes()
        const res = await t.app.inject({
          method: method as 'GET',
          url: p + q,
          headers: sent,
          ...(payload === undefined || method === 'GET' ? {} : { payload }),
        })
        assert.ok(res.statusCode < 500, `${method} ${p}${q} -> ${res.statusCode} ${res.body.slice(0, 300)}`)
        if (res.statusCode >= 400)
          assert.equal(await writes(), before, `${method} ${p} wrote on ${res.statusCode}`)
        if (res.statusCode >= 400)
          assert.match(String(res.headers['content-type']), /^application\/problem\+json/)
      },
    ),
    { numRuns: RUNS },
  )
  const keys = await scanKeys(t.redis, t.prefix)
  assert.ok(keys.length < RUNS * 3, `${keys.length} keys for ${RUNS} requests`)
  for (const key of keys) {
    assert.ok(key.length <= 200, `key length bounded: ${key.slice(0, 80)}...`)
    const ttl = await t.redis.pttl(key)
    // -2: the key expired since the scan (a short rate-limit window), which is what a TTL is for.
    assert.ok(ttl > 0 || ttl === -2, `${key} has a TTL (${ttl})`)
  }
})
