import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import metrics from '../../../src/plugins/metrics/index.ts'
import { memoryStoreOf } from '../../../src/plugins/rate-limit/engine.ts'
import rateLimit, {
  keyBy,
  type RateLimitPluginOptions,
  type RouteRateLimit,
} from '../../../src/plugins/rate-limit/index.ts'
import { runEncoded } from '../../../src/plugins/rate-limit/protocol.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { scriptSources } from '../../../src/redis/scripts.ts'
import { keysWithoutTtl, listen, scanKeys, TEST_REDIS_URL, uniquePrefix } from '../../helpers/index.ts'

// REDIS_CLUSTER_NODES (set by `npm run test:cluster`) runs the same tests on a Redis Cluster.
const clusterNodes = process.env.REDIS_CLUSTER_NODES?.split(',').map((n) => {
  const [host, port] = n.split(':') as [string, string]
  return { host, port: Number(port) }
})

let redis: RedisClient
const prefix = uniquePrefix('rl')
const memoryPrefix = uniquePrefix('rlm')
const apps: FastifyInstance[] = []

before(async () => {
  redis = createRedisClient(clusterNodes ? { clusterNodes } : { url: TEST_REDIS_URL })
  await connectRedis(redis)
})

after(async () => {
  try {
    for (const app of apps) await app.close()
    // No rate-limit key may outlive its window: every one carries a TTL.
    assert.deepEqual(await keysWithoutTtl(redis, prefix), [])
  } finally {
    // A failed check must not leave the client open: the file's process would never end.
    redis?.disconnect()
  }
})

type Routes = Record<string, RouteRateLimit>
type Store = 'redis' | 'memory'

async function buildApp(
  routes: Routes,
  options: RateLimitPluginOptions = {},
  setup: (app: FastifyInstance) => void = () => {},
  store: Store = 'redis',
): Promise<FastifyInstance> {
  const app = Fastify()
  await app.register(metrics, { path: '/metrics', processMetrics: false })
  await app.register(
    rateLimit,
    store === 'redis'
      ? { redis, keyPrefix: prefix, ...options }
      : { store: 'memory', keyPrefix: memoryPrefix, ...options },
  )
  for (const [path, rateLimits] of Object.entries(routes)) {
    app.get(path, { config: { rateLimits } }, async (request, reply) => {
      const status = Number((request.query as { status?: string }).status ?? 200)
      return reply.code(status).send({ ok: status < 400 })
    })
  }
  setup(app)
  await app.ready()
  apps.push(app)
  return app
}

/** A policy's counter key ends with its name and algorithm (a sliding counter's, with its window): `…}:<name>:<algorithm>`. */
const isKeyOf = (key: string, name: string) =>
  /^(fixed-window|sliding-log|sliding-counter:\d+|token-bucket|gcra)$/.test(
    key.slice(key.lastIndexOf(`}:${name}:`) + name.length + 3),
  ) && key.includes(`}:${name}:`)

/** The Redis key of a policy for a client on 127.0.0.1 (found by scanning: names are unique per test). */
async function keyOf(name: string): Promise<string> {
  const keys = (await scanKeys(redis, prefix)).filter((k) => isKeyOf(k, name))
  assert.equal(keys.length, 1, `one key for ${name}`)
  return keys[0]!
}

/** What a test reads of a policy's stored state, in Redis or in the memory store alike. */
interface Inspector {
  /** The key of a policy (one per test: names are unique per test). */
  key(name: string): Promise<string>
  /** A fixed-window counter. */
  counter(name: string): Promise<number>
  /** Entries in a sliding log. */
  logSize(name: string): Promise<number>
  /** Tokens in a bucket. */
  tokens(name: string): Promise<number>
  /** Milliseconds the key has left (negative: none). */
  ttl(name: string): Promise<number>
}

