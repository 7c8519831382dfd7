import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { PassThrough } from 'node:stream'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance, type RouteHandlerMethod } from 'fastify'
import rateLimit, { type RateLimitPolicy } from '../../../src/plugins/rate-limit/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { listen, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { RUN_TYPESCRIPT } from '../../helpers/tsx.ts'
import { redisSuite, until } from './fixtures.ts'

// Concurrency policies (requests in flight), on Redis (or the Cluster, under `npm run
// test:cluster`) and on the memory store: the limit holds under 200 parallel requests from three
// instances; a slot goes back when the response ends, when the client goes away, when a streamed
// body ends or fails, and at once when another policy refuses the request; a dead instance's slots
// come back after their lease, a killed process's too.

const suite = redisSuite()

const byCustomer = (request: { headers: Record<string, unknown> }) =>
  `customer:${String(request.headers['x-customer'])}`

const exports = (extra: Partial<RateLimitPolicy> = {}): RateLimitPolicy => ({
  name: 'exports',
  algorithm: 'concurrency',
  limit: 5,
  key: byCustomer,
  ...extra,
})

type Store = 'redis' | 'memory'

/** An instance listening on `/` with `policies` and `handler`; its URL. */
async function instance(
  store: Store,
  prefix: string,
  policies: RateLimitPolicy[],
  handler: RouteHandlerMethod,
  client: RedisClient = suite.redis,
) {
  const app = Fastify()
  await app.register(rateLimit, {
    ...(store === 'redis' ? { redis: client } : { store: 'memory' }),
    keyPrefix: prefix,
  })
  app.get('/', { config: { rateLimits: policies } }, handler)
  suite.apps.push(app)
  return { app, url: await listen(app) }
}

/** Slots free now for `customer` (a peek: cost 0 takes none). */
const free = async (app: FastifyInstance, customer: string) =>
  (await app.rateLimiter.consume('exports', `customer:${customer}`, 0)).remaining

const get = (url: string, customer: string, signal?: AbortSignal) =>
  fetch(url, { headers: { 'x-customer': customer }, signal })

for (const store of ['redis', 'memory'] as const) {
  describe(`concurrency policies on the ${store} store`, () => {
    test('200 parallel requests on three instances: never more than 5 in flight, the rest 429, every slot back', async () => {
      const prefix = suite.prefix('rlc')
      let inFlight = 0
      let most = 0
      const handler: RouteHandlerMethod = async () => {
        inFlight++
        most = Math.max(most, inFlight)
        await sleep(20)
        inFlight--
        return 'ok'
      }
      const instances = [
        await instance(store, prefix, [exports()], handler),
        await instance(store, prefix, [exports()], handler),
        await instance(store, prefix, [exports()], handler),
      ]
      const responses = await Promise.all(
        Array.from({ length: 200 }, (_, i) => get(instances[i % 3]!.url, 'ann')),
      )
      const statuses = responses.map((r) => r.status)
      assert.ok(most <= 5, `${most} in flight at once`)
      assert.equal(statuses.filter((s) => s !== 200 && s !== 429).length, 0, String(statuses))
      assert.ok(statuses.filter((s) => s === 200).length >= 5, 'the slots were used')
      const refused = responses.find((r) => r.status === 429)!
      assert.equal(refused.headers.get('retry-after'), '1')
      assert.equal(refused.headers.get('ratelimit-policy'), '"exports";q=5;qu="concurrent-requests"')
      assert.match(
        (await refused.json()).detail,
        /Rate limit 'exports' \(5 requests at once\) reached; retry in 1 s/,
      )
      const admitted = responses.find((r) => r.status === 200)!
      assert.match(String(admitted.headers.get('ratelimit')), /^"exports";r=[0-4];t=0$/)
      await until('every slot back', async () => (await free(instances[0]!.app, 'ann')) === 5)
      if (store === 'redis')
        assert.equal(await suite.redis.hlen(`${prefix}{${await tag('customer:ann')}}:exports:concurrency`), 0)
    })

    test('a client that goes away gives its slot back; a streamed body holds it to its last byte, or until it fails', async () => {
      const prefix = suite.prefix('rlc')
      const bodies: PassThrough[] = []
      let release!: () => void
      const hung = new Promise<void>((resolve) => {
        release = resolve
      })
      const { app, url } = await instance(store, prefix, [exports({ limit: 2 })], async (request, reply) => {
        if (request.headers['x-mode'] === 'hang') {
          await hung
          return 'late'
        }
        const body = new PassThrough()
        bodies.push(body)
        body.write('first line\n')
        return reply.send(body)
      })
      // Aborted while its handler still runs.
      const controller = new AbortController()
      const aborted = fetch(url, {
        headers: { 'x-customer': 'bo', 'x-mode': 'hang' },
        signal: controller.signal,
      })
      await until('the slot taken', async () => (await free(app, 'bo')) === 1)
      controller.abort()
      await assert.rejects(aborted)
      await until('the aborted request’s slot back', async () => (await free(app, 'bo')) === 2)
      release()

      // A streamed body: the slot is held while it streams.
      const streamed = await get(url, 'bo')
      assert.equal(streamed.status, 200)
      const reader = streamed.body!.getReader()
      await reader.read()
      assert.equal(await free(app, 'bo'), 1, 'held while the body streams')
      bodies[0]!.end('last line\n')
      while (!(await reader.read()).done) {}
      await until('the slot back after the last byte', async () => (await free(app, 'bo')) === 2)

      // A body that fails midway.
      const failing = await get(url, 'bo')
      await failing.body!.getReader().read()
      assert.equal(await free(app, 'bo'), 1)
      bodies[1]!.destroy(new Error('the export query failed'))
      await until('the slot back after the failure', async () => (await free(app, 'bo')) === 2)
    })

    test('beside a rate policy: refused by either, nothing is held by the other', async () => {
      const prefix = suite.prefix('rlc')
      const { app, url } = await instance(
        store,
        prefix,
        [
          exports({ limit: 3 }),
          { name: 'daily', algorithm: 'fixed-window', limit: 2, windowMs: '1 day', key: byCustomer },
        ],
        async () => 'ok',
      )
      const statuses = []
      for (let i = 0; i < 3; i++) statuses.push((await get(url, 'cy')).status)
      assert.deepEqual(statuses, [200, 200, 429])
      // The third took a slot, then the daily limit refused it: the slot went back at once.
      await until('the slot back', async () => (await free(app, 'cy')) === 3)
    })
  })
}

