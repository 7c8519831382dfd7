import assert from 'node:assert/strict'
import { PassThrough } from 'node:stream'
import { describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type FastifyReply, type RouteHandlerMethod } from 'fastify'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit, { type RateLimitPolicy } from '../../../src/plugins/rate-limit/index.ts'
import { listen } from '../../helpers/index.ts'
import { redisSuite, until } from './fixtures.ts'

// Reserve, then reconcile, on Redis (or the Cluster, under `npm run test:cluster`) and on the
// memory store: a request reserves its estimated cost; when its response ends the actual cost
// settles it. Less is given back; more is charged: as debt the next requests pay (token bucket,
// GCRA), or only while the window has room (fixed window). An aborted stream is charged what it sent.

const suite = redisSuite()

type Store = 'redis' | 'memory'

/** The actual cost the route reports, as a settle function reads it. */
const used = (_request: unknown, reply: FastifyReply) => Number(reply.getHeader('x-used'))

/** An app whose `/` reports `?used=` as its actual cost, under `policy`; with the metrics route. */
async function build(store: Store, policy: RateLimitPolicy, handler?: RouteHandlerMethod) {
  const app = Fastify()
  const prefix = suite.prefix('rls')
  await app.register(metrics, { path: '/metrics', processMetrics: false })
  await app.register(rateLimit, {
    ...(store === 'redis' ? { redis: suite.redis } : { store: 'memory' }),
    keyPrefix: prefix,
  })
  app.get(
    '/',
    { config: { rateLimits: policy } },
    handler ??
      (async (request, reply) => {
        reply.header('x-used', (request.query as { used: string }).used)
        return 'ok'
      }),
  )
  suite.apps.push(app)
  return { app, url: await listen(app) }
}

const left = async (app: FastifyInstance, policy: string) =>
  (await app.rateLimiter.consume(policy, 'ip:127.0.0.1', 0)).remaining

for (const store of ['redis', 'memory'] as const) {
  describe(`reserve, then reconcile, on the ${store} store`, () => {
    test('token bucket: the unused part comes back, an overage is debt the next requests pay', async () => {
      const { app, url } = await build(store, {
        name: 'tokens',
        algorithm: 'token-bucket',
        limit: 100,
        refillPerSecond: 0.001,
        cost: 10,
        quotaUnit: 'tokens',
        settle: used,
      })
      const first = await fetch(`${url}/?used=4`)
      assert.equal(first.status, 200)
      assert.match(String(first.headers.get('ratelimit-policy')), /^"tokens";q=100;w=\d+;qu="tokens"$/)
      assert.equal(first.headers.get('ratelimit'), '"tokens";r=90;t=10000', 'the estimate, reserved')
      await until('6 given back', async () => (await left(app, 'tokens')) === 96)
      await fetch(`${url}/?used=30`)
      await until('20 more charged', async () => (await left(app, 'tokens')) === 66)
      // 150 used against 10 reserved: 140 charged, in calls of at most the capacity, the bucket in debt.
      await fetch(`${url}/?used=150`)
      await until('the debt', async () => (await left(app, 'tokens')) === 0)
      const refused = await fetch(`${url}/?used=1`)
      assert.equal(refused.status, 429, 'the debt is paid before anything else passes')
      assert.ok(
        Number(refused.headers.get('retry-after')) > 90_000,
        'about 94 tokens to refill at 0.001 a second',
      )
      const text = await (await fetch(`${url}/metrics`)).text()
      assert.match(text, /rate_limit_settlements_total\{policy="tokens",outcome="refunded"\} 1\n/)
      assert.match(text, /rate_limit_settlements_total\{policy="tokens",outcome="charged"\} 2\n/)
    })

    test('fixed window: the unused part comes back; an overage counts only while the window has room', async () => {
      const { app, url } = await build(store, {
        name: 'window',
        algorithm: 'fixed-window',
        limit: 100,
        windowMs: '1 hour',
        cost: 10,
        settle: used,
      })
      await fetch(`${url}/?used=3`)
      await until('7 given back', async () => (await left(app, 'window')) === 97)
      await fetch(`${url}/?used=25`)
      await until('15 more counted', async () => (await left(app, 'window')) === 72)
      // 490 more than reserved does not fit in what is left of the window: only the estimate stays.
      await fetch(`${url}/?used=500`)
      await until('the reservation settled', async () => {
        const text = await (await fetch(`${url}/metrics`)).text()
        return /rate_limit_settlements_total\{policy="window",outcome="charged"\} 2\n/.test(text)
      })
      assert.equal(await left(app, 'window'), 62)
    })

    test('an aborted stream is charged only what it sent; a route may settle itself, once', async () => {
      const streams: PassThrough[] = []
      const { app, url } = await build(
        store,
        {
          name: 'bytes',
          algorithm: 'token-bucket',
          limit: 10_000,
          refillPerSecond: 0.001,
          cost: 1000,
          quotaUnit: 'bytes',
          settle: (request) => (request as unknown as { sent: number }).sent,
        },
        async (request, reply) => {
          const body = new PassThrough()
          streams.push(body)
          const chunk = 'x'.repeat(64)
          body.write(chunk)
          ;(request as unknown as { sent: number }).sent = chunk.length
          return reply.send(body)
        },
      )
      const controller = new AbortController()
      const res = await fetch(url, { signal: controller.signal })
      await res.body!.getReader().read()
      controller.abort()
      await until(
        '936 of the 1000 reserved given back',
        async () => (await left(app, 'bytes')) === 10_000 - 64,
      )
      streams[0]!.destroy()

      const own = await build(
        store,
        { name: 'manual', algorithm: 'gcra', limit: 100, windowMs: '1 hour', cost: 10, settle: true },
        async (request) => {
          await request.server.rateLimiter.settle(request, 'manual', 2)
          await assert.rejects(
            request.server.rateLimiter.settle(request, 'manual', 2),
            /no reservation under policy 'manual'/,
          )
          await assert.rejects(
            request.server.rateLimiter.settle(request, 'manual', -1),
            /`actual` must be a whole number/,
          )
          return 'ok'
        },
      )
      assert.equal((await fetch(own.url)).status, 200)
      assert.equal(await left(own.app, 'manual'), 98, 'the route settled 2 of the 10 reserved')
    })
  })
}

test('settle and quotaUnit are checked at boot', async () => {
  const base = { name: 'p', algorithm: 'fixed-window', limit: 10, windowMs: 1000 } as const
  for (const [policy, message] of [
    [{ ...base, settle: 'yes' }, /`settle` must be true \(the route settles\) or a function/],
    [
      { ...base, settle: true, countOnlyFailures: true },
      /`settle` and `countOnlyFailures` exclude each other/,
    ],
    [{ ...base, settle: true, sync: true }, /`settle` and `sync` exclude each other/],
    [
      { name: 'c', algorithm: 'concurrency', limit: 2, settle: true },
      /`settle` does not apply to concurrency/,
    ],
    [{ ...base, quotaUnit: 'Bytes!' }, /`quotaUnit` must be a short name/],
  ] as const) {
    const app = Fastify()
    await assert.rejects(async () => {
      await app.register(rateLimit, {
        store: 'memory',
        namedPolicies: [policy as unknown as RateLimitPolicy],
      })
      await app.ready()
    }, message)
    await app.close().catch(() => {})
  }
})
