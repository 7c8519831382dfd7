import assert from 'node:assert/strict'
import { type AddressInfo, createServer, type Socket } from 'node:net'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { parseTimeWindow } from '../../src/compat/fastify-rate-limit/params.ts'
import rateLimit, {
  type CreateRateLimitResult,
  normalizeIP,
  type RateLimitDecorators,
} from '../../src/compat/fastify-rate-limit.ts'
import { InvalidOptionError } from '../../src/plugins/common/errors.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../src/redis/client.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../helpers/index.ts'
import { loggedApp } from '../plugins/rate-limit/fixtures.ts'

// The @fastify/rate-limit 11 compat layer: its options on our engine. The upstream suite itself runs
// in scripts/fastify-rate-limit-oracle.sh; these pin what an app migrating relies on first.

const decorators = (app: FastifyInstance) => app as unknown as FastifyInstance & RateLimitDecorators

let redis: RedisClient
before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(() => redis.disconnect())

async function statuses(app: FastifyInstance, url: string, n: number, headers = {}): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push((await app.inject({ url, headers })).statusCode)
  return out
}

test('a global max and timeWindow limit every route, counted in Redis under nameSpace, with x-ratelimit headers', async (t) => {
  const nameSpace = uniquePrefix('frl')
  const app = Fastify()
  t.after(async () => {
    await app.close()
    // One key per DEL: on a Cluster the keys sit in different slots.
    for (const key of await scanKeys(redis, nameSpace)) await redis.del(key)
  })
  await app.register(rateLimit, { max: 2, timeWindow: '1 minute', redis, nameSpace })
  app.get('/a', async () => 'a')
  app.get('/b', async () => 'b')
  const first = await app.inject('/a')
  assert.equal(first.statusCode, 200)
  assert.equal(first.headers['x-ratelimit-limit'], '2')
  assert.equal(first.headers['x-ratelimit-remaining'], '1')
  assert.equal(first.headers['x-ratelimit-reset'], '60')
  // The global limit is one counter for every route, as upstream.
  assert.equal((await app.inject('/b')).headers['x-ratelimit-remaining'], '0')
  const over = await app.inject('/a')
  assert.equal(over.statusCode, 429)
  assert.equal(over.headers['x-ratelimit-remaining'], '0')
  assert.equal(over.headers['retry-after'], '60')
  assert.deepEqual(over.json(), {
    statusCode: 429,
    error: 'Too Many Requests',
    message: 'Rate limit exceeded, retry in 1 minute',
  })
  assert.ok((await scanKeys(redis, nameSpace)).length > 0, 'the counter lives in Redis')
})

test('per-route config.rateLimit overrides the global settings, and false turns it off', async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(rateLimit, { max: 1, timeWindow: 60_000 })
  app.get('/default', async () => 'ok')
  app.get('/roomy', { config: { rateLimit: { max: 3, timeWindow: 60_000 } } }, async () => 'ok')
  app.get('/free', { config: { rateLimit: false } }, async () => 'ok')
  app.get('/closed', { config: { rateLimit: { max: 0 } } }, async () => 'ok')
  assert.deepEqual(await statuses(app, '/default', 2), [200, 429])
  assert.deepEqual(await statuses(app, '/roomy', 4), [200, 200, 200, 429])
  assert.deepEqual(await statuses(app, '/closed', 2), [429, 429], 'max 0 rejects every request, as upstream')
  const free = await app.inject('/free')
  assert.equal(free.statusCode, 200)
  assert.equal(free.headers['x-ratelimit-limit'], undefined)
})

test('allowList skips listed keys; keyGenerator picks whose quota a request uses', async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(rateLimit, {
    max: 1,
    timeWindow: 60_000,
    allowList: ['trusted'],
    keyGenerator: (request) => String(request.headers['x-api-key'] ?? request.ip),
  })
  app.get('/', async () => 'ok')
  assert.deepEqual(await statuses(app, '/', 3, { 'x-api-key': 'trusted' }), [200, 200, 200])
  assert.deepEqual(await statuses(app, '/', 2, { 'x-api-key': 'alice' }), [200, 429])
  assert.deepEqual(await statuses(app, '/', 1, { 'x-api-key': 'bob' }), [200])
})

