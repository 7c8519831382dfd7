import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { type RedisServerProcess, startRedisServer } from '../../../src/embedded/redis-server.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit, {
  type Algorithm,
  keyBy,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
  type RouteRateLimit,
} from '../../../src/plugins/rate-limit/index.ts'
import { identityTag } from '../../../src/plugins/rate-limit/keys.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { keysWithoutTtl, TEST_REDIS_URL, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { answerStatus, loggedApp } from './fixtures.ts'

let redis: RedisClient
const prefixes: string[] = []
const apps: FastifyInstance[] = []

before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})

after(async () => {
  for (const app of apps) await app.close()
  for (const prefix of prefixes) {
    assert.deepEqual(await keysWithoutTtl(redis, prefix), [], 'every rate-limit key carries a TTL')
  }
  redis.disconnect()
})

const newPrefix = () => {
  const prefix = uniquePrefix('rlh')
  prefixes.push(prefix)
  return prefix
}

interface Built {
  app: FastifyInstance
  prefix: string
  logs: Array<Record<string, unknown>>
}

/** An app whose routes answer `?status=` (default 200), with the plugin's logs collected. */
async function build(
  routes: Record<string, RouteRateLimit>,
  options: RateLimitPluginOptions = {},
): Promise<Built> {
  const { app, logs } = loggedApp()
  await app.register(metrics, { path: '/metrics', processMetrics: false })
  const prefix = options.keyPrefix ?? newPrefix()
  await app.register(rateLimit, { redis, keyPrefix: prefix, ...options })
  for (const [path, rateLimits] of Object.entries(routes)) {
    app.get(path, { config: { rateLimits } }, answerStatus)
  }
  await app.ready()
  apps.push(app)
  return { app, prefix, logs }
}

/** The key of a policy for a client on 127.0.0.1 (what `inject` sends from). */
const keyOf = (prefix: string, name: string, algorithm: Algorithm = 'fixed-window') =>
  `${prefix}{${identityTag('ip:127.0.0.1')}}:${name}:${algorithm}`

const other: RateLimitPolicy = { name: 'other', algorithm: 'fixed-window', limit: 5, windowMs: 60_000 }

/** A route answered by Redis says how much is left; a degraded (open) one cannot. */
async function assertDecidedByRedis(app: FastifyInstance) {
  const res = await app.inject('/other')
  assert.equal(res.statusCode, 200)
  assert.match(String(res.headers.ratelimit), /^"other";r=\d+;t=\d+$/, 'a Redis decision, not a degraded one')
}

function assertNotChecked(res: { statusCode: number; headers: Record<string, unknown>; json(): unknown }) {
  assert.equal(res.statusCode, 500)
  assert.equal(res.headers['content-type'], 'application/problem+json; charset=utf-8')
  const body = res.json() as Record<string, unknown>
  assert.equal(body.type, '/problems/rate-limit-error')
  assert.equal(body.status, 500)
  return body
}

describe('sliding-log members are unique per process, whatever the number of plugin instances', () => {
  test('two apps, one key space, limit 5: 10 alternating requests admit exactly 5', async () => {
    const prefix = newPrefix()
    const policy: RateLimitPolicy = {
      name: 'shared-log',
      algorithm: 'sliding-log',
      limit: 5,
      windowMs: 60_000,
    }
    const a = await build({ '/x': policy }, { keyPrefix: prefix })
    const b = await build({ '/x': policy }, { keyPrefix: prefix })
    const statuses = []
    for (let i = 0; i < 10; i++) statuses.push((await (i % 2 ? b : a).app.inject('/x')).statusCode)
    assert.equal(statuses.filter((s) => s === 200).length, 5, statuses.join(','))
    assert.equal(await redis.zcard(keyOf(prefix, 'shared-log', 'sliding-log')), 5)
  })

  test('two plugin instances in one app (encapsulated), one key space: exactly the limit', async () => {
    const prefix = newPrefix()
    const app = Fastify()
    for (const path of ['/a', '/b']) {
      await app.register(async (scope) => {
        await scope.register(rateLimit, {
          redis,
          keyPrefix: prefix,
          policies: [{ name: 'scoped-log', algorithm: 'sliding-log', limit: 3, windowMs: 60_000 }],
        })
        scope.get(path, async () => 'ok')
      })
    }
    await app.ready()
    apps.push(app)
    const statuses = []
    for (let i = 0; i < 6; i++) statuses.push((await app.inject(i % 2 ? '/b' : '/a')).statusCode)
    assert.deepEqual(statuses, [200, 200, 200, 429, 429, 429])
  })
})

