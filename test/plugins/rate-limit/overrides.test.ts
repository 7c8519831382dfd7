import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit, {
  keyBy,
  overrideKeys,
  RateLimitArgumentError,
  type RateLimitPolicy,
  RateLimitUnknownPolicyError,
} from '../../../src/plugins/rate-limit/index.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { redisSuite, until } from './fixtures.ts'

// Runtime overrides of a policy's limit per key, on Redis (or the Cluster, under `npm run
// test:cluster`) and on the memory store: set on one instance, applied by every instance (through
// the channel, or the poll when a message is lost), expired, removed, audited, counted.

const suite = redisSuite()

const POLICY: RateLimitPolicy = {
  name: 'plan',
  algorithm: 'fixed-window',
  limit: 2,
  windowMs: '1 hour',
  key: (request) => `customer:${String(request.headers['x-customer'])}`,
}

type Store = 'redis' | 'memory'

/** An instance of the plugin on `prefix`, with the `plan` policy on `/` and the metrics route. */
async function instance(store: Store, prefix: string, overrides: unknown = { pollMs: 200 }) {
  const app = Fastify()
  await app.register(metrics, { path: '/metrics', processMetrics: false })
  await app.register(rateLimit, {
    ...(store === 'redis' ? { redis: suite.redis } : { store: 'memory' }),
    keyPrefix: prefix,
    namedPolicies: [POLICY],
    overrides: overrides as boolean,
  })
  app.get('/', { config: { rateLimits: 'plan' } }, async () => 'ok')
  await app.ready()
  suite.apps.push(app)
  return app
}

/** The limit `app` applies to `customer` now (a peek: cost 0 consumes nothing). */
const limitOf = async (app: FastifyInstance, customer: string) =>
  (await app.rateLimiter.consume('plan', `customer:${customer}`, 0)).limit

const statuses = async (app: FastifyInstance, customer: string, n: number) => {
  const out: number[] = []
  for (let i = 0; i < n; i++)
    out.push((await app.inject({ url: '/', headers: { 'x-customer': customer } })).statusCode)
  return out
}

for (const store of ['redis', 'memory'] as const) {
  describe(`overrides on the ${store} store`, () => {
    test('an override changes one key’s limit until removed; other keys keep the policy’s', async () => {
      const prefix = suite.prefix('rlo')
      const app = await instance(store, prefix)
      const set = await app.rateLimiter.overrides.set('plan', 'customer:vip', {
        limit: 5,
        ttl: '1 hour',
        reason: 'plan upgrade',
        by: 'ops',
      })
      assert.equal(set.limit, 5)
      assert.ok(set.expiresAt > Date.now() + 3_500_000 && set.expiresAt <= Date.now() + 3_600_000 + 5000)
      assert.deepEqual(await statuses(app, 'vip', 6), [200, 200, 200, 200, 200, 429])
      assert.deepEqual(await statuses(app, 'bob', 3), [200, 200, 429])
      const res = await app.inject({ url: '/', headers: { 'x-customer': 'vip' } })
      assert.match(String(res.headers['ratelimit-policy']), /"plan";q=5;w=3600/)
      assert.deepEqual(
        (await app.rateLimiter.overrides.list()).map(({ policy, key, limit, reason, by }) => ({
          policy,
          key,
          limit,
          reason,
          by,
        })),
        [{ policy: 'plan', key: 'customer:vip', limit: 5, reason: 'plan upgrade', by: 'ops' }],
      )
      const text = (await app.inject('/metrics')).body
      assert.match(text, /rate_limit_overrides\{policy="plan"\} 1\n/)
      assert.match(text, /rate_limit_override_changes_total\{action="set"\} 1\n/)

      assert.equal(
        await app.rateLimiter.overrides.remove('plan', 'customer:vip', { reason: 'downgrade' }),
        true,
      )
      assert.equal(await app.rateLimiter.overrides.remove('plan', 'customer:vip'), false)
      assert.equal(await limitOf(app, 'vip'), 2)
      assert.deepEqual(await app.rateLimiter.overrides.list(), [])
      const history = await app.rateLimiter.overrides.history()
      assert.deepEqual(
        history.map(({ action, key, limit, ttlMs, reason, by }) => ({
          action,
          key,
          limit,
          ttlMs,
          reason,
          by,
        })),
        [
          { action: 'remove', key: 'customer:vip', limit: null, ttlMs: null, reason: '', by: '' },
          { action: 'remove', key: 'customer:vip', limit: null, ttlMs: null, reason: 'downgrade', by: '' },
          {
            action: 'set',
            key: 'customer:vip',
            limit: 5,
            ttlMs: 3_600_000,
            reason: 'plan upgrade',
            by: 'ops',
          },
        ],
        'the audit log, newest first',
      )
    })

    test('an override ends with its ttl', async () => {
      const prefix = suite.prefix('rlo')
      const app = await instance(store, prefix)
      await app.rateLimiter.overrides.set('plan', 'customer:brief', { limit: 9, ttl: 300 })
      assert.equal(await limitOf(app, 'brief'), 9)
      await until('the override to expire', async () => (await limitOf(app, 'brief')) === 2)
      assert.deepEqual(await app.rateLimiter.overrides.list(), [])
    })

    test('bad calls are refused with what to write, and nothing is stored', async () => {
      const prefix = suite.prefix('rlo')
      const app = await instance(store, prefix)
      const { overrides } = app.rateLimiter
      await assert.rejects(
        overrides.set('nope', 'customer:a', { limit: 3, ttl: '1h' }),
        RateLimitUnknownPolicyError,
      )
      for (const [input, message] of [
        [{ limit: 0, ttl: '1h' }, /`limit` must be a positive whole number/],
        [{ limit: 1.5, ttl: '1h' }, /`limit` must be a positive whole number/],
        [{ limit: 3 }, /ttl/],
        [{ limit: 3, ttl: '31 days' }, /at most 30 days/],
        [{ limit: 3, ttl: '1h', reason: 'x'.repeat(201) }, /`reason` must be a string of at most 200/],
      ] as const)
        await assert.rejects(
          overrides.set('plan', 'customer:a', input as never),
          (err: Error) => err instanceof RateLimitArgumentError && message.test(err.message),
        )
      await assert.rejects(
        overrides.set('plan', '', { limit: 3, ttl: '1h' }),
        /`key` must be a string of 1 to 512/,
      )
      await assert.rejects(overrides.history(0), /`count` must be a whole number from 1 to 1000/)
      assert.deepEqual(await overrides.list(), [])
      assert.deepEqual(await overrides.history(), [])
    })
  })
}

