import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type FastifyRequest, type InjectOptions } from 'fastify'
import { memoryStoreOf } from '../../../src/plugins/rate-limit/engine.ts'
import rateLimit, {
  type Algorithm,
  clientAddress,
  type Decision,
  keyBy,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
  type RateLimitResult,
  type RouteRateLimit,
} from '../../../src/plugins/rate-limit/index.ts'
import { identityTag } from '../../../src/plugins/rate-limit/keys.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { keysWithoutTtl, listen, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { answerStatus, loggedApp } from './fixtures.ts'

// Per-request limits and windows, duration strings, blocks, programmatic use, custom 429s, IPv6
// grouping and 404s: each against both stores where it concerns the store.

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

type Store = 'redis' | 'memory'

interface Built {
  app: FastifyInstance
  prefix: string
  logs: Array<Record<string, unknown>>
}

async function build(
  store: Store,
  routes: Record<string, RouteRateLimit>,
  options: RateLimitPluginOptions = {},
  setup: (app: FastifyInstance) => void = () => {},
): Promise<Built> {
  const { app, logs } = loggedApp()
  const prefix = options.keyPrefix ?? uniquePrefix('rlf')
  prefixes.push(prefix)
  await app.register(rateLimit, {
    ...(store === 'redis' ? { redis } : { store: 'memory' }),
    keyPrefix: prefix,
    ...options,
  })
  for (const [path, rateLimits] of Object.entries(routes)) {
    app.get(path, { config: { rateLimits } }, answerStatus)
  }
  setup(app)
  await app.ready()
  apps.push(app)
  return { app, prefix, logs }
}

/** Whether a key exists in the store, and its TTL (ms; -2 when missing). */
async function ttlOf(store: Store, key: string): Promise<number> {
  if (store === 'redis') return redis.pttl(key)
  const prefix = prefixes.find((p) => key.startsWith(p))!
  const entry = memoryStoreOf(prefix)?.inspect(key)
  return entry ? entry.exp - Date.now() : -2
}

const keyFor = (prefix: string, identity: string, name: string, algorithm: Algorithm) =>
  `${prefix}{${identityTag(identity)}}:${name}:${algorithm}`
const statuses = async (app: FastifyInstance, n: number, request: InjectOptions | string) => {
  const out = []
  for (let i = 0; i < n; i++) out.push((await app.inject(request as never)).statusCode)
  return out
}