describe('a cost function is checked per request; a bad one is that route’s 500, not a Redis outage', () => {
  const costly = (name: string, algorithm: 'fixed-window' | 'sliding-log' = 'fixed-window') =>
    ({
      name,
      algorithm,
      limit: 2,
      windowMs: 60_000,
      cost: (request) => {
        const raw = request.headers['x-cost'] as string | undefined
        return raw === undefined ? 1 : JSON.parse(raw)
      },
    }) satisfies RateLimitPolicy

  test('cost 1.5: 500 for that request (logged with the policy); an unrelated route still gets Redis', async () => {
    const { app, prefix, logs } = await build({ '/costly': costly('fraction'), '/other': other })
    const res = await app.inject({ url: '/costly', headers: { 'x-cost': '1.5' } })
    const body = assertNotChecked(res)
    assert.equal(body.policy, 'fraction')
    await assertDecidedByRedis(app)
    assert.equal(await redis.exists(keyOf(prefix, 'fraction')), 0, 'nothing consumed')
    const logged = logs.find((l) => l.policy === 'fraction')
    assert.ok(logged, 'logged with the policy name')
    assert.equal(logged.level, 50)
    assert.match(String((logged.err as { message: string }).message), /cost function returned 1\.5/)
    assert.ok(!logs.some((l) => /Redis unavailable/.test(String(l.msg))), 'not taken for an outage')
    const text = (await app.inject('/metrics')).body
    assert.match(text, /rate_limit_decisions_total\{policy="fraction",outcome="error"\} 1\n/)
    assert.doesNotMatch(text, /rate_limit_redis_unavailable_total [1-9]/)
  })

  test('a negative cost is refused and never hands quota back', async () => {
    const { app, prefix } = await build({ '/costly': costly('negative'), '/other': other })
    assert.equal((await app.inject('/costly')).statusCode, 200)
    assert.equal((await app.inject('/costly')).statusCode, 200)
    for (const cost of ['-1', '-2']) {
      assertNotChecked(await app.inject({ url: '/costly', headers: { 'x-cost': cost } }))
    }
    assert.equal((await app.inject('/costly')).statusCode, 429, 'the quota was not increased')
    assert.equal(await redis.get(keyOf(prefix, 'negative')), '2')
    await assertDecidedByRedis(app)
  })

  for (const algorithm of ['fixed-window', 'sliding-log'] as const) {
    test(`${algorithm}: NaN, Infinity, a string, nothing, a huge number: 500 each, nothing consumed`, async () => {
      const name = `odd-${algorithm}`
      const odd: Record<string, unknown> = {
        nan: Number.NaN,
        inf: Number.POSITIVE_INFINITY,
        str: '1',
        none: undefined,
        huge: 1e20,
      }
      const route: RateLimitPolicy = {
        ...costly(name, algorithm),
        cost: (request: FastifyRequest) => odd[String(request.headers['x-cost'])] as number,
      }
      const { app, prefix } = await build({ '/costly': route, '/other': other })
      for (const cost of ['nan', 'inf', 'str', 'none', 'huge']) {
        assertNotChecked(await app.inject({ url: '/costly', headers: { 'x-cost': cost } }))
        await assertDecidedByRedis(app)
      }
      assert.equal(await redis.exists(keyOf(prefix, name, algorithm)), 0, 'nothing consumed')
    })
  }

  test('cost 0: the request is free, the policy is skipped for it (no script call, no header)', async () => {
    const { app, prefix } = await build({ '/costly': costly('free', 'sliding-log'), '/other': other })
    for (let i = 0; i < 3; i++) {
      const res = await app.inject({ url: '/costly', headers: { 'x-cost': '0' } })
      assert.equal(res.statusCode, 200)
      assert.equal(res.headers['ratelimit-policy'], undefined)
    }
    await assertDecidedByRedis(app)
    assert.equal(await redis.exists(keyOf(prefix, 'free', 'sliding-log')), 0)
    const paid = [await app.inject('/costly'), await app.inject('/costly'), await app.inject('/costly')]
    assert.deepEqual(
      paid.map((r) => r.statusCode),
      [200, 200, 429],
      'the whole quota is still there',
    )
    assert.equal(
      (await app.inject({ url: '/costly', headers: { 'x-cost': '0' } })).statusCode,
      200,
      'free even when over',
    )
  })

  test('a computed cost above the limit can never pass: 429, and the counter is untouched', async () => {
    const { app, prefix } = await build({ '/costly': costly('too-big') })
    assert.equal((await app.inject('/costly')).statusCode, 200)
    for (const cost of ['3', String(Number.MAX_SAFE_INTEGER)]) {
      const res = await app.inject({ url: '/costly', headers: { 'x-cost': cost } })
      assert.equal(res.statusCode, 429)
      assert.equal(res.json().policy, 'too-big')
    }
    assert.equal(await redis.get(keyOf(prefix, 'too-big')), '1')
    assert.equal((await app.inject('/costly')).statusCode, 200)
  })
})