// A key is found once (while it exists) and remembered: a test may look again after it expired.
const redisKeys = new Map<string, string>()
const redisKey = async (name: string) => {
  if (!redisKeys.has(name)) redisKeys.set(name, await keyOf(name))
  return redisKeys.get(name)!
}
const inRedis: Inspector = {
  key: redisKey,
  counter: async (name) => Number(await redis.get(await redisKey(name))),
  logSize: async (name) => redis.zcard(await redisKey(name)),
  tokens: async (name) => Number(await redis.hget(await redisKey(name), 't')),
  ttl: async (name) => redis.pttl(await redisKey(name)),
}

const memoryKeys = new Map<string, string>()
function memoryKey(name: string): string {
  if (!memoryKeys.has(name)) {
    const keys = memoryStoreOf(memoryPrefix)!
      .keys()
      .filter((k) => isKeyOf(k, name))
    assert.equal(keys.length, 1, `one key for ${name}`)
    memoryKeys.set(name, keys[0]!)
  }
  return memoryKeys.get(name)!
}
const entry = (name: string) => memoryStoreOf(memoryPrefix)!.inspect(memoryKey(name))
const inMemory: Inspector = {
  key: async (name) => memoryKey(name),
  counter: async (name) => entry(name)?.n ?? 0,
  logSize: async (name) => entry(name)?.times?.length ?? 0,
  tokens: async (name) => entry(name)!.n,
  ttl: async (name) => {
    const e = entry(name)
    return e ? e.exp - Date.now() : -2
  },
}

async function burst(url: string, n: number, headers: Record<string, string> = {}) {
  const responses = await Promise.all(Array.from({ length: n }, () => fetch(url, { headers })))
  const bodies = await Promise.all(responses.map((r) => r.text()))
  return responses.map((r, i) => ({ status: r.status, headers: r.headers, body: bodies[i]! }))
}

const count = (rs: Array<{ status: number }>, status: number) => rs.filter((r) => r.status === status).length