for (const store of ['redis', 'memory'] as const) {
  describe(`store: ${store}`, () => {
    describe('per-request limits and windows', () => {
      const plans: Record<string, number> = { free: 2, pro: 5 }
      const planLimit = (request: FastifyRequest) => plans[String(request.headers['x-plan'])] ?? 1
      const byUser = keyBy.header('x-user')

      test('limit as a function of the request: each request advertises and gets its own limit', async () => {
        const { app } = await build(store, {
          '/x': { name: 'plan', algorithm: 'fixed-window', limit: planLimit, windowMs: 60_000, key: byUser },
        })
        const as = (user: string, plan: string) => ({
          url: '/x',
          headers: { 'x-user': user, 'x-plan': plan },
        })
        assert.deepEqual(await statuses(app, 3, as('ann', 'free')), [200, 200, 429])
        assert.deepEqual(await statuses(app, 6, as('bob', 'pro')), [200, 200, 200, 200, 200, 429])
        const pro = await app.inject(as('cid', 'pro'))
        assert.equal(pro.headers['ratelimit-policy'], '"plan";q=5;w=60')
        assert.match(String(pro.headers.ratelimit), /^"plan";r=4;t=\d+$/)
        const free = await app.inject(as('ann', 'free'))
        assert.equal(free.headers['ratelimit-policy'], '"plan";q=2;w=60')
        assert.match(free.json().detail, /\(2 per 60 s\)/)
        // Ann upgrades: what she used still counts, against the new limit.
        const upgraded = await app.inject(as('ann', 'pro'))
        assert.equal(upgraded.statusCode, 200)
        assert.match(String(upgraded.headers.ratelimit), /^"plan";r=2;t=\d+$/)
      })

      test('two long keys that share their first 512 characters have counters of their own', async () => {
        const { app, prefix } = await build(store, {
          '/x': { name: 'long', algorithm: 'fixed-window', limit: 1, windowMs: 60_000, key: byUser },
        })
        const common = 'u'.repeat(600)
        const as = (user: string) => ({ url: '/x', headers: { 'x-user': user } })
        assert.deepEqual(await statuses(app, 2, as(`${common}-ann`)), [200, 429])
        assert.deepEqual(await statuses(app, 2, as(`${common}-bob`)), [200, 429])
        for (const user of [`${common}-ann`, `${common}-bob`]) {
          assert.ok((await ttlOf(store, keyFor(prefix, `x-user:${user}`, 'long', 'fixed-window'))) > 0, user)
        }
        assert.notEqual(identityTag(`x-user:${common}-ann`), identityTag(`x-user:${common}-bob`))
      })

      test('windowMs as a function: the header says the window applied; each window length has its own counter', async () => {
        const window = (request: FastifyRequest) => (request.headers['x-plan'] === 'pro' ? 3_600_000 : 60_000)
        const { app, prefix } = await build(store, {
          '/x': { name: 'plan-window', algorithm: 'sliding-log', limit: 2, windowMs: window, key: byUser },
        })
        const as = (plan: string) => ({ url: '/x', headers: { 'x-user': 'dee', 'x-plan': plan } })
        const minute = await app.inject(as('free'))
        assert.equal(minute.headers['ratelimit-policy'], '"plan-window";q=2;w=60')
        const hour = await app.inject(as('pro'))
        assert.equal(hour.headers['ratelimit-policy'], '"plan-window";q=2;w=3600')
        assert.deepEqual(await statuses(app, 2, as('free')), [200, 429])
        assert.deepEqual(await statuses(app, 2, as('pro')), [200, 429])
        const key = keyFor(prefix, 'x-user:dee', 'plan-window', 'sliding-log')
        assert.ok((await ttlOf(store, `${key}:60000`)) > 0)
        assert.ok((await ttlOf(store, `${key}:3600000`)) > 60_000)
      })

      test('a token bucket capacity from the request', async () => {
        const { app } = await build(store, {
          '/x': {
            name: 'plan-bucket',
            algorithm: 'token-bucket',
            limit: planLimit,
            refillPerSecond: 0.01,
            key: byUser,
          },
        })
        const res = await app.inject({ url: '/x', headers: { 'x-user': 'eve', 'x-plan': 'pro' } })
        assert.equal(res.headers['ratelimit-policy'], '"plan-bucket";q=5;w=500')
        assert.deepEqual(
          await statuses(app, 5, { url: '/x', headers: { 'x-user': 'eve', 'x-plan': 'pro' } }),
          [200, 200, 200, 200, 429],
        )
      })

      test('a bad limit or window from the function is that request’s 500 naming the policy; nothing consumed', async () => {
        const odd: Record<string, unknown> = { zero: 0, half: 2.5, text: '5', none: undefined }
        const { app, logs } = await build(store, {
          '/limit': {
            name: 'bad-limit',
            algorithm: 'gcra',
            limit: (request) => odd[String(request.headers['x-odd'])] as number,
            windowMs: 60_000,
          },
          '/window': {
            name: 'bad-window',
            algorithm: 'fixed-window',
            limit: 2,
            windowMs: (request) => odd[String(request.headers['x-odd'])] as number,
          },
          '/throws': {
            name: 'throwing-limit',
            algorithm: 'fixed-window',
            limit: () => {
              throw new Error('no plan')
            },
            windowMs: 60_000,
          },
          '/gcra': { name: 'fine-gcra', algorithm: 'gcra', limit: () => 1_000_000, windowMs: () => 1000 },
        })
        for (const path of ['/limit', '/window']) {
          for (const value of Object.keys(odd)) {
            const res = await app.inject({ url: path, headers: { 'x-odd': value } })
            assert.equal(res.statusCode, 500, `${path} ${value}`)
            assert.equal(res.json().type, '/problems/rate-limit-error')
            assert.equal(res.json().policy, path === '/limit' ? 'bad-limit' : 'bad-window')
          }
        }
        assert.equal((await app.inject('/throws')).json().policy, 'throwing-limit')
        assert.equal(
          (await app.inject('/gcra')).json().policy,
          'fine-gcra',
          'gcra: at most 100 per ms of window',
        )
        assert.ok(logs.some((l) => /limit function returned 2\.5/.test(String((l.err as Error)?.message))))
        assert.ok(
          logs.some((l) => /windowMs function returned a string/.test(String((l.err as Error)?.message))),
        )
      })

      test('a constant cost above a per-request limit can never pass: 429', async () => {
        const { app } = await build(store, {
          '/x': {
            name: 'cost-over',
            algorithm: 'sliding-counter',
            limit: planLimit,
            windowMs: 60_000,
            cost: 3,
          },
        })
        assert.equal((await app.inject({ url: '/x', headers: { 'x-plan': 'free' } })).statusCode, 429)
        assert.equal((await app.inject({ url: '/x', headers: { 'x-plan': 'pro' } })).statusCode, 200)
      })
    })

    describe('duration strings', () => {
      test("windowMs '1 minute', blockMs '2h', maxDelayMs '250ms': headers and behaviour as with milliseconds", async () => {
        const { app } = await build(store, {
          '/m': { name: 'minute', algorithm: 'fixed-window', limit: 1, windowMs: '1 minute', blockMs: '2h' },
          '/d': { name: 'delayed', algorithm: 'gcra', limit: 1, windowMs: '200ms', maxDelayMs: '250ms' },
        })
        const first = await app.inject('/m')
        assert.equal(first.headers['ratelimit-policy'], '"minute";q=1;w=60')
        const blocked = await app.inject('/m')
        assert.equal(blocked.statusCode, 429)
        assert.equal(blocked.headers['retry-after'], '7200')
        assert.deepEqual(await statuses(app, 2, '/d'), [200, 200], 'the second waited for its slot')
      })

      test('one policy written with a string and with milliseconds is one set of settings', async () => {
        const { app } = await build(store, {
          '/a': { name: 'same', algorithm: 'gcra', limit: 2, windowMs: '1 minute', blockMs: '10s' },
          '/b': { name: 'same', algorithm: 'gcra', limit: 2, windowMs: 60_000, blockMs: 10_000 },
        })
        assert.deepEqual(
          [
            (await app.inject('/a')).statusCode,
            (await app.inject('/b')).statusCode,
            (await app.inject('/a')).statusCode,
          ],
          [200, 200, 429],
        )
      })
    })

    describe('blocks (blockMs)', () => {
      test('over the limit once: rejected for blockMs even after the window, with Retry-After for the block', async () => {
        const { app, prefix } = await build(store, {
          '/x': { name: 'penalty', algorithm: 'sliding-log', limit: 2, windowMs: 150, blockMs: 30_000 },
        })
        assert.deepEqual(await statuses(app, 2, '/x'), [200, 200])
        const over = await app.inject('/x')
        assert.equal(over.statusCode, 429)
        assert.equal(over.headers['retry-after'], '30')
        assert.match(String(over.headers.ratelimit), /^"penalty";r=0;t=30$/)
        const block = `${keyFor(prefix, 'ip:127.0.0.1', 'penalty', 'sliding-log')}:block`
        const ttl = await ttlOf(store, block)
        assert.ok(ttl > 29_000 && ttl <= 30_000, `block TTL ${ttl}`)
        await new Promise((r) => setTimeout(r, 300))
        const later = await app.inject('/x')
        assert.equal(later.statusCode, 429, 'the window ended, the block did not')
        assert.ok(Number(later.headers['retry-after']) >= 29)
        assert.ok((await ttlOf(store, block)) <= ttl, 'retries while blocked do not extend the block')
      })

      test('a block ends: the key is admitted again', async () => {
        const { app } = await build(store, {
          '/x': { name: 'short-penalty', algorithm: 'fixed-window', limit: 1, windowMs: 100, blockMs: 1000 },
        })
        assert.deepEqual(await statuses(app, 2, '/x'), [200, 429])
        const blockedAt = Date.now()
        await new Promise((r) => setTimeout(r, 200))
        // Margins wide enough for a slow machine: the window (100 ms) is over, the block (1 s) is not.
        if (Date.now() - blockedAt < 800)
          assert.equal((await app.inject('/x')).statusCode, 429, 'still blocked after the window')
        while (Date.now() - blockedAt < 1100) await new Promise((r) => setTimeout(r, 50))
        assert.equal((await app.inject('/x')).statusCode, 200)
      })

      test('50 simultaneous requests against limit 5: exactly 5 pass, then every one is blocked', async () => {
        for (const algorithm of ['fixed-window', 'sliding-counter', 'token-bucket', 'gcra'] as const) {
          const name = `burst-${algorithm}`
          const window = algorithm === 'token-bucket' ? { refillPerSecond: 0.001 } : { windowMs: 60_000 }
          const { app, prefix } = await build(store, {
            '/x': { name, algorithm, limit: 5, ...window, blockMs: 60_000 },
          })
          const url = await listen(app)
          const rs = await Promise.all(Array.from({ length: 50 }, () => fetch(`${url}/x`)))
          assert.equal(rs.filter((r) => r.status === 200).length, 5, algorithm)
          assert.ok((await ttlOf(store, `${keyFor(prefix, 'ip:127.0.0.1', name, algorithm)}:block`)) > 59_000)
          await Promise.all(rs.map((r) => r.text()))
        }
      })

      test('a block rejects the siblings’ request too, and consumes none of their quota', async () => {
        const { app, prefix } = await build(store, {
          '/x': [
            { name: 'sib-blocking', algorithm: 'fixed-window', limit: 1, windowMs: 60_000, blockMs: 60_000 },
            { name: 'sib-wide', algorithm: 'fixed-window', limit: 100, windowMs: 60_000 },
          ],
        })
        assert.deepEqual(await statuses(app, 5, '/x'), [200, 429, 429, 429, 429])
        assert.equal((await app.inject('/x')).json().policy, 'sib-blocking')
        const wide = await app.rateLimiter.consume('sib-wide', 'ip:127.0.0.1', 0)
        assert.equal(wide.remaining, 99, 'only the first request counted')
        if (store === 'redis')
          assert.equal(await redis.get(keyFor(prefix, 'ip:127.0.0.1', 'sib-wide', 'fixed-window')), '1')
      })

      test('every instance honours a block (two apps on one key space)', async () => {
        const prefix = uniquePrefix('rlf')
        const policy: RateLimitPolicy = {
          name: 'shared-block',
          algorithm: 'gcra',
          limit: 1,
          windowMs: 100,
          blockMs: 60_000,
        }
        const a = await build(store, { '/x': policy }, { keyPrefix: prefix })
        const b = await build(store, { '/x': policy }, { keyPrefix: prefix })
        assert.deepEqual(await statuses(a.app, 2, '/x'), [200, 429])
        await new Promise((r) => setTimeout(r, 150))
        const other = await b.app.inject('/x')
        assert.equal(other.statusCode, 429)
        assert.ok(Number(other.headers['retry-after']) >= 59)
      })
    })

    describe('programmatic use: app.rateLimiter', () => {
      const login: RateLimitPolicy = {
        name: 'login',
        algorithm: 'sliding-log',
        limit: 3,
        windowMs: 60_000,
        key: keyBy.bodyField('username'),
        hook: 'preHandler',
        blockMs: 60_000,
      }

      test('consume answers { allowed, remaining, retryAfterMs, limit, resetMs, delayMs, degraded, banned, banReached }', async () => {
        const { app } = await build(store, {}, { namedPolicies: [login] })
        const results: RateLimitResult[] = []
        for (let i = 0; i < 4; i++) results.push(await app.rateLimiter.consume('login', 'username:ann'))
        assert.deepEqual(
          results.map(({ allowed, remaining, limit }) => ({ allowed, remaining, limit })),
          [
            { allowed: true, remaining: 2, limit: 3 },
            { allowed: true, remaining: 1, limit: 3 },
            { allowed: true, remaining: 0, limit: 3 },
            { allowed: false, remaining: 0, limit: 3 },
          ],
        )
        assert.deepEqual(Object.keys(results[0]!).sort(), [
          'allowed',
          'banReached',
          'banned',
          'degraded',
          'delayMs',
          'limit',
          'remaining',
          'resetMs',
          'retryAfterMs',
        ])
        assert.equal(results[0]!.retryAfterMs, 0)
        assert.equal(results[0]!.delayMs, 0)
        assert.equal(results[0]!.degraded, false)
        assert.equal(results[3]!.banned, false, 'no ban on this policy')
        assert.ok(results[0]!.resetMs > 59_000)
        assert.ok(results[3]!.retryAfterMs > 59_000, 'the block started')
        // Cost 0 only looks; a cost above the limit never passes and consumes nothing.
        const other = await app.rateLimiter.consume('login', 'username:bob', 0)
        assert.equal(other.remaining, 3)
        assert.equal((await app.rateLimiter.consume('login', 'username:bob', 4)).allowed, false)
        assert.equal((await app.rateLimiter.consume('login', 'username:bob', 3)).remaining, 0)
      })

      test('a route and consume share one quota (the same keys)', async () => {
        const { app, prefix } = await build(store, {
          '/x': { name: 'shared', algorithm: 'fixed-window', limit: 3, windowMs: 60_000 },
        })
        await app.inject('/x')
        const r = await app.rateLimiter.consume('shared', 'ip:127.0.0.1', 2)
        assert.deepEqual([r.allowed, r.remaining], [true, 0])
        assert.equal((await app.inject('/x')).statusCode, 429)
        assert.ok((await ttlOf(store, keyFor(prefix, 'ip:127.0.0.1', 'shared', 'fixed-window'))) > 0)
      })

      test('a login route resets the brute-force counter after a successful login', async () => {
        const { app } = await build(
          store,
          {},
          { namedPolicies: [{ ...login, blockMs: undefined, countOnlyFailures: false }] },
          (app) => {
            app.post('/login', { config: { rateLimits: 'login' } }, async (request, reply) => {
              const { username, password } = request.body as { username: string; password: string }
              if (password !== 'right') return reply.code(401).send({ ok: false })
              await app.rateLimiter.reset('login', `username:${username}`)
              return { ok: true }
            })
          },
        )
        const attempt = (password: string) =>
          app.inject({ method: 'POST', url: '/login', payload: { username: 'ann', password } })
        const seen = []
        for (const password of ['wrong', 'wrong', 'right', 'wrong', 'wrong', 'wrong', 'wrong'])
          seen.push((await attempt(password)).statusCode)
        // Two failures, a success (counted, then cleared): three more failures fit before the limit.
        assert.deepEqual(seen, [401, 401, 200, 401, 401, 401, 429])
      })

      test('reset clears a block; block() blocks a key on demand; both for every instance', async () => {
        const prefix = uniquePrefix('rlf')
        const a = await build(
          store,
          { '/x': { name: 'manual', algorithm: 'gcra', limit: 5, windowMs: 60_000, blockMs: 1000 } },
          { keyPrefix: prefix },
        )
        const b = await build(
          store,
          { '/x': { name: 'manual', algorithm: 'gcra', limit: 5, windowMs: 60_000, blockMs: 1000 } },
          { keyPrefix: prefix },
        )
        await a.app.rateLimiter.block('manual', 'ip:127.0.0.1', '10 minutes')
        const blocked = await b.app.inject('/x')
        assert.equal(blocked.statusCode, 429)
        assert.equal(blocked.headers['retry-after'], '600')
        const result = await b.app.rateLimiter.consume('manual', 'ip:127.0.0.1')
        assert.equal(result.allowed, false)
        assert.ok(result.retryAfterMs > 599_000)
        await b.app.rateLimiter.reset('manual', 'ip:127.0.0.1')
        assert.equal((await a.app.inject('/x')).statusCode, 200)
      })

      test('misuse is refused with a precise error', async () => {
        const { app } = await build(
          store,
          {},
          {
            namedPolicies: [
              login,
              { name: 'plain', algorithm: 'gcra', limit: 5, windowMs: 60_000 },
              {
                name: 'per-plan',
                algorithm: 'gcra',
                limit: (r) => (r.headers['x-plan'] ? 10 : 5),
                windowMs: 60_000,
              },
            ],
          },
        )
        const limiter = app.rateLimiter
        await assert.rejects(limiter.consume('nope', 'x'), {
          name: 'RateLimitUnknownPolicyError',
          code: 'FRG_RATE_LIMIT_UNKNOWN_POLICY',
          message: "rate-limit plugin: consume(): unknown policy 'nope' (policies: login, plain, per-plan)",
        })
        // Argument errors are TypeErrors with the code of every option error.
        const argument = (message: string) => ({
          name: 'RateLimitArgumentError',
          code: 'FRG_INVALID_OPTION',
          message,
        })
        await assert.rejects(
          limiter.consume('login', ''),
          argument(
            "rate-limit plugin: consume(): `key` must be a non-empty string (the identity a key function returns), got a string ('')",
          ),
        )
        await assert.rejects(
          limiter.consume('login', 'username:x', 1.5),
          argument('rate-limit plugin: consume(): `cost` must be a whole number of units (0 or more)'),
        )
        await assert.rejects(
          limiter.block('plain', 'ip:1', 1000),
          argument(
            "rate-limit plugin: block(): policy 'plain' has no `blockMs` (blocks are checked only for policies that set it)",
          ),
        )
        await assert.rejects(
          limiter.block('login', 'username:x', 'forever'),
          argument(
            "rate-limit plugin: block(): `ms`: 'forever' is not a duration (milliseconds, or a number and a unit: '500ms', '10s', '1 minute', '2h')",
          ),
        )
        await assert.rejects(
          limiter.consume('per-plan', 'ip:1'),
          argument(
            "rate-limit plugin: consume(): policy 'per-plan' has a per-request `limit` or `windowMs`: pass the request",
          ),
        )
        await assert.rejects(limiter.consume('login', ''), TypeError)
        const request = { headers: { 'x-plan': 'pro' } } as unknown as FastifyRequest
        assert.equal((await limiter.consume('per-plan', 'ip:1', 1, request)).limit, 10)
      })
    })

    describe('onExceeded and errorResponse', () => {
      test('onExceeded is told of every 429 with the violated decision; what it throws is logged, the 429 unchanged', async () => {
        const told: Array<[string, Decision]> = []
        const { app, logs } = await build(
          store,
          {
            '/x': { name: 'watched', algorithm: 'fixed-window', limit: 1, windowMs: 60_000 },
            '/throws': {
              name: 'throws',
              algorithm: 'fixed-window',
              limit: 1,
              windowMs: 60_000,
              onExceeded: () => {
                throw new Error('alerting down')
              },
            },
            '/rejects': {
              name: 'rejects',
              algorithm: 'fixed-window',
              limit: 1,
              windowMs: 60_000,
              onExceeded: async () => {
                throw new Error('alerting slow and down')
              },
            },
          },
          { onExceeded: (request, decision) => void told.push([request.url, decision]) },
        )
        assert.deepEqual(await statuses(app, 3, '/x'), [200, 429, 429])
        assert.equal(told.length, 2)
        assert.equal(told[0]![0], '/x')
        assert.equal(told[0]![1].policy.name, 'watched')
        assert.equal(told[0]![1].allowed, false)
        assert.equal(told[0]![1].limit, 1)
        assert.ok(told[0]![1].retryMs > 0)
        for (const path of ['/throws', '/rejects']) {
          await app.inject(path)
          const res = await app.inject(path)
          assert.equal(res.statusCode, 429)
          assert.equal(res.json().type, '/problems/rate-limited')
        }
        await new Promise((r) => setImmediate(r))
        assert.equal(told.length, 2, 'a policy’s own handler replaces the plugin’s')
        for (const message of ['alerting down', 'alerting slow and down'])
          assert.ok(
            logs.some(
              (l) =>
                l.msg === 'onExceeded threw' &&
                l.plugin === 'rate-limit' &&
                (l.err as Error).message === message,
            ),
          )
      })

      test('errorResponse builds the body; status 429, RateLimit and Retry-After stay', async () => {
        const { app, logs } = await build(
          store,
          {
            '/json': { name: 'json', algorithm: 'gcra', limit: 1, windowMs: 60_000 },
            '/text': {
              name: 'text',
              algorithm: 'gcra',
              limit: 1,
              windowMs: 60_000,
              errorResponse: async (_request, decision) => `slow down, ${decision.policy.name}`,
            },
            '/broken': {
              name: 'broken',
              algorithm: 'gcra',
              limit: 1,
              windowMs: 60_000,
              errorResponse: () => {
                throw new Error('no body')
              },
            },
          },
          {
            errorResponse: (request, decision) => ({
              code: 'TOO_MANY',
              path: request.url,
              limit: decision.limit,
              retryInMs: decision.retryMs,
            }),
          },
        )
        for (const path of ['/json', '/text', '/broken']) await app.inject(path)
        const json = await app.inject('/json')
        assert.equal(json.statusCode, 429)
        assert.equal(json.headers['content-type'], 'application/json; charset=utf-8')
        assert.equal(json.json().code, 'TOO_MANY')
        assert.equal(json.json().path, '/json')
        assert.equal(json.json().limit, 1)
        assert.ok(Number(json.headers['retry-after']) >= 59)
        assert.match(String(json.headers.ratelimit), /^"json";r=0;t=\d+$/)
        assert.equal(json.headers['ratelimit-policy'], '"json";q=1;w=60')
        const text = await app.inject('/text')
        assert.equal(text.statusCode, 429)
        assert.equal(text.headers['content-type'], 'text/plain; charset=utf-8')
        assert.equal(text.body, 'slow down, text')
        assert.ok(Number(text.headers['retry-after']) >= 59)
        const broken = await app.inject('/broken')
        assert.equal(broken.statusCode, 429)
        assert.equal(broken.json().type, '/problems/rate-limited', 'the default body when the builder throws')
        assert.ok(logs.some((l) => (l.err as Error)?.message === 'no body' && l.policy === 'broken'))
      })

      test('a policy name with another onExceeded or errorResponse is another set of settings: the boot fails', async () => {
        for (const option of ['onExceeded', 'errorResponse'] as const) {
          const app = Fastify()
          await app.register(rateLimit, { ...(store === 'redis' ? { redis } : { store: 'memory' }) })
          const base = { name: 'x', algorithm: 'gcra', limit: 5, windowMs: 60_000 } as const
          app.get('/a', { config: { rateLimits: { ...base, [option]: () => 'a' } } }, async () => 'ok')
          assert.throws(
            () =>
              app.get('/b', { config: { rateLimits: { ...base, [option]: () => 'b' } } }, async () => 'ok'),
            {
              code: 'FRG_RATE_LIMIT_POLICY_CONFLICT',
              message:
                "rate-limit plugin: route GET /b: config.rateLimits: policy 'x' is defined twice with different settings",
            },
          )
          await app.close()
        }
      })
    })
  })
}