describe('other per-request failures of a policy are never taken for an outage', () => {
  test('Redis refusing the script (a key of another type) follows the policy’s onRedisError, logged once; other routes still use Redis', async () => {
    const prefix = newPrefix()
    await redis.hset(keyOf(prefix, 'wrong-type'), 'x', '1')
    await redis.pexpire(keyOf(prefix, 'wrong-type'), 60_000)
    const { app, logs } = await build(
      {
        '/x': { name: 'wrong-type', algorithm: 'fixed-window', limit: 5, windowMs: 60_000 },
        '/other': other,
      },
      { keyPrefix: prefix },
    )
    for (let i = 0; i < 2; i++) {
      const res = await app.inject('/x')
      assert.equal(res.statusCode, 200, 'open (the default): let through')
      assert.equal(res.headers['ratelimit-policy'], '"wrong-type";q=5;w=60')
      assert.equal(res.headers.ratelimit, undefined, 'nothing true to say about the quota')
      await assertDecidedByRedis(app)
    }
    const logged = logs.filter((l) => l.policy === 'wrong-type')
    assert.equal(logged.length, 1, 'logged once, not per request')
    assert.equal(logged[0]!.level, 50)
    assert.match(String((logged[0]!.err as { message: string }).message), /WRONGTYPE/)
  })

  test('a key function returning a non-string: 500 naming the policy; other routes unaffected', async () => {
    const { app } = await build({
      '/num': { name: 'numeric-key', algorithm: 'gcra', limit: 5, windowMs: 60_000, key: () => 42 as never },
      '/obj': { name: 'object-key', algorithm: 'gcra', limit: 5, windowMs: 60_000, key: () => ({}) as never },
      '/other': other,
    })
    assert.equal(assertNotChecked(await app.inject('/num')).policy, 'numeric-key')
    assert.equal(assertNotChecked(await app.inject('/obj')).policy, 'object-key')
    await assertDecidedByRedis(app)
  })

  test('a key, cost or allowList function that throws: 500 problem naming the policy, logged', async () => {
    const boom = () => {
      throw new Error('boom')
    }
    const { app, logs } = await build({
      '/key': { name: 'throwing-key', algorithm: 'gcra', limit: 5, windowMs: 60_000, key: boom },
      '/cost': { name: 'throwing-cost', algorithm: 'gcra', limit: 5, windowMs: 60_000, cost: boom },
      '/allow': { name: 'throwing-allow', algorithm: 'gcra', limit: 5, windowMs: 60_000, allowList: boom },
      '/other': other,
    })
    for (const name of ['key', 'cost', 'allow']) {
      assert.equal(assertNotChecked(await app.inject(`/${name}`)).policy, `throwing-${name}`)
      assert.ok(logs.some((l) => l.policy === `throwing-${name}` && l.level === 50))
    }
    await assertDecidedByRedis(app)
  })

  test('a plugin-wide allowList predicate that throws: 500 problem', async () => {
    const { app } = await build(
      { '/x': { name: 'allow-all', algorithm: 'gcra', limit: 5, windowMs: 60_000 } },
      {
        allowList: () => {
          throw new Error('boom')
        },
      },
    )
    assert.equal(assertNotChecked(await app.inject('/x')).policy, undefined)
  })

  test('a countOnlyFailures predicate that throws: the response goes out, the attempt stays counted', async () => {
    const { app, prefix, logs } = await build({
      '/x': {
        name: 'throwing-failures',
        algorithm: 'fixed-window',
        limit: 5,
        windowMs: 60_000,
        countOnlyFailures: () => {
          throw new Error('boom')
        },
      },
    })
    const res = await app.inject('/x')
    assert.equal(res.statusCode, 200)
    assert.deepEqual(res.json(), { ok: true })
    assert.equal(await redis.get(keyOf(prefix, 'throwing-failures')), '1')
    assert.ok(logs.some((l) => l.policy === 'throwing-failures' && l.level === 50))
  })
})