// One suite, run against both stores: every algorithm has the same semantics and headers in Redis
// and in process (`store: 'memory'`). What only Redis has (scripts called directly, TTL repair,
// the over-limit cache in front of Redis) is tested after it.
for (const store of ['redis', 'memory'] as const) {
  const inspect = store === 'redis' ? inRedis : inMemory
  const build = (
    routes: Routes,
    options: RateLimitPluginOptions = {},
    setup?: (app: FastifyInstance) => void,
  ) => buildApp(routes, options, setup, store)
  describe(`store: ${store}`, () => {
    describe('exactness under real concurrency, over HTTP', () => {
      const N = 60
      const L = 20
      for (const algorithm of ['fixed-window', 'sliding-log', 'sliding-counter'] as const) {
        test(`${algorithm}: ${N} simultaneous requests against ${L} allow exactly ${L}`, async () => {
          const name = `exact-${algorithm}`
          const app = await build({ '/x': { name, algorithm, limit: L, windowMs: 60_000 } })
          const rs = await burst(`${await listen(app)}/x`, N)
          assert.equal(count(rs, 200), L)
          assert.equal(count(rs, 429), N - L)
          const rejected = rs.find((r) => r.status === 429)!
          assert.equal(rejected.headers.get('content-type'), 'application/problem+json; charset=utf-8')
          assert.equal(JSON.parse(rejected.body).policy, name)
          assert.ok(Number(rejected.headers.get('retry-after')) >= 1)
          if (algorithm === 'sliding-log') assert.equal(await inspect.logSize(name), L)
        })
      }

      test('token bucket: never more than capacity plus what refilled during the burst', async () => {
        const app = await build({
          '/x': { name: 'exact-bucket', algorithm: 'token-bucket', limit: L, refillPerSecond: 2 },
        })
        const started = Date.now()
        const rs = await burst(`${await listen(app)}/x`, N)
        const bound = L + Math.ceil(((Date.now() - started) / 1000) * 2)
        assert.ok(count(rs, 200) >= L && count(rs, 200) <= bound, `${count(rs, 200)} in [${L}, ${bound}]`)
      })

      test('GCRA: a burst of exactly the limit, then one per period / limit', async () => {
        const app = await build({
          '/x': { name: 'exact-gcra', algorithm: 'gcra', limit: L, windowMs: 60_000 },
        })
        const started = Date.now()
        const rs = await burst(`${await listen(app)}/x`, N)
        const bound = L + Math.ceil((Date.now() - started) / (60_000 / L))
        assert.ok(count(rs, 200) >= L && count(rs, 200) <= bound, `${count(rs, 200)} in [${L}, ${bound}]`)
      })
    })

    test('fixed window lets 2L - 1 through within one window span at its edge; the sliding log does not', async () => {
      const L = 5
      const W = 1000
      for (let attempt = 1; ; attempt++) {
        const app = await build({
          '/fixed': { name: `edge-fixed-${attempt}`, algorithm: 'fixed-window', limit: L, windowMs: W },
          '/log': { name: `edge-log-${attempt}`, algorithm: 'sliding-log', limit: L, windowMs: W },
        })
        const url = await listen(app)
        // One request opens both windows; the rest of the quota is used just before the fixed one ends.
        const opening = [...(await burst(`${url}/fixed`, 1)), ...(await burst(`${url}/log`, 1))]
        // The log's opening request was counted by now: its slot is free one window later.
        const logOpenedBy = Date.now()
        const fixedName = `edge-fixed-${attempt}`
        await inspect.key(fixedName)
        await new Promise((r) => setTimeout(r, W - 200))
        const started = Date.now()
        const late = [...(await burst(`${url}/fixed`, L - 1)), ...(await burst(`${url}/log`, L - 1))]
        if ((await inspect.ttl(fixedName)) < 0 && attempt < 3) continue
        while ((await inspect.ttl(fixedName)) > 0) await new Promise((r) => setTimeout(r, 10))
        const fixed = await burst(`${url}/fixed`, L)
        // On a slow machine the fixed window can end before the opening log request's slot frees.
        while (Date.now() <= logOpenedBy + W + 5) await new Promise((r) => setTimeout(r, 5))
        const log = await burst(`${url}/log`, L)
        if (Date.now() - started >= W && attempt < 3) continue
        assert.equal(count([...opening, ...late], 200), 2 * L)
        assert.equal(count(fixed, 200), L, 'fixed window: 2L - 1 admitted in less than one window')
        assert.equal(count(log, 200), 1, 'sliding log: only the slot the opening request freed')
        return
      }
    })

    test('a costly request never overdraws the token bucket', async () => {
      const app = await build({
        '/x': {
          name: 'costly',
          algorithm: 'token-bucket',
          limit: 10,
          refillPerSecond: 0.01,
          cost: (request) => Number(request.headers['x-cost'] ?? 1),
        },
      })
      const statuses = []
      for (const cost of [4, 4, 4, 3, 2]) {
        statuses.push((await app.inject({ url: '/x', headers: { 'x-cost': String(cost) } })).statusCode)
      }
      assert.deepEqual(statuses, [200, 200, 429, 429, 200])
      const tokens = await inspect.tokens('costly')
      assert.ok(tokens >= 0 && tokens < 0.1, `tokens ${tokens}`)
    })

    test('rejected requests do not extend a block in the sliding log', async () => {
      const app = await build({
        '/x': { name: 'no-extend', algorithm: 'sliding-log', limit: 2, windowMs: 800 },
      })
      assert.deepEqual([(await app.inject('/x')).statusCode, (await app.inject('/x')).statusCode], [200, 200])
      let rejected = 0
      // Keep hammering while blocked; if rejections were recorded the block would never end.
      const deadline = Date.now() + 5000
      let status = 429
      while (status === 429 && Date.now() < deadline) {
        status = (await app.inject('/x')).statusCode
        if (status === 429) rejected++
        assert.ok((await inspect.logSize('no-extend')) <= 2)
        await new Promise((r) => setTimeout(r, 50))
      }
      assert.equal(status, 200)
      assert.ok(rejected > 3)
    })

    test('a rejection by one policy leaves its siblings untouched (one script call, all-or-nothing)', async () => {
      const app = await build({
        '/fixed': [
          { name: 'sib-wide', algorithm: 'fixed-window', limit: 5, windowMs: 60_000 },
          { name: 'sib-tight', algorithm: 'fixed-window', limit: 2, windowMs: 60_000 },
        ],
        '/log': [
          { name: 'sib-log-wide', algorithm: 'sliding-log', limit: 5, windowMs: 60_000 },
          { name: 'sib-log-tight', algorithm: 'sliding-log', limit: 2, windowMs: 60_000 },
        ],
      })
      for (const path of ['/fixed', '/log']) {
        const statuses = []
        for (let i = 0; i < 4; i++) statuses.push((await app.inject(path)).statusCode)
        assert.deepEqual(statuses, [200, 200, 429, 429])
      }
      assert.equal(await inspect.counter('sib-wide'), 2)
      assert.equal(await inspect.logSize('sib-log-wide'), 2)
      const wide = await inspect.key('sib-wide')
      const tight = await inspect.key('sib-tight')
      assert.equal(wide.slice(0, wide.indexOf('}')), tight.slice(0, tight.indexOf('}')), 'one hash tag')
    })

    test('RateLimit-Policy and RateLimit headers follow the draft; legacy headers only on request', async () => {
      const routes: Routes = {
        '/two': [
          { name: 'hdr-minute', algorithm: 'fixed-window', limit: 3, windowMs: 60_000 },
          { name: 'hdr-bucket', algorithm: 'token-bucket', limit: 10, refillPerSecond: 5 },
        ],
      }
      const app = await build(routes)
      const res = await app.inject('/two')
      assert.equal(res.headers['ratelimit-policy'], '"hdr-minute";q=3;w=60, "hdr-bucket";q=10;w=2')
      assert.match(String(res.headers.ratelimit), /^"hdr-minute";r=2;t=\d+, "hdr-bucket";r=9;t=1$/)
      assert.equal(res.headers['x-ratelimit-remaining'], undefined)
      for (let i = 0; i < 2; i++) await app.inject('/two')
      const limited = await app.inject('/two')
      assert.equal(limited.statusCode, 429)
      const body = limited.json()
      assert.equal(body.type, '/problems/rate-limited')
      assert.equal(body.status, 429)
      assert.equal(body.policy, 'hdr-minute')
      assert.match(body.detail, /hdr-minute/)
      assert.ok(Number(limited.headers['retry-after']) >= 1)

      const legacy = await build(
        { '/legacy': { name: 'hdr-legacy', algorithm: 'gcra', limit: 4, windowMs: 60_000 } },
        { legacyHeaders: true },
      )
      const l = await legacy.inject('/legacy')
      assert.equal(l.headers['x-ratelimit-limit'], '4')
      assert.equal(l.headers['x-ratelimit-remaining'], '3')
      assert.ok(Number(l.headers['x-ratelimit-reset']) >= 1)
    })

    test('peek checks without consuming', async () => {
      const app = await build(
        {},
        { namedPolicies: [{ name: 'peeked', algorithm: 'sliding-log', limit: 3, windowMs: 60_000 }] },
        (app) => {
          app.get('/peek', async (request) => (await app.rateLimiter.peek(request, 'peeked'))[0]!.remaining)
          app.get('/use', { config: { rateLimits: 'peeked' } }, async () => 'ok')
        },
      )
      assert.equal((await app.inject('/peek')).body, '3')
      assert.equal((await app.inject('/peek')).body, '3')
      await app.inject('/use')
      assert.equal((await app.inject('/peek')).body, '2')
    })

    for (const algorithm of [
      'fixed-window',
      'sliding-log',
      'sliding-counter',
      'token-bucket',
      'gcra',
    ] as const) {
      test(`count only failures (${algorithm}): successes are given back, failures count`, async () => {
        const name = `failures-${algorithm}`
        const window = algorithm === 'token-bucket' ? { refillPerSecond: 0.001 } : { windowMs: 60_000 }
        const app = await build({
          '/login': { name, algorithm, limit: 2, ...window, countOnlyFailures: true },
        })
        for (let i = 0; i < 5; i++) assert.equal((await app.inject('/login')).statusCode, 200)
        assert.equal((await app.inject('/login?status=401')).statusCode, 401)
        assert.equal((await app.inject('/login')).statusCode, 200)
        assert.equal((await app.inject('/login?status=401')).statusCode, 401)
        assert.equal((await app.inject('/login?status=401')).statusCode, 429)
        assert.equal((await app.inject('/login')).statusCode, 429, 'blocked after two failures')
        if (algorithm === 'sliding-log') assert.equal(await inspect.logSize(name), 2)
      })
    }

    test('allow lists skip limiting (plugin-wide and per policy)', async () => {
      const app = await build(
        { '/x': { name: 'allow-a', algorithm: 'fixed-window', limit: 1, windowMs: 60_000 } },
        {
          allowList: ['127.0.0.1'],
        },
      )
      for (let i = 0; i < 3; i++) assert.equal((await app.inject('/x')).statusCode, 200)
      assert.equal((await app.inject('/x')).headers.ratelimit, undefined)
      const per = await build({
        '/y': {
          name: 'allow-b',
          algorithm: 'fixed-window',
          limit: 1,
          windowMs: 60_000,
          allowList: (request) => request.headers['x-internal'] === 'yes',
        },
      })
      assert.equal((await per.inject('/y')).statusCode, 200)
      assert.equal((await per.inject({ url: '/y', headers: { 'x-internal': 'yes' } })).statusCode, 200)
      assert.equal((await per.inject('/y')).statusCode, 429)
    })

    test('delay mode slows a client down instead of rejecting it, up to the bound', async () => {
      const app = await build({
        '/tb': {
          name: 'delay-tb',
          algorithm: 'token-bucket',
          limit: 2,
          refillPerSecond: 20,
          maxDelayMs: 400,
        },
        '/gcra': { name: 'delay-gcra', algorithm: 'gcra', limit: 2, windowMs: 100, maxDelayMs: 400 },
        '/short': { name: 'delay-short', algorithm: 'gcra', limit: 1, windowMs: 60_000, maxDelayMs: 10 },
      })
      const url = await listen(app)
      for (const path of ['/tb', '/gcra']) assert.equal(count(await burst(`${url}${path}`, 6), 200), 6)
      const text = await (await fetch(`${url}/metrics`)).text()
      assert.match(text, /rate_limit_decisions_total\{policy="delay-tb",outcome="delayed"\} [1-9]/)
      assert.match(text, /rate_limit_decisions_total\{policy="delay-gcra",outcome="delayed"\} [1-9]/)
      assert.deepEqual((await burst(`${url}/short`, 2)).map((r) => r.status).sort(), [200, 429])
    })

    test('client-supplied key parts are hashed: bounded length, no braces reach the key', async () => {
      const app = await build({
        '/x': {
          name: 'hashed',
          algorithm: 'fixed-window',
          limit: 5,
          windowMs: 60_000,
          key: keyBy.header('x-user'),
        },
      })
      await app.inject({ url: '/x', headers: { 'x-user': `{evil}${'x'.repeat(5000)}` } })
      const key = await inspect.key('hashed')
      const keyPrefix = store === 'redis' ? prefix : memoryPrefix
      assert.equal(
        key,
        `${keyPrefix}{${key.slice(keyPrefix.length + 1, keyPrefix.length + 23)}}:hashed:fixed-window`,
      )
      assert.match(key.slice(keyPrefix.length), /^\{[A-Za-z0-9_-]{22}\}:hashed:fixed-window$/)
      // No key identity (header absent): the policy does not apply.
      assert.equal((await app.inject('/x')).headers.ratelimit, undefined)
    })
  })
}

