import assert from 'node:assert/strict'
import { Writable } from 'node:stream'
import { after, before, test } from 'node:test'
import fastifyCookie from '@fastify/cookie'
import fastifySession from '@fastify/session'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { type RedisServerProcess, startRedisServer } from '../src/embedded/redis-server.ts'
import { cache, idempotency, keyBy, metrics, rateLimit, session } from '../src/index.ts'
import { scriptSources } from '../src/redis/scripts.ts'
import { TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from './helpers/index.ts'
import { scrape } from './helpers/metrics-scrape.ts'

// Each plugin on a plain `new Redis()` the test created, as a user of the package registers it.

/**
 * @fastify/session's `request.session`, seen through a cast: this program also loads this suite's
 * session plugin, whose declaration of the same property wins; a user's app has only one of them.
 */
interface PeerSession {
  get(key: string): string | undefined
  set(key: string, value: string): void
}
const peerSession = (request: FastifyRequest) => (request as unknown as { session: PeerSession }).session

let server: RedisServerProcess
before(async () => {
  // A private server: SCRIPT FLUSH here must not touch what other suites run on the shared one.
  server = await startRedisServer()
})
after(async () => server?.stop())

test('SCRIPT FLUSH mid-run: every plugin keeps answering, and the scripts come back', async (t) => {
  const redis = new Redis(server.url)
  const app = Fastify()
  await app.register(session, { redis, secrets: [TEST_SECRET] })
  await app.register(rateLimit, {
    redis,
    // A plain client has no command timeout: the plugin's own 500 ms would let a loaded machine degrade a decision.
    timeoutMs: 10_000,
    policies: [{ name: 'ip', algorithm: 'sliding-log', limit: 1000, windowMs: 60_000 }],
  })
  await app.register(idempotency, { redis })
  await app.register(cache, { redis })
  let loads = 0
  app.post('/login', async (_request, reply) => {
    await reply.regenerateSession('alice')
    return { ok: true }
  })
  app.post('/pay', { config: { idempotency: true, session: 'required' } }, async (request) => ({
    paid: request.body,
    balance: await app.cache.getOrLoad('balance:alice', async () => ++loads),
  }))
  t.after(async () => {
    await app.close()
    await redis.quit()
  })
  const login = await app.inject({ method: 'POST', url: '/login' })
  const cookies = { sid: login.cookies.find((c) => c.name === 'sid')!.value }
  const pay = (key: string) =>
    app.inject({
      method: 'POST',
      url: '/pay',
      cookies,
      headers: { 'idempotency-key': key },
      payload: { n: 1 },
    })
  const used = ['rateLimitSlidingLog', 'idempotencyClaim', 'cacheGet'].map(
    (name) => scriptSources.get(name)!.sha,
  )
  const first = await pay('k1')
  assert.equal(first.statusCode, 200)
  assert.ok(first.headers.ratelimit, 'decided by Redis')
  assert.equal(await redis.script('FLUSH'), 'OK')
  assert.deepEqual(await redis.call('SCRIPT', 'EXISTS', ...used), [0, 0, 0])
  const [again, next] = [await pay('k1'), await pay('k2')]
  assert.equal(again.statusCode, 200)
  assert.equal(again.headers['idempotent-replayed'], 'true')
  assert.equal(next.statusCode, 200)
  assert.match(String(next.headers.ratelimit), /^"ip";r=996;/, 'the limiter still counts in Redis')
  assert.deepEqual(next.json(), { paid: { n: 1 }, balance: 1 })
  assert.equal(loads, 1, 'the cached balance survived the flush')
  assert.deepEqual(await redis.call('SCRIPT', 'EXISTS', ...used), [1, 1, 1], 'loaded again on use')
})

test('with @fastify/session, rate limit and idempotency tell callers apart through `principal`', async (t) => {
  const redis = new Redis(TEST_REDIS_URL)
  const app = Fastify()
  await app.register(fastifyCookie)
  await app.register(fastifySession, { secret: TEST_SECRET, cookie: { secure: false } })
  const principal = (request: FastifyRequest) => peerSession(request).get('user') ?? null
  await app.register(rateLimit, {
    redis,
    // A plain client has no command timeout: the plugin's own 500 ms would let a loaded machine degrade a decision.
    timeoutMs: 10_000,
    principal,
    keyPrefix: uniquePrefix('rl'),
    namedPolicies: [
      {
        name: 'per-user',
        algorithm: 'fixed-window',
        limit: 2,
        windowMs: 60_000,
        key: keyBy.customer,
        hook: 'preHandler',
      },
    ],
  })
  await app.register(idempotency, { redis, principal, keyPrefix: uniquePrefix('idem') })
  let runs = 0
  app.post('/login/:user', async (request) => {
    peerSession(request).set('user', (request.params as { user: string }).user)
    return { ok: true }
  })
  app.post('/orders', { config: { rateLimits: 'per-user', idempotency: true } }, async (request) => ({
    run: ++runs,
    user: peerSession(request).get('user'),
  }))
  t.after(async () => {
    await app.close()
    await redis.quit()
  })
  const cookieOf = async (user: string) => {
    const res = await app.inject({ method: 'POST', url: `/login/${user}` })
    return { sessionId: res.cookies.find((c) => c.name === 'sessionId')!.value }
  }
  const [alice, bob] = [await cookieOf('alice'), await cookieOf('bob')]
  const order = (cookies: Record<string, string>, key: string) =>
    app.inject({
      method: 'POST',
      url: '/orders',
      cookies,
      headers: { 'idempotency-key': key },
      payload: {},
    })
  // The same key from two users: two orders, neither replays the other's.
  const [a1, b1] = [await order(alice, 'same-key'), await order(bob, 'same-key')]
  assert.deepEqual([a1.statusCode, b1.statusCode], [200, 200])
  assert.deepEqual([a1.json().user, b1.json().user], ['alice', 'bob'])
  assert.equal(b1.headers['idempotent-replayed'], undefined)
  // Alice's quota is hers: her third order is refused while bob still has his second.
  assert.equal((await order(alice, 'a2')).statusCode, 200)
  const refused = await order(alice, 'a3')
  assert.equal(refused.statusCode, 429)
  assert.equal(refused.json().policy, 'per-user')
  assert.equal((await order(bob, 'b2')).statusCode, 200)
  assert.equal(runs, 4)
})

test('the metrics plugin registered last still exports every plugin series and Redis client', async (t) => {
  const redis = new Redis(TEST_REDIS_URL)
  const app = Fastify()
  await app.register(rateLimit, {
    redis,
    // A plain client has no command timeout: the plugin's own 500 ms would let a loaded machine degrade a decision.
    timeoutMs: 10_000,
    keyPrefix: uniquePrefix('rl'),
    policies: [{ name: 'ip', algorithm: 'gcra', limit: 100, windowMs: 1000 }],
  })
  await app.register(idempotency, { redis, keyPrefix: uniquePrefix('idem') })
  await app.register(cache, { redis, keyPrefix: uniquePrefix('cache') })
  await app.register(metrics, { processMetrics: false })
  app.post('/things', { config: { idempotency: true } }, async () =>
    app.cache.getOrLoad('thing:1', async () => 1),
  )
  t.after(async () => {
    await app.close()
    await redis.quit()
  })
  const send = () =>
    app.inject({ method: 'POST', url: '/things', headers: { 'idempotency-key': 'k' }, payload: {} })
  assert.equal((await send()).statusCode, 200)
  assert.equal((await send()).headers['idempotent-replayed'], 'true')
  const m = await scrape(app)
  // Two: the scrape itself is never behind a global policy.
  assert.equal(m.value('rate_limit_decisions_total', { policy: 'ip', outcome: 'allowed' }), 2)
  assert.equal(m.value('idempotency_requests_total', { outcome: 'new' }), 1)
  assert.equal(m.value('idempotency_requests_total', { outcome: 'replayed' }), 1)
  assert.equal(m.value('cache_misses_total', { name: 'thing' }), 1)
  // On a Redis that never ran a script, its first EVALSHA answers NOSCRIPT and an EVAL follows: both
  // are timed, and the first counted as a reload. Each under the plugin that sent it, on one client.
  const scriptCalls = (client: string, command: string) =>
    m.value('redis_command_duration_seconds_count', { client, command }) -
    m.value('redis_script_reloads_total', { client, command })
  assert.equal(scriptCalls('rate-limit', 'script:rateLimitGcra'), 2)
  assert.equal(scriptCalls('cache', 'script:cacheFill'), 1)
  assert.equal(m.value('redis_command_errors_total'), 0)
})

test('a rate limiter whose Redis is away lets requests through as its policy says, and says so', async (t) => {
  const lines: string[] = []
  const logs = new Writable({
    write(chunk, _encoding, callback) {
      lines.push(String(chunk))
      callback()
    },
  })
  // A lazy client on a port nothing listens on, never connected: what a misconfigured app hands over.
  const redis = new Redis({
    port: 1,
    lazyConnect: true,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  })
  redis.on('error', () => {})
  const app: FastifyInstance = Fastify({ logger: { level: 'warn', stream: logs } })
  await app.register(metrics, { processMetrics: false })
  await app.register(rateLimit, {
    redis,
    policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 1, windowMs: 60_000, onRedisError: 'open' }],
  })
  app.get('/', async () => 'ok')
  t.after(() => app.close())
  const statuses = []
  for (let i = 0; i < 3; i++) {
    const res = await app.inject('/')
    statuses.push(res.statusCode)
    assert.equal(res.headers['ratelimit-policy'], '"ip";q=1;w=60', 'the policy is advertised')
    assert.equal(res.headers.ratelimit, undefined, 'no remaining quota is invented')
  }
  assert.deepEqual(statuses, [200, 200, 200])
  const m = await scrape(app)
  assert.equal(m.value('rate_limit_redis_unavailable_total'), 3)
  assert.equal(m.value('rate_limit_decisions_total', { policy: 'ip', outcome: 'degraded_open' }), 3)
  const warnings = lines.filter((l) => l.includes('Redis unavailable, policies decide by their onRedisError'))
  assert.equal(warnings.length, 1, 'one warning, not one per request')
  assert.ok(
    lines.some((l) => /rate-limit plugin: Redis at localhost:1 is not ready at boot/.test(l)),
    'the boot warning names the address',
  )
})