for (const store of ['redis', 'memory'] as const)
  test(`IP range overrides on the ${store} store: the most specific applies, an exact key before any range`, async () => {
    const app = Fastify()
    await app.register(rateLimit, {
      ...(store === 'redis' ? { redis: suite.redis } : { store: 'memory' }),
      keyPrefix: suite.prefix('rlo'),
      namedPolicies: [
        { name: 'by-ip', algorithm: 'fixed-window', limit: 2, windowMs: '1 hour', key: keyBy.ip },
      ],
      overrides: true,
    })
    app.get('/', { config: { rateLimits: 'by-ip' } }, async () => 'ok')
    await app.ready()
    suite.apps.push(app)
    const { overrides } = app.rateLimiter
    await overrides.set('by-ip', 'ip:203.0.113.0/24', { limit: 5, ttl: '1h', reason: 'partner office' })
    await overrides.set('by-ip', 'ip:203.0.113.128/25', { limit: 4, ttl: '1h' })
    await overrides.set('by-ip', 'ip:203.0.113.7', { limit: 3, ttl: '1h' })
    await overrides.set('by-ip', 'ip:2001:db8::/32', { limit: 6, ttl: '1h' })
    await overrides.set('by-ip', 'ip:0.0.0.0/1', { limit: 7, ttl: '1 second' })
    const limit = async (ip: string) => (await app.rateLimiter.consume('by-ip', ip, 0)).limit
    assert.equal(await limit('ip:203.0.113.9'), 5)
    assert.equal(await limit('ip:203.0.113.200'), 4)
    assert.equal(await limit('ip:203.0.113.7'), 3)
    assert.equal(await limit('ip:203.0.114.1'), 2)
    assert.equal(await limit('ip:2001:db8:0:1::/64'), 6)
    assert.equal(await limit('ip:2001:db9:0:1::/64'), 2)
    // A range narrower than the identity's network does not hold it.
    await overrides.set('by-ip', 'ip:2001:db9:0:1:8000::/65', { limit: 9, ttl: '1h' })
    assert.equal(await limit('ip:2001:db9:0:1::/64'), 2)
    // An expired range gives way to the next one holding the address, and then to the policy.
    assert.equal(await limit('ip:10.0.0.1'), 7)
    await until('the /1 to expire', async () => (await limit('ip:10.0.0.1')) === 2)
    // Through a request: keyBy.ip's identity, its IPv6 client as a /64.
    const get = (remoteAddress: string) => app.inject({ url: '/', remoteAddress })
    const res = await get('2001:db8:5:6:7::1')
    assert.match(String(res.headers['ratelimit-policy']), /"by-ip";q=6;/)
    assert.deepEqual(
      await Promise.all(Array.from({ length: 5 }, () => get('203.0.113.10').then((r) => r.statusCode))).then(
        (s) => s.sort(),
      ),
      [200, 200, 200, 200, 200],
    )
    assert.equal((await get('203.0.113.10')).statusCode, 429)
    for (const key of ['ip:203.0.113.1/24', 'ip:203.0.113.0/33', 'ip:2001:db8::/129', 'ip:nope/8'])
      await assert.rejects(
        overrides.set('by-ip', key, { limit: 3, ttl: '1h' }),
        (err: Error) => err instanceof RateLimitArgumentError && /is not an IP range/.test(err.message),
      )
  })