test('a dead instance’s slots come back when their lease ends', async () => {
  const prefix = suite.prefix('rlc')
  const own = createRedisClient(testRedisConnection())
  await connectRedis(own)
  let started!: () => void
  const running = new Promise<void>((resolve) => {
    started = resolve
  })
  const dying = await instance(
    'redis',
    prefix,
    [exports({ limit: 1, leaseMs: 500 })],
    async () => {
      started()
      await sleep(60_000)
      return 'never'
    },
    own,
  )
  const other = await instance('redis', prefix, [exports({ limit: 1, leaseMs: 500 })], async () => 'ok')
  const controller = new AbortController()
  const held = get(dying.url, 'di', controller.signal).catch(() => null)
  await running
  // The instance loses Redis before its request ends: it can never give the slot back.
  own.disconnect()
  controller.abort()
  await held
  assert.equal((await get(other.url, 'di')).status, 429, 'the slot is still held')
  await until('the lease to end', async () => (await get(other.url, 'di')).status === 200, 5000)
})

test('an instance killed (SIGKILL) while holding slots: they are held until their lease ends, then free', async () => {
  const prefix = suite.prefix('rlc')
  // Long enough that the kill and the check after it fit inside it on a loaded machine.
  const leaseMs = 5000
  const child = spawn(
    process.execPath,
    [...RUN_TYPESCRIPT, join(import.meta.dirname, '../../helpers/concurrency-child.ts')],
    {
      env: { ...process.env, CHILD_PREFIX: prefix, CHILD_LIMIT: '2', CHILD_LEASE_MS: String(leaseMs) },
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  )
  const exited = once(child, 'exit')
  try {
    const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]()
    const url = String((await lines.next()).value)
    const held = [get(url, 'k9').catch(() => null), get(url, 'k9').catch(() => null)]
    for (const _ of held) assert.equal((await lines.next()).value, 'holding')
    const other = await instance('redis', prefix, [exports({ limit: 2, leaseMs })], async () => 'ok')
    assert.equal(await free(other.app, 'k9'), 0)
    child.kill('SIGKILL')
    await exited
    await Promise.all(held)
    // Nobody gave the slots back: the lease does.
    const refused = await get(other.url, 'k9')
    assert.equal(refused.status, 429)
    assert.ok(Number(refused.headers.get('retry-after')) >= 1)
    await until('the leases to end', async () => (await free(other.app, 'k9')) === 2, 20_000)
    assert.deepEqual(
      await Promise.all([get(other.url, 'k9'), get(other.url, 'k9')].map(async (r) => (await r).status)),
      [200, 200],
    )
  } finally {
    child.kill('SIGKILL')
  }
})

test('a concurrency policy takes leaseMs, not a window; consume() only peeks at it', async () => {
  for (const [policy, message] of [
    [exports({ windowMs: 1000 }), /`windowMs` does not apply to concurrency/],
    [
      { name: 'w', algorithm: 'fixed-window', limit: 1, windowMs: 1000, leaseMs: 5 },
      /`leaseMs` applies to concurrency only/,
    ],
    [exports({ countOnlyFailures: true }), /`countOnlyFailures` does not apply to concurrency/],
    [exports({ sync: true }), /`sync` applies to fixed-window, token-bucket and gcra/],
  ] as const) {
    const app = Fastify()
    await assert.rejects(async () => {
      await app.register(rateLimit, { store: 'memory', namedPolicies: [policy as RateLimitPolicy] })
      await app.ready()
    }, message)
    await app.close().catch(() => {})
  }
  const app = Fastify()
  await app.register(rateLimit, {
    store: 'memory',
    keyPrefix: uniquePrefix('rlc'),
    namedPolicies: [exports()],
  })
  await app.ready()
  suite.apps.push(app)
  assert.equal((await app.rateLimiter.consume('exports', 'customer:x', 0)).remaining, 5)
  await assert.rejects(app.rateLimiter.consume('exports', 'customer:x'), /counts requests in flight/)
})

async function tag(identity: string): Promise<string> {
  const { identityTag } = await import('../../../src/plugins/rate-limit/keys.ts')
  return identityTag(identity)
}