test("errorResponseBuilder's error goes through the app's error handler", async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  app.setErrorHandler((err: Error & { statusCode?: number; code?: string }, _request, reply) => {
    reply.code(err.statusCode ?? 500).send({ handled: true, code: err.code, message: err.message })
  })
  await app.register(rateLimit, {
    max: 1,
    timeWindow: 60_000,
    errorResponseBuilder: (_request, context) =>
      Object.assign(new Error(`slow down, ${context.max} per ${context.after}`), {
        statusCode: context.statusCode,
        code: 'RATE',
      }),
  })
  app.get('/', async () => 'ok')
  await app.inject('/')
  const res = await app.inject('/')
  assert.equal(res.statusCode, 429)
  assert.deepEqual(res.json(), { handled: true, code: 'RATE', message: 'slow down, 1 per 1 minute' })
  assert.equal(res.headers['retry-after'], '60')
})

test('enableDraftSpec sends ratelimit-* headers instead of x-ratelimit-*', async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(rateLimit, { max: 1, timeWindow: 2000, enableDraftSpec: true })
  app.get('/', async () => 'ok')
  const ok = await app.inject('/')
  assert.equal(ok.headers['ratelimit-limit'], '1')
  assert.equal(ok.headers['ratelimit-remaining'], '0')
  assert.equal(ok.headers['ratelimit-reset'], '2')
  assert.equal(ok.headers['x-ratelimit-limit'], undefined)
  const over = await app.inject('/')
  assert.equal(over.statusCode, 429)
  assert.equal(over.headers['retry-after'], '2')
})

test('createRateLimit checks (and with increment: false only reads) a quota; rateLimit() is a hook', async (t) => {
  const app = decorators(Fastify())
  t.after(() => app.close())
  await app.register(rateLimit, { global: false, max: 2, timeWindow: 60_000 })
  const check = app.createRateLimit()
  app.get('/check', async (request) => {
    const peek = await check(request, { increment: false })
    const counted = await check(request)
    return { peek, counted }
  })
  app.get('/hooked', { onRequest: app.rateLimit({ max: 1, timeWindow: 60_000 }) }, async () => 'ok')
  const first = (await app.inject('/check')).json() as {
    peek: CreateRateLimitResult
    counted: CreateRateLimitResult
  }
  assert.equal(first.peek.isAllowed, false)
  assert.equal(first.peek.isAllowed === false && first.peek.remaining, 2)
  assert.equal(first.counted.isAllowed === false && first.counted.remaining, 1)
  assert.equal(first.counted.isAllowed === false && first.counted.isExceeded, false)
  assert.deepEqual(await statuses(app, '/hooked', 2), [200, 429])
})

test('registering twice in one context does not throw; each registration counts on its own', async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(rateLimit, { max: 5, timeWindow: 60_000 })
  await app.register(rateLimit, { max: 5, timeWindow: 60_000 })
  app.get('/', async () => 'ok')
  await app.ready()
  const res = await app.inject('/')
  assert.equal(res.statusCode, 200)
})

test('normalizeIP as upstream: IPv4 as is, mapped IPv6 as IPv4, IPv6 by its /64', () => {
  assert.equal(normalizeIP('::ffff:192.0.2.1'), '192.0.2.1')
  assert.equal(normalizeIP('2001:0DB8:ABCD:0012:0000:0000:0000:0001'), '2001:db8:abcd:12::')
  assert.equal(normalizeIP('2001:db8:abcd:12::1', 48), '2001:db8:abcd::')
  assert.equal(normalizeIP('2001:db8:abcd:12::1', 128), '2001:db8:abcd:12::1')
})

