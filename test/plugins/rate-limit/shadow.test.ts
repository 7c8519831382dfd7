import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import type { FastifyInstance } from 'fastify'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit, { type RateLimitPolicy } from '../../../src/plugins/rate-limit/index.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { loggedApp, redisSuite } from './fixtures.ts'

// Shadow (dry-run) policies, on Redis (or the Cluster, under `npm run test:cluster`) and on the
// memory store: a shadow policy never refuses, and counts exactly what the same policy enforcing
// would have refused: the same requests sent to a shadow app and to an enforcing one give as many
// would_reject decisions as 429s, and the same counters.

const suite = redisSuite()

type Store = 'redis' | 'memory'

/** An app whose `/` route has `policies`, with the metrics route and its info-level log lines. */
async function build(store: Store, policies: RateLimitPolicy[]) {
  const { app, logs } = loggedApp('info')
  const prefix = suite.prefix('rls')
  await app.register(metrics, { path: '/metrics', processMetrics: false })
  await app.register(rateLimit, {
    ...(store === 'redis' ? { redis: suite.redis } : { store: 'memory' }),
    keyPrefix: prefix,
  })
  app.get('/', { config: { rateLimits: policies } }, async () => ({ ok: true }))
  await app.ready()
  suite.apps.push(app)
  return { app, logs }
}

/** `n` requests at once, the i-th from the customer `keys[i % keys.length]`: their statuses by customer. */
async function send(app: FastifyInstance, n: number, keys: string[]) {
  const responses = await Promise.all(
    Array.from({ length: n }, (_, i) =>
      app.inject({ url: '/', headers: { 'x-customer': keys[i % keys.length]! } }),
    ),
  )
  return responses
}

/**
 * The rate_limit_decisions_total samples of `policy`, by outcome; an enforcing policy's refusals
 * answered from the over-limit cache (`rejected_cached`) are added to `rejected`.
 */
async function decisions(app: FastifyInstance, policy: string): Promise<Record<string, number>> {
  const text = (await app.inject('/metrics')).body
  const counts: Record<string, number> = {}
  for (const match of text
    .replaceAll('"rejected_cached"', '"rejected"')
    .matchAll(/^rate_limit_decisions_total\{policy="([^"]+)",outcome="([^"]+)"\} (\d+)$/gm))
    if (match[1] === policy) counts[match[2]!] = (counts[match[2]!] ?? 0) + Number(match[3])
  return counts
}

const byCustomer = (request: { headers: Record<string, unknown> }) => String(request.headers['x-customer'])

/** One algorithm of each kind, with windows far longer than a test: no unit comes back meanwhile. */
const POLICIES: RateLimitPolicy[] = [
  { name: 'fw', algorithm: 'fixed-window', limit: 7, windowMs: '1 hour', key: byCustomer },
  { name: 'tb', algorithm: 'token-bucket', limit: 7, refillPerSecond: 0.001, key: byCustomer },
  { name: 'gcra', algorithm: 'gcra', limit: 7, windowMs: '1 hour', key: byCustomer },
  { name: 'log', algorithm: 'sliding-log', limit: 7, windowMs: '1 hour', key: byCustomer },
  { name: 'sc', algorithm: 'sliding-counter', limit: 7, windowMs: '1 hour', key: byCustomer },
]

for (const store of ['redis', 'memory'] as const) {
  describe(`shadow policies on the ${store} store`, () => {
    for (const policy of POLICIES) {
      test(`${policy.algorithm}: never refuses, and would refuse exactly what enforcing refuses`, async () => {
        const enforcing = await build(store, [policy])
        const shadow = await build(store, [{ ...policy, shadow: true }])
        const keys = ['alice', 'bob', 'carol']
        const enforced = await send(enforcing.app, 60, keys)
        const shadowed = await send(shadow.app, 60, keys)
        assert.deepEqual(
          shadowed.map((r) => r.statusCode),
          Array(60).fill(200),
          'the shadow policy refuses nothing',
        )
        const refused = enforced.filter((r) => r.statusCode === 429).length
        assert.equal(refused, 60 - 3 * 7, 'enforcing refuses what is over the limit')
        assert.deepEqual(await decisions(shadow.app, policy.name), {
          allowed: 60 - refused,
          would_reject: refused,
        })
        assert.deepEqual(await decisions(enforcing.app, policy.name), {
          allowed: 60 - refused,
          rejected: refused,
        })
        // Each customer's next request: both policies' state agrees (nothing left for either).
        for (const key of keys) {
          const [next] = await send(enforcing.app, 1, [key])
          assert.equal(next!.statusCode, 429)
        }
        const logged = shadow.logs.filter((line) => line.msg === 'shadow rate-limit policy would reject')
        assert.equal(logged.length, refused, 'each would-be refusal is logged')
        assert.deepEqual(new Set(logged.map((line) => line.key)), new Set(keys))
        assert.ok(logged.every((line) => line.policy === policy.name && Number(line.retryAfterMs) > 0))
        // Shadow policies do not show their headers unless asked.
        assert.equal(shadowed[0]!.headers['ratelimit-policy'], undefined)
      })
    }

    test('beside an enforcing policy: each decides on its own, the shadow never refuses for it nor is refused by it', async () => {
      const { app } = await build(store, [
        { name: 'enforced', algorithm: 'fixed-window', limit: 5, windowMs: '1 hour', key: byCustomer },
        {
          name: 'stricter',
          algorithm: 'fixed-window',
          limit: 2,
          windowMs: '1 hour',
          key: byCustomer,
          shadow: { headers: true },
        },
      ])
      const statuses: number[] = []
      const headers: unknown[] = []
      for (let i = 0; i < 8; i++) {
        const res = await app.inject({ url: '/', headers: { 'x-customer': 'dave' } })
        statuses.push(res.statusCode)
        headers.push(res.headers.ratelimit)
      }
      assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429, 429, 429])
      // The shadow was asked on every request, the enforcing policy's refusals included.
      assert.deepEqual(await decisions(app, 'stricter'), { allowed: 2, would_reject: 6 })
      assert.deepEqual(await decisions(app, 'enforced'), { allowed: 5, rejected: 3 })
      // Its headers, as asked: the shadow's RateLimit item beside the enforcing one's.
      assert.match(String(headers[0]), /"stricter";r=1;t=\d+/)
      assert.match(String(headers[4]), /"enforced";r=0;t=\d+/)
      assert.match(String(headers[4]), /"stricter";r=0;t=\d+/)
    })
  })
}

test('a shadow option that is not true, false or { headers } is refused at boot', async () => {
  for (const [shadow, message] of [
    ['yes', /`shadow` must be true, false or \{ headers\? \}/],
    [{ header: true }, /header/],
    [{ headers: 1 }, /`shadow.headers` must be a boolean/],
  ] as const) {
    const { app } = loggedApp()
    const policy = { name: 'bad', algorithm: 'fixed-window', limit: 1, windowMs: 1000, shadow } as const
    await assert.rejects(async () => {
      await app.register(rateLimit, {
        store: 'memory',
        keyPrefix: uniquePrefix('rls'),
        namedPolicies: [policy as unknown as RateLimitPolicy],
      })
      await app.ready()
    }, message)
    await app.close().catch(() => {})
  }
})