describe('a policy name is one set of settings: any other option under the same name fails the boot', () => {
  const base = { name: 'x', algorithm: 'gcra', limit: 5, windowMs: 60_000 } as const
  const costFn = () => 2
  const keyFn = keyBy.header('x-user')
  const failedFn = () => true
  const allowFn = () => false
  const variants: Array<[string, Partial<RateLimitPolicy>, Partial<RateLimitPolicy>]> = [
    ['cost', { cost: 1 }, { cost: 2 }],
    ['cost function', { cost: costFn }, { cost: () => 2 }],
    ['key', {}, { key: keyFn }],
    ['key function', { key: keyFn }, { key: keyBy.header('x-user') }],
    ['countOnlyFailures', {}, { countOnlyFailures: true }],
    ['countOnlyFailures predicate', { countOnlyFailures: true }, { countOnlyFailures: failedFn }],
    ['maxDelayMs', { maxDelayMs: 0 }, { maxDelayMs: 100 }],
    ['allowList', { allowList: ['10.0.0.1'] }, { allowList: ['10.0.0.2'] }],
    ['allowList predicate', {}, { allowList: allowFn }],
    ['blockMs', {}, { blockMs: 1000 }],
    ['blockMs as a string', { blockMs: '1s' }, { blockMs: '2s' }],
    ['windowMs as a string', { windowMs: '1 minute' }, { windowMs: '2 minutes' }],
    ['limit function', { limit: () => 5 }, { limit: () => 5 }],
  ]
  for (const [option, first, second] of variants) {
    test(`different ${option}: the second route fails to register`, async () => {
      const app = Fastify()
      await app.register(rateLimit, { redis, keyPrefix: newPrefix() })
      app.get('/a', { config: { rateLimits: { ...base, ...first } } }, async () => 'ok')
      assert.throws(
        () => app.get('/b', { config: { rateLimits: { ...base, ...second } } }, async () => 'ok'),
        {
          code: 'FRG_RATE_LIMIT_POLICY_CONFLICT',
          message:
            "rate-limit plugin: route GET /b: config.rateLimits: policy 'x' is defined twice with different settings",
        },
      )
      await app.close()
    })
  }

  test('different settings between namedPolicies and a route fail too', async () => {
    const app = Fastify()
    await app.register(rateLimit, {
      redis,
      keyPrefix: newPrefix(),
      namedPolicies: [{ ...base, cost: costFn }],
    })
    assert.throws(() => app.get('/b', { config: { rateLimits: { ...base, cost: 2 } } }, async () => 'ok'), {
      code: 'FRG_RATE_LIMIT_POLICY_CONFLICT',
      message:
        "rate-limit plugin: route GET /b: config.rateLimits: policy 'x' is defined twice with different settings",
    })
    await app.close()
  })

  test('the same settings (the same function objects, defaults written out or not) are one policy', async () => {
    const same: Partial<RateLimitPolicy> = {
      cost: costFn,
      key: keyFn,
      countOnlyFailures: failedFn,
      maxDelayMs: 100,
      allowList: allowFn,
    }
    const { app } = await build({
      '/a': { ...base, ...same },
      '/b': { ...base, ...same },
      // Defaults written out or left implicit, IPs in any order: the same settings.
      '/c': {
        ...base,
        name: 'z',
        key: 'ip',
        hook: 'onRequest',
        onRedisError: 'open',
        localShare: 1,
        cost: 1,
      },
      '/d': { ...base, name: 'z', maxDelayMs: 0, countOnlyFailures: false },
      '/e': { ...base, name: 'y', allowList: ['10.0.0.1', '10.0.0.2'] },
      '/f': { ...base, name: 'y', allowList: ['10.0.0.2', '10.0.0.1'] },
    })
    const a = await app.inject({ url: '/a', headers: { 'x-user': 'u1' } })
    const b = await app.inject({ url: '/b', headers: { 'x-user': 'u1' } })
    assert.deepEqual([a.statusCode, b.statusCode], [200, 200])
    assert.match(String(b.headers.ratelimit), /^"x";r=1;/, 'one counter for both routes (cost 2 each)')
    assert.equal((await app.inject('/c')).statusCode, 200)
    assert.match(String((await app.inject('/d')).headers.ratelimit), /^"z";r=3;/)
  })
})