test('same-millisecond bursts: a pipelined burst into the sliding log is counted exactly', async () => {
  const app = await buildApp({
    '/x': { name: 'same-ms', algorithm: 'sliding-log', limit: 100, windowMs: 60_000 },
  })
  await app.inject('/x')
  const key = await keyOf('same-ms')
  const { lua } = scriptSources.get('rateLimitSlidingLog')!
  const pipeline = redis.pipeline()
  // 40 calls written at once run back to back inside Redis, mostly within the same millisecond.
  for (let i = 0; i < 40; i++) pipeline.eval(lua, 1, key, 'c', `burst${i}`, 100, 60_000, 1, 0)
  const replies = (await pipeline.exec())!.map(([err, reply]) => {
    assert.equal(err, null)
    return (reply as number[])[0]
  })
  assert.equal(replies.filter((r) => r === 1).length, 40)
  assert.equal(await redis.zcard(key), 41)
  const scores = await redis.zrange(key, 0, '-1', 'WITHSCORES')
  const distinct = new Set(scores.filter((_, i) => i % 2 === 1))
  assert.ok(distinct.size < 41, 'several members share a millisecond and none collapsed')
})

test('a key that lost its TTL is repaired on the next visit, for every algorithm', async () => {
  const routes: Routes = {
    '/fw': { name: 'ttl-fw', algorithm: 'fixed-window', limit: 1, windowMs: 60_000 },
    '/log': { name: 'ttl-log', algorithm: 'sliding-log', limit: 1, windowMs: 60_000 },
    '/sc': { name: 'ttl-sc', algorithm: 'sliding-counter', limit: 1, windowMs: 60_000 },
    '/tb': { name: 'ttl-tb', algorithm: 'token-bucket', limit: 1, refillPerSecond: 0.1 },
    '/gcra': { name: 'ttl-gcra', algorithm: 'gcra', limit: 1, windowMs: 60_000 },
  }
  const app = await buildApp(routes, { overLimitCacheKeys: 0 })
  for (const [path, policy] of Object.entries(routes)) {
    assert.equal((await app.inject(path)).statusCode, 200)
    const key = await keyOf((policy as { name: string }).name)
    await redis.persist(key)
    assert.equal(await redis.pttl(key), -1)
    assert.equal((await app.inject(path)).statusCode, 429, `${path} still limited`)
    assert.ok((await redis.pttl(key)) > 0, `${path} TTL repaired`)
  }
})