test('ban: 429 until `ban` rejections, then 403 with onBanReach; exponentialBackoff doubles the wait', async () => {
  const banned: string[] = []
  const app = Fastify()
  await app.register(rateLimit, {
    max: 1,
    timeWindow: 60_000,
    ban: 1,
    onBanReach: (_request, key) => {
      banned.push(key)
    },
  })
  app.get('/', async () => 'ok')
  const statuses = []
  for (let i = 0; i < 4; i++) statuses.push((await app.inject('/')).statusCode)
  assert.deepEqual(statuses, [200, 429, 403, 403])
  assert.deepEqual(banned, ['127.0.0.1', '127.0.0.1'], 'called on every banned request, as upstream')
  await app.close()

  const backoff = Fastify()
  await backoff.register(rateLimit, { max: 1, timeWindow: 10_000, exponentialBackoff: true })
  backoff.get('/', async () => 'ok')
  assert.equal((await backoff.inject('/')).statusCode, 200)
  const waits = []
  for (let i = 0; i < 3; i++) {
    const res = await backoff.inject('/')
    assert.equal(res.statusCode, 429)
    waits.push(Number(res.headers['retry-after']))
  }
  assert.deepEqual(waits, [10, 20, 40])
  await backoff.close()
})

test('an unknown option fails the boot with a did-you-mean, globally and on a route (upstream ignores it)', async () => {
  const global = Fastify()
  await assert.rejects(
    async () => {
      await global.register(rateLimit, { max: 2, timeWindo: 1000 } as never)
      await global.ready()
    },
    { code: 'FRG_UNKNOWN_OPTION', message: /unknown option `timeWindo`\. Did you mean `timeWindow`\?/ },
  )
  await global.close()
  const route = Fastify()
  await route.register(rateLimit, { max: 2 })
  await assert.rejects(
    async () => {
      route.get('/', { config: { rateLimit: { mx: 1 } as never } }, async () => 'ok')
      await route.ready()
    },
    { code: 'FRG_UNKNOWN_OPTION', message: /`mx`\. Did you mean `max`\?/ },
  )
  await route.close()
})

test('timeWindow strings are read as upstream reads them (@lukeed/ms): weeks, bare milliseconds, decimals', () => {
  const cases: Array<[string, number | undefined]> = [
    ['1 week', 604_800_000],
    ['2w', 1_209_600_000],
    ['2 wks', 1_209_600_000],
    ['5000', 5000],
    ['1.5h', 5_400_000],
    ['.5s', 500],
    ['10 SECONDS', 10_000],
    ['1 minute', 60_000],
    ['250ms', 250],
    ['3 days', 259_200_000],
    ['1y', 31_557_600_000],
    ['0', undefined],
    ['1 fortnight', undefined],
    [' 1 minute', undefined],
    ['', undefined],
  ]
  for (const [text, ms] of cases) assert.equal(parseTimeWindow(text), ms, text)
  assert.equal(parseTimeWindow('-5s'), -5000)
})

test("a timeWindow of '1 week' or '5000' keeps its length, globally and on a route", async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(rateLimit, { max: 5, timeWindow: '1 week' })
  app.get('/weekly', async () => 'ok')
  app.get('/two-weeks', { config: { rateLimit: { max: 5, timeWindow: '2w' } } }, async () => 'ok')
  app.get('/five-seconds', { config: { rateLimit: { max: 5, timeWindow: '5000' } } }, async () => 'ok')
  app.get('/forever', { config: { rateLimit: { max: 5, timeWindow: '285421 years' } } }, async () => 'ok')
  assert.equal((await app.inject('/weekly')).headers['x-ratelimit-reset'], '604800')
  assert.equal((await app.inject('/two-weeks')).headers['x-ratelimit-reset'], '1209600')
  assert.equal((await app.inject('/five-seconds')).headers['x-ratelimit-reset'], '5')
  // Past 2^53 ms the window is 2^53 ms long (upstream's own test uses 285421 years).
  const forever = await app.inject('/forever')
  assert.equal(forever.statusCode, 200)
  assert.equal(forever.headers['x-ratelimit-reset'], String(Math.ceil(Number.MAX_SAFE_INTEGER / 1000)))
})

test('a timeWindow string upstream cannot read fails the boot naming it, globally and on a route', async () => {
  const global = Fastify()
  await assert.rejects(
    async () => {
      await global.register(rateLimit, { max: 2, timeWindow: '1 fortnight' })
      await global.ready()
    },
    (err: Error & { code?: string }) =>
      err instanceof InvalidOptionError &&
      err.code === 'FRG_INVALID_OPTION' &&
      /'1 fortnight'/.test(err.message),
  )
  await global.close()
  const route = Fastify()
  await route.register(rateLimit, { max: 2 })
  await assert.rejects(
    async () => {
      route.get('/', { config: { rateLimit: { timeWindow: '-5s' } } }, async () => 'ok')
      await route.ready()
    },
    { code: 'FRG_INVALID_OPTION', message: /`timeWindow`: '-5s'/ },
  )
  await route.close()
})