describe('IPv6 clients are grouped by /64', () => {
  const policy: RateLimitPolicy = { name: 'ip6', algorithm: 'fixed-window', limit: 2, windowMs: 60_000 }
  const from = (app: FastifyInstance, remoteAddress: string) => app.inject({ url: '/x', remoteAddress })

  test('2001:db8::1 and 2001:db8::2 share a quota; 2001:db8:0:1::1 has its own', async () => {
    const { app } = await build('redis', { '/x': policy })
    assert.equal((await from(app, '2001:db8::1')).statusCode, 200)
    assert.equal((await from(app, '2001:db8::2')).statusCode, 200)
    assert.equal((await from(app, '2001:db8:0:0:ffff::9')).statusCode, 429, 'same /64')
    assert.equal((await from(app, '2001:db8:0:1::1')).statusCode, 200, 'another /64')
  })

  test('ipv6Subnet: 128 keeps every address apart; 48 groups wider', async () => {
    const { app: each } = await build('memory', { '/x': policy }, { ipv6Subnet: 128 })
    for (const address of ['2001:db8::1', '2001:db8::2', '2001:db8::3'])
      assert.deepEqual(await statuses(each, 2, { url: '/x', remoteAddress: address }), [200, 200])
    // Two spellings of one address are one client.
    assert.equal((await from(each, '2001:0db8:0000::0001')).statusCode, 429)
    const { app: wide } = await build('memory', { '/x': { ...policy, name: 'ip6-48' } }, { ipv6Subnet: 48 })
    assert.equal((await from(wide, '2001:db8:0:1::1')).statusCode, 200)
    assert.equal((await from(wide, '2001:db8:0:2::1')).statusCode, 200)
    assert.equal((await from(wide, '2001:db8:0:3::1')).statusCode, 429)
  })

  test('IPv4 and IPv4-mapped IPv6 stay per address, one client for both spellings', async () => {
    const { app } = await build('redis', { '/x': policy })
    assert.equal((await from(app, '192.0.2.1')).statusCode, 200)
    assert.equal((await from(app, '::ffff:192.0.2.1')).statusCode, 200)
    assert.equal((await from(app, '::ffff:c000:201')).statusCode, 429)
    assert.equal((await from(app, '192.0.2.2')).statusCode, 200)
  })

  test('the allow list matches the exact address, not its /64', async () => {
    const { app } = await build('memory', { '/x': policy }, { allowList: ['2001:db8::1'] })
    assert.deepEqual(await statuses(app, 3, { url: '/x', remoteAddress: '2001:db8::1' }), [200, 200, 200])
    assert.deepEqual(await statuses(app, 3, { url: '/x', remoteAddress: '2001:db8::2' }), [200, 200, 429])
  })

  test('clientAddress: every spelling of an address, masks at any length, garbage unchanged', () => {
    const cases: Array<[string, number, string]> = [
      ['2001:db8::1', 64, '2001:db8:0:0::/64'],
      ['2001:DB8:0:0:1:2:3:4', 64, '2001:db8:0:0::/64'],
      ['2001:db8:abcd:12ff::1', 56, '2001:db8:abcd:1200::/56'],
      ['2001:db8:abcd:12ff::1', 48, '2001:db8:abcd::/48'],
      ['2001:db8::1', 128, '2001:db8:0:0:0:0:0:1'],
      ['fe80::1%eth0', 64, 'fe80:0:0:0::/64'],
      ['::', 64, '0:0:0:0::/64'],
      ['::ffff:10.1.2.3', 64, '10.1.2.3'],
      ['64:ff9b::192.0.2.1', 96, '64:ff9b:0:0:0:0::/96'],
      ['10.1.2.3', 64, '10.1.2.3'],
      ['not:an:address', 64, 'not:an:address'],
      ['1:2:3:4:5:6:7:8:9', 64, '1:2:3:4:5:6:7:8:9'],
      ['1::2::3', 64, '1::2::3'],
      ['::ffff:300.1.2.3', 64, '::ffff:300.1.2.3'],
    ]
    for (const [ip, subnet, expected] of cases)
      assert.equal(clientAddress(ip, subnet), expected, `${ip}/${subnet}`)
  })
})