test('keys already over their limit are answered from memory until their retry time', async () => {
  const app = await buildApp({
    '/x': { name: 'cached', algorithm: 'fixed-window', limit: 1, windowMs: 60_000 },
  })
  const statuses = []
  for (let i = 0; i < 4; i++) statuses.push((await app.inject('/x')).statusCode)
  assert.deepEqual(statuses, [200, 429, 429, 429])
  const text = (await app.inject('/metrics')).body
  assert.match(text, /policy="cached",outcome="rejected"\} 1\n/)
  assert.match(text, /policy="cached",outcome="rejected_cached"\} 2\n/)
  assert.equal(await redis.get(await keyOf('cached')), '1')
})

describe('options are checked at registration', () => {
  const cases: Array<[string, RateLimitPluginOptions, string]> = [
    [
      'limit',
      { policies: [{ name: 'a', algorithm: 'fixed-window', limit: 0, windowMs: 1000 }] },
      "rate-limit plugin: policy 'a': `limit` must be a positive integer or a function of the request",
    ],
    [
      'algorithm',
      { policies: [{ name: 'a', algorithm: 'leaky' as never, limit: 1, windowMs: 1000 }] },
      "rate-limit plugin: policy 'a': `algorithm` must be one of fixed-window, sliding-log, sliding-counter, token-bucket, gcra, concurrency",
    ],
    [
      'refill',
      { policies: [{ name: 'a', algorithm: 'token-bucket', limit: 1 }] },
      "rate-limit plugin: policy 'a': `refillPerSecond` must be a positive number",
    ],
    [
      'delay',
      { policies: [{ name: 'a', algorithm: 'fixed-window', limit: 1, windowMs: 1000, maxDelayMs: 10 }] },
      "rate-limit plugin: policy 'a': `maxDelayMs` applies to token-bucket and gcra only",
    ],
    [
      'cost',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 2, windowMs: 1000, cost: 3 }] },
      "rate-limit plugin: policy 'a': `cost` must be a positive integer no larger than `limit`, or a function",
    ],
    [
      'name',
      { policies: [{ name: 'a b', algorithm: 'gcra', limit: 2, windowMs: 1000 }] },
      "rate-limit plugin: policy 'a b': `name` must be 1-64 characters of A-Z a-z 0-9 _ . -",
    ],
    [
      'session key in onRequest',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 2, windowMs: 1000, key: keyBy.customer }] },
      "rate-limit plugin: policy 'a': `key` reads the session or the body, which onRequest does not have yet: set hook: 'preHandler'",
    ],
    [
      'body key in onRequest',
      {
        policies: [
          {
            name: 'a',
            algorithm: 'gcra',
            limit: 2,
            windowMs: 1000,
            key: keyBy.bodyField('username'),
            hook: 'onRequest',
          },
        ],
      },
      "rate-limit plugin: policy 'a': `key` reads the session or the body, which onRequest does not have yet: set hook: 'preHandler'",
    ],
    [
      'twice',
      {
        policies: [{ name: 'a', algorithm: 'gcra', limit: 2, windowMs: 1000 }],
        namedPolicies: [{ name: 'a', algorithm: 'gcra', limit: 3, windowMs: 1000 }],
      },
      "rate-limit plugin: policy 'a' is defined twice with different settings",
    ],
    [
      'cache',
      { overLimitCacheKeys: -1 },
      'rate-limit plugin: `overLimitCacheKeys` must be an integer of at least 0, got -1',
    ],
    [
      'legacyHeaders',
      { legacyHeaders: 'yes' as never },
      "rate-limit plugin: `legacyHeaders` must be true or false, got a string ('yes')",
    ],
    [
      'windowMs: not a duration',
      { policies: [{ name: 'a', algorithm: 'fixed-window', limit: 1, windowMs: '10 parsecs' }] },
      "rate-limit plugin: policy 'a': `windowMs`: '10 parsecs' is not a duration (milliseconds, or a number and a unit: '500ms', '10s', '1 minute', '2h')",
    ],
    [
      'windowMs: not a whole number of ms',
      { policies: [{ name: 'a', algorithm: 'fixed-window', limit: 1, windowMs: '0.5ms' }] },
      "rate-limit plugin: policy 'a': `windowMs` must be a positive whole number of milliseconds, a duration string such as '500ms', '10s', '1 minute', '2h', or a function of the request (got '0.5ms')",
    ],
    [
      'windowMs: zero',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 0 }] },
      "rate-limit plugin: policy 'a': `windowMs` must be a positive whole number of milliseconds, a duration string such as '500ms', '10s', '1 minute', '2h', or a function of the request",
    ],
    [
      'blockMs: not a duration',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 1000, blockMs: 'soon' }] },
      "rate-limit plugin: policy 'a': `blockMs`: 'soon' is not a duration (milliseconds, or a number and a unit: '500ms', '10s', '1 minute', '2h')",
    ],
    [
      'blockMs: negative',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 1000, blockMs: -5 }] },
      "rate-limit plugin: policy 'a': `blockMs` must be a positive whole number of milliseconds or a duration string such as '500ms', '10s', '1 minute', '2h'",
    ],
    [
      'maxDelayMs: not a duration',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 1000, maxDelayMs: '5 sec later' }] },
      "rate-limit plugin: policy 'a': `maxDelayMs`: '5 sec later' is not a duration (milliseconds, or a number and a unit: '500ms', '10s', '1 minute', '2h')",
    ],
    [
      'maxDelayMs: negative',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 1000, maxDelayMs: -1 }] },
      "rate-limit plugin: policy 'a': `maxDelayMs` must be a non-negative whole number of milliseconds or a duration string such as '500ms', '10s', '1 minute', '2h'",
    ],
    [
      'retryRedisAfterMs: not a duration',
      { retryRedisAfterMs: '1 fortnight' },
      "rate-limit plugin: `retryRedisAfterMs`: '1 fortnight' is not a duration (milliseconds, or a number and a unit: '500ms', '10s', '1 minute', '2h')",
    ],
    [
      'timeoutMs: zero',
      { timeoutMs: 0 },
      "rate-limit plugin: `timeoutMs` must be a positive whole number of milliseconds or a duration string such as '500ms', '10s', '1 minute', '2h'",
    ],
    ['store', { store: 'disk' as never }, "rate-limit plugin: `store` must be 'redis' or 'memory'"],
    [
      'memoryMaxKeys',
      { store: 'memory', memoryMaxKeys: 10 },
      'rate-limit plugin: `memoryMaxKeys` must be an integer of at least 100, got 10',
    ],
    [
      'ipv6Subnet',
      { ipv6Subnet: 16 },
      'rate-limit plugin: `ipv6Subnet` must be an integer from 32 to 128, got 16',
    ],
    [
      'ipv6Subnet: not an integer',
      { ipv6Subnet: 64.5 },
      'rate-limit plugin: `ipv6Subnet` must be an integer from 32 to 128, got 64.5',
    ],
    [
      'onExceeded',
      { onExceeded: 'log it' as never },
      "rate-limit plugin: `onExceeded` must be a function of (request, decision), got a string ('log it')",
    ],
    [
      'errorResponse',
      { errorResponse: { error: 'slow down' } as never },
      'rate-limit plugin: `errorResponse` must be a function of (request, decision), got an object (Object)',
    ],
    [
      'policy onExceeded',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 1000, onExceeded: 1 as never }] },
      "rate-limit plugin: policy 'a': `onExceeded` must be a function of (request, decision)",
    ],
    [
      'policy errorResponse',
      { policies: [{ name: 'a', algorithm: 'gcra', limit: 1, windowMs: 1000, errorResponse: 'x' as never }] },
      "rate-limit plugin: policy 'a': `errorResponse` must be a function of (request, decision)",
    ],
  ]
  for (const [label, options, message] of cases) {
    test(label, async () => {
      const app = Fastify()
      await assert.rejects(
        async () => {
          await app.register(rateLimit, { redis, ...options })
        },
        { message },
      )
      await app.close()
    })
  }

  test('a route naming an unknown policy fails the boot', async () => {
    const app = Fastify()
    await app.register(rateLimit, { redis })
    // The plugin is loaded (its onRoute hook is in place); once the app is ready no route can be added at all.
    assert.throws(() => app.get('/x', { config: { rateLimits: 'nope' } }, async () => 'ok'), {
      name: 'RateLimitUnknownPolicyError',
      code: 'FRG_RATE_LIMIT_UNKNOWN_POLICY',
      message:
        "rate-limit plugin: route GET /x names unknown policy 'nope' (the plugin has no namedPolicies)",
    })
    await app.close()
  })
})

test('runs on a Redis Cluster when REDIS_CLUSTER_NODES is set', { skip: !clusterNodes }, () => {
  assert.ok('nodes' in redis && redis.nodes('master').length >= 3)
})

test('sliding counter estimate and the script layout hold for a direct call', async () => {
  const key = `${prefix}{direct}:counter`
  const call = { keys: [key], argv: ['c', 'n', 3, 60_000, 2, 0] }
  const reply = await runEncoded(redis, 'sliding-counter', call)
  assert.deepEqual(reply.slice(0, 3), [1, 0, 1])
  const again = await runEncoded(redis, 'sliding-counter', call)
  assert.equal(again[0], 0)
  assert.equal(await redis.hget(key, 'c'), '2')
})
