// The mistakes a new user makes, each refused loudly (at boot or at the call) or kept safe: never a
// guarantee switched off in silence.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { createServer } from 'node:net'
import Fastify from 'fastify'
import {
  cache,
  InvalidOptionError,
  idempotency,
  RouteNotProtectedError,
  rateLimit,
  session,
  UnknownOptionError,
} from 'fastify-redis-gateway'
import { Redis } from 'ioredis'
import { newRedis, prefix } from './assert-helpers.mjs'

const redis = newRedis()

/** Registers `plugin` on a new app (with `before` run first) and returns what `ready()` rejects with. */
async function bootError(register) {
  const app = Fastify()
  try {
    await register(app)
    await app.ready()
  } catch (err) {
    return err
  } finally {
    await app.close().catch(() => {})
  }
  assert.fail('the app became ready')
}

// 1. A route asking for idempotency, declared before the plugin: the app refuses to be ready.
const wrongOrder = await bootError(async (app) => {
  app.post('/pay', { config: { idempotency: true } }, async () => ({ ok: true }))
  await app.register(idempotency, { redis, keyPrefix: prefix('idem') })
})
assert.ok(wrongOrder instanceof RouteNotProtectedError, String(wrongOrder))
assert.equal(wrongOrder.code, 'FRG_ROUTE_NOT_PROTECTED')
assert.match(wrongOrder.message, /POST \/pay/)

// 2. @fastify/rate-limit's option names: refused, naming ours.
const foreign = await bootError((app) => app.register(rateLimit, { redis, max: 3, timeWindow: '1 minute' }))
assert.ok(foreign instanceof UnknownOptionError, String(foreign))
assert.equal(foreign.code, 'FRG_UNKNOWN_OPTION')
assert.match(foreign.message, /`max`/)
assert.match(foreign.message, /`limit`/)

// 3. A misspelt policy key.
const misspelt = await bootError((app) =>
  app.register(rateLimit, { redis, policies: [{ name: 'ip', algoritm: 'gcra', limit: 3, windowMs: 1000 }] }),
)
assert.ok(misspelt instanceof InvalidOptionError, String(misspelt))
assert.equal(misspelt.code, 'FRG_UNKNOWN_OPTION')
assert.match(misspelt.message, /Did you mean `algorithm`\?/)

// 4. A loader returning what JSON cannot hold: a TypeError naming the key, nothing stored, no lease left.
{
  const app = Fastify()
  const keyPrefix = prefix('cache')
  await app.register(cache, { redis, keyPrefix })
  await app.ready()
  await assert.rejects(
    app.cache.getOrLoad('big:1', async () => ({ amount: 10n })),
    (err) => err instanceof TypeError && err.code === 'FRG_CACHE_VALUE_NOT_JSON' && /big:1/.test(err.message),
  )
  // The key's generation (its fence) is made by the read itself; its value and its fill lease are not.
  assert.equal(
    await redis.exists(`${keyPrefix}{big:1}:v`, `${keyPrefix}{big:1}:l`),
    0,
    'no value, no lease left',
  )
  let loads = 0
  assert.deepEqual(await app.cache.getOrLoad('big:1', async () => ({ amount: String(++loads) })), {
    amount: '1',
  })
  await app.close()
}

// 5. The same policy name with three algorithms on one Redis and prefix, one app after the other.
{
  const keyPrefix = prefix('rl')
  const policies = [
    { name: 'shared', algorithm: 'fixed-window', limit: 2, windowMs: 60_000 },
    { name: 'shared', algorithm: 'token-bucket', limit: 2, refillPerSecond: 0.01 },
    { name: 'shared', algorithm: 'sliding-log', limit: 2, windowMs: 60_000 },
  ]
  for (const policy of policies) {
    const app = Fastify()
    await app.register(rateLimit, { redis, keyPrefix, policies: [policy] })
    app.get('/', async () => ({ ok: true }))
    const statuses = []
    for (let i = 0; i < 3; i++) statuses.push((await app.inject('/')).statusCode)
    assert.deepEqual(statuses, [200, 200, 429], policy.algorithm)
    await app.close()
  }
}

// 6. Four plugins on a Redis that is down: one wait, and the app is ready well within the 5 s one
// plugin waits (each plugin then follows its failure mode).
{
  const closed = createServer()
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', resolve))
  const port = closed.address().port
  await new Promise((resolve) => closed.close(resolve))
  const down = new Redis({ port, enableOfflineQueue: false, retryStrategy: () => 500 })
  down.on('error', () => {})
  const app = Fastify()
  const started = performance.now()
  await app.register(rateLimit, {
    redis: down,
    policies: [{ name: 'ip', algorithm: 'gcra', limit: 5, windowMs: 1000 }],
  })
  await app.register(idempotency, { redis: down })
  await app.register(session, { redis: down, secrets: ['s'.repeat(32)] })
  await app.register(cache, { redis: down })
  await app.ready()
  const seconds = (performance.now() - started) / 1000
  assert.ok(seconds < 7, `ready in ${seconds.toFixed(1)} s`)
  await app.close()
  down.disconnect()
}

// 7. `Idempotency-Key: "order 42"`: a space inside an sf-string is a valid key.
{
  const app = Fastify()
  await app.register(idempotency, { redis, keyPrefix: prefix('idem') })
  let runs = 0
  app.post('/orders', { config: { idempotency: true } }, async (_request, reply) =>
    reply.code(201).send({ order: ++runs }),
  )
  const send = () =>
    app.inject({ method: 'POST', url: '/orders', headers: { 'idempotency-key': '"order 42"' }, payload: {} })
  assert.equal((await send()).statusCode, 201)
  const again = await send()
  assert.equal(again.statusCode, 201)
  assert.equal(again.headers['idempotent-replayed'], 'true')
  assert.equal(runs, 1)
  await app.close()
}

// 8. The idempotency plugin on a Redis that may evict any key: refused unless the user opts in.
{
  const probe = createServer()
  await new Promise((resolve) => probe.listen(0, '127.0.0.1', resolve))
  const port = probe.address().port
  await new Promise((resolve) => probe.close(resolve))
  const server = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--maxmemory-policy', 'allkeys-lru'],
    { stdio: 'ignore' },
  )
  try {
    const evicting = new Redis({ port, retryStrategy: () => 100 })
    evicting.on('error', () => {})
    const refused = await bootError((app) => app.register(idempotency, { redis: evicting }))
    assert.equal(refused.code, 'FRG_REDIS_EVICTION_POLICY', String(refused))
    assert.match(refused.message, /allkeys-lru/)
    assert.match(refused.message, /allowEviction/)
    const app = Fastify()
    await app.register(idempotency, { redis: evicting, allowEviction: true })
    await app.ready()
    await app.close()
    evicting.disconnect()
  } finally {
    server.kill('SIGTERM')
  }
}

await redis.quit()
console.log('ok mistakes')