/** A client of a port nothing listens on: Redis is down from the start. */
async function downRedis(): Promise<RedisClient> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return createRedisClient({ url: `redis://127.0.0.1:${port}` })
}

test('Redis down, skipOnError false: 503 with Retry-After and FRG_RATE_LIMIT_UNAVAILABLE, through the error handler or not', async (t) => {
  const down = await downRedis()
  const { app, logs } = loggedApp()
  t.after(async () => {
    await app.close()
    down.disconnect()
  })
  await app.register(rateLimit, { max: 2, timeWindow: '1 minute', redis: down })
  app.get('/', async () => 'ok')
  app.get('/create', { config: { rateLimit: false } }, async (request) => {
    try {
      await decorators(app).createRateLimit()(request)
      return { rejected: false }
    } catch (err) {
      const { statusCode, code, headers } = err as { statusCode: number; code: string; headers: object }
      return { statusCode, code, headers }
    }
  })
  await app.register(async (own) => {
    own.setErrorHandler((err: Error & { statusCode?: number; code?: string }, _request, reply) =>
      reply.code(err.statusCode ?? 500).send({ mine: err.code }),
    )
    own.get('/own', async () => 'ok')
  })
  await app.ready()
  assert.ok(logs.some((l) => /Redis at 127\.0\.0\.1:\d+ is not ready at boot/.test(String(l.msg))))
  const res = await app.inject('/')
  assert.equal(res.statusCode, 503)
  assert.equal(res.headers['retry-after'], '1')
  assert.deepEqual(res.json(), {
    statusCode: 503,
    code: 'FRG_RATE_LIMIT_UNAVAILABLE',
    error: 'Service Unavailable',
    message: 'Rate limit cannot be checked now; retry shortly',
  })
  // An error handler of the app's own gets the code, and the reply already carries Retry-After.
  const own = await app.inject('/own')
  assert.equal(own.statusCode, 503)
  assert.equal(own.headers['retry-after'], '1')
  assert.deepEqual(own.json(), { mine: 'FRG_RATE_LIMIT_UNAVAILABLE' })
  // createRateLimit rejects with the same error, for the caller to answer.
  assert.deepEqual((await app.inject('/create')).json(), {
    statusCode: 503,
    code: 'FRG_RATE_LIMIT_UNAVAILABLE',
    headers: { 'retry-after': '1' },
  })
})

/** A server that accepts connections and never answers: a Redis that hangs. */
async function silentServer(): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>()
  const server = createServer((socket) => {
    sockets.add(socket)
    socket.on('error', () => {})
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    port,
    close: async () => {
      for (const socket of sockets) socket.destroy()
      await new Promise((resolve) => server.close(resolve))
    },
  }
}

test('connectTimeoutMs bounds the boot wait for a Redis that does not answer (default 1000 ms); a wrong value fails the boot', async (t) => {
  const hung = await silentServer()
  t.after(() => hung.close())
  for (const [connectTimeoutMs, waited] of [
    [undefined, 1000],
    [100, 100],
  ] as const) {
    const client = createRedisClient({ url: `redis://127.0.0.1:${hung.port}` })
    const { app, logs } = loggedApp()
    await app.register(rateLimit, {
      max: 2,
      redis: client,
      ...(connectTimeoutMs ? { connectTimeoutMs } : {}),
    })
    await app.ready()
    assert.ok(
      logs.some((l) => String(l.msg).includes(`not ready within ${waited} ms`)),
      JSON.stringify(logs.map((l) => l.msg)),
    )
    await app.close()
    client.disconnect()
  }
  const wrong = Fastify()
  await assert.rejects(
    async () => {
      await wrong.register(rateLimit, { max: 2, redis, connectTimeoutMs: -1 })
      await wrong.ready()
    },
    { code: 'FRG_INVALID_OPTION', message: /`connectTimeoutMs`.*got -1/ },
  )
  await wrong.close()
})