describe('404s are limited by the global policies', () => {
  for (const store of ['redis', 'memory'] as const) {
    test(`${store}: a not-found handler set before the plugin; GET /no-such-route answers 429 with RateLimit headers`, async () => {
      const app = Fastify()
      app.setNotFoundHandler((request, reply) => reply.code(404).send({ missing: request.url }))
      app.get('/before', async () => 'registered before the plugin')
      await app.register(rateLimit, {
        ...(store === 'redis' ? { redis } : { store: 'memory' }),
        keyPrefix: uniquePrefix('rlf'),
        policies: [{ name: 'global', algorithm: 'fixed-window', limit: 3, windowMs: 60_000 }],
      })
      app.get('/x', async () => 'ok')
      app.get('/free', { config: { rateLimits: false } }, async () => 'ok')
      await app.ready()
      apps.push(app)
      const first = await app.inject('/no-such-route')
      assert.equal(first.statusCode, 404)
      assert.deepEqual(first.json(), { missing: '/no-such-route' })
      assert.equal(first.headers['ratelimit-policy'], '"global";q=3;w=60')
      assert.match(String(first.headers.ratelimit), /^"global";r=2;t=\d+$/)
      assert.equal((await app.inject('/x')).statusCode, 200, 'one quota with the routes')
      assert.equal((await app.inject({ method: 'POST', url: '/nowhere' })).statusCode, 404)
      const limited = await app.inject('/no-such-route')
      assert.equal(limited.statusCode, 429)
      assert.equal(limited.json().policy, 'global')
      assert.match(String(limited.headers.ratelimit), /^"global";r=0;t=\d+$/)
      assert.equal(limited.headers['ratelimit-policy'], '"global";q=3;w=60')
      assert.ok(Number(limited.headers['retry-after']) >= 1)
      // Routes outside the global policies stay outside.
      for (const path of ['/before', '/free']) {
        const res = await app.inject(path)
        assert.equal(res.statusCode, 200, path)
        assert.equal(res.headers['ratelimit-policy'], undefined, path)
      }
    })
  }

  test('the default not-found handler too, and global preHandler policies', async () => {
    const { app } = await build(
      'memory',
      {},
      {
        policies: [
          { name: 'early', algorithm: 'gcra', limit: 10, windowMs: 60_000 },
          {
            name: 'late',
            algorithm: 'gcra',
            limit: 2,
            windowMs: 60_000,
            hook: 'preHandler',
            key: keyBy.header('x-user'),
          },
        ],
      },
    )
    const as = { url: '/missing', headers: { 'x-user': 'fay' } }
    const res = await app.inject(as)
    assert.equal(res.statusCode, 404)
    assert.match(String(res.headers['ratelimit-policy']), /^"early";q=10;w=60, "late";q=2;w=60$/)
    assert.deepEqual(await statuses(app, 2, as), [404, 429])
    assert.equal((await app.inject(as)).json().policy, 'late')
  })
})