describe('overrides shared by instances (Redis)', () => {
  test('set on one instance, applied by the others at once through the channel', async () => {
    const prefix = suite.prefix('rlo')
    const [a, b] = [await instance('redis', prefix), await instance('redis', prefix, { pollMs: 60_000 })]
    await a.rateLimiter.overrides.set('plan', 'customer:tenant', { limit: 4, ttl: '10 minutes' })
    // b polls only every minute: what it applies before came on the channel.
    await until('b to apply the override', async () => (await limitOf(b, 'tenant')) === 4)
    assert.deepEqual(await statuses(b, 'tenant', 5), [200, 200, 200, 200, 429])
    await b.rateLimiter.overrides.remove('plan', 'customer:tenant')
    await until('a to drop it', async () => (await limitOf(a, 'tenant')) === 2)
  })

  test('a change whose message is lost is applied at the next poll', async () => {
    const prefix = suite.prefix('rlo')
    const app = await instance('redis', prefix, { pollMs: 100 })
    // As the script writes it, without the PUBLISH: only the version moved.
    const keys = overrideKeys(prefix)
    const override = {
      policy: 'plan',
      key: 'customer:quiet',
      limit: 7,
      expiresAt: Date.now() + 600_000,
      setAt: Date.now(),
      reason: '',
      by: '',
    }
    await suite.redis.hset(keys.entries, 'plan\ncustomer:quiet', JSON.stringify(override))
    await suite.redis.pexpire(keys.entries, 600_000)
    await suite.redis.incr(keys.version)
    await suite.redis.pexpire(keys.version, 600_000)
    await until('the poll to apply it', async () => (await limitOf(app, 'quiet')) === 7)
  })

  test('an override of a policy this instance does not have, or a limit it cannot take, is ignored', async () => {
    const prefix = suite.prefix('rlo')
    const app = await instance('redis', prefix, { pollMs: 100 })
    const keys = overrideKeys(prefix)
    for (const [policy, limit] of [
      ['other', 9],
      ['plan', -1],
    ] as const)
      await suite.redis.hset(
        keys.entries,
        `${policy}\ncustomer:x`,
        JSON.stringify({
          policy,
          key: 'customer:x',
          limit,
          expiresAt: Date.now() + 600_000,
          setAt: 0,
          reason: '',
          by: '',
        }),
      )
    await suite.redis.pexpire(keys.entries, 600_000)
    await app.rateLimiter.overrides.refresh()
    assert.equal(await limitOf(app, 'x'), 2)
  })
})

test('without `overrides`, the API says how to turn them on; a bad option fails the boot', async () => {
  const app = Fastify()
  await app.register(rateLimit, { store: 'memory', keyPrefix: uniquePrefix('rlo'), namedPolicies: [POLICY] })
  await app.ready()
  suite.apps.push(app)
  await assert.rejects(
    app.rateLimiter.overrides.set('plan', 'customer:a', { limit: 3, ttl: '1h' }),
    /overrides are off: register the plugin with `overrides: true`/,
  )
  for (const [value, message] of [
    ['yes', /`overrides` must be true, false or \{ pollMs\? \}/],
    [{ pollMs: 10 }, /`overrides.pollMs` must be at least 100 ms/],
    [{ poll: 1000 }, /poll/],
  ] as const) {
    const bad = Fastify()
    await assert.rejects(async () => {
      await bad.register(rateLimit, { store: 'memory', namedPolicies: [POLICY], overrides: value as never })
      await bad.ready()
    }, message)
    await bad.close().catch(() => {})
  }
})