describe('local fallback limiters are per process for one quota', () => {
  test('two apps sharing a key space share the local share while Redis is away; closing releases it', async (t) => {
    const client = new Redis(TEST_REDIS_URL, { enableOfflineQueue: false, lazyConnect: true })
    client.on('error', () => {})
    await connectRedis(client)
    const prefix = newPrefix()
    const policy: RateLimitPolicy = {
      name: 'local-shared',
      algorithm: 'fixed-window',
      limit: 4,
      windowMs: 60_000,
      onRedisError: 'local',
      localShare: 0.5,
    }
    const start = async () => {
      const pair = []
      for (let i = 0; i < 2; i++) {
        const app = Fastify()
        await app.register(rateLimit, { redis: client, keyPrefix: prefix })
        app.get('/x', { config: { rateLimits: policy } }, async () => 'ok')
        await app.ready()
        pair.push(app)
      }
      return pair
    }
    const alternate = async (pair: FastifyInstance[]) => {
      const statuses = []
      for (let i = 0; i < 4; i++) {
        const res = await pair[i % 2]!.inject('/x')
        statuses.push(res.statusCode)
        assert.equal(res.headers['ratelimit-policy'], '"local-shared";q=2;w=60', 'decided locally')
      }
      return statuses
    }
    t.after(() => client.disconnect())
    const first = await start()
    const ended = new Promise((resolve) => client.once('end', resolve))
    client.disconnect()
    await ended
    assert.deepEqual(await alternate(first), [200, 200, 429, 429], 'one local share of 2 for the process')
    for (const app of first) await app.close()
    // Nothing holds the old limiter any more: apps started afterwards begin with a fresh one.
    const second = await start()
    try {
      assert.deepEqual(await alternate(second), [200, 200, 429, 429])
    } finally {
      for (const app of second) await app.close()
    }
  })
})

describe('Redis replies that mean it cannot serve anyone still decide by onRedisError', () => {
  let server: RedisServerProcess
  let client: RedisClient

  before(async () => {
    server = await startRedisServer()
    client = createRedisClient({ url: server.url, commandTimeoutMs: 500 })
    await connectRedis(client)
  })

  after(async () => {
    client.disconnect()
    await server.stop()
  })

  test('a server turned replica (READONLY, as after a failover): open allows, closed answers 503', async (t) => {
    const app = Fastify()
    await app.register(rateLimit, { redis: client, keyPrefix: 'rl:', retryRedisAfterMs: 60_000 })
    const policy = (name: string, onRedisError: 'open' | 'closed') =>
      ({ name, algorithm: 'fixed-window', limit: 5, windowMs: 60_000, onRedisError }) as const
    app.get('/open', { config: { rateLimits: policy('ro-open', 'open') } }, async () => 'ok')
    app.get('/closed', { config: { rateLimits: policy('ro-closed', 'closed') } }, async () => 'ok')
    await app.ready()
    const admin = new Redis(server.url)
    t.after(async () => {
      await admin.call('REPLICAOF', 'NO', 'ONE')
      admin.disconnect()
      await app.close()
    })
    assert.match(String((await app.inject('/open')).headers.ratelimit), /;r=4;/)
    // A master nobody answers on: the server keeps serving reads and refuses writes.
    await admin.call('REPLICAOF', '127.0.0.1', '1')
    const open = await app.inject('/open')
    assert.equal(open.statusCode, 200)
    assert.equal(open.headers.ratelimit, undefined, 'degraded: nothing is claimed about the quota')
    const closed = await app.inject('/closed')
    assert.equal(closed.statusCode, 503)
    assert.equal(closed.json().type, '/problems/rate-limit-unavailable')
  })
})
