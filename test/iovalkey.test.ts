import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis as Valkey } from 'iovalkey'
import { cache, createLock, idempotency, rateLimit, session } from '../src/index.ts'
import { TEST_SECRET, testRedisConnection, uniquePrefix } from './helpers/index.ts'

// Every Redis-backed plugin on an iovalkey client (the Valkey fork of ioredis, its own classes and
// types): accepted as an ioredis client is, with no cast, and each plugin answers from Redis.

const { url } = testRedisConnection()
const valkey = new Valkey(url ?? 'redis://127.0.0.1:6379')
const prefixes = {
  rl: uniquePrefix('vk-rl'),
  idem: uniquePrefix('vk-idem'),
  sess: uniquePrefix('vk-sess'),
  cache: uniquePrefix('vk-cache'),
  lock: uniquePrefix('vk-lock'),
}
let app: FastifyInstance
let orders = 0
let loads = 0

before(async () => {
  app = Fastify()
  await app.register(session, { redis: valkey, secrets: [TEST_SECRET], keyPrefix: prefixes.sess })
  await app.register(rateLimit, {
    redis: valkey,
    // A plain client has no command timeout: the plugin's own 500 ms would let a loaded machine degrade a decision.
    timeoutMs: 10_000,
    keyPrefix: prefixes.rl,
    namedPolicies: [{ name: 'three', algorithm: 'fixed-window', limit: 3, windowMs: 60_000 }],
  })
  await app.register(idempotency, { redis: valkey, keyPrefix: prefixes.idem })
  await app.register(cache, { redis: valkey, keyPrefix: prefixes.cache })
  app.get('/limited', { config: { rateLimits: 'three' } }, async () => ({ ok: true }))
  app.post('/orders', { config: { idempotency: true } }, async () => ({ order: ++orders }))
  app.post('/login', async (_request, reply) => {
    await reply.regenerateSession('valkey-user')
    return { ok: true }
  })
  app.put('/cart', { config: { session: 'required' } }, async (request) => {
    request.session?.set('cart', ['tea'])
    return { ok: true }
  })
  app.get('/cart', { config: { session: 'required' } }, async (request) => ({
    principal: request.session?.principal,
    cart: request.session?.get('cart'),
  }))
  app.get('/cached', async () => app.cache.getOrLoad('vk:one', async () => ++loads))
  await app.ready()
})

after(async () => {
  await app.close()
  for (const prefix of Object.values(prefixes)) {
    const keys = await valkey.keys(`${prefix}*`)
    if (keys.length) await valkey.del(...keys)
  }
  await valkey.quit()
})

test('rate limit: the fourth request within the window is refused with 429', async () => {
  const codes: number[] = []
  for (let i = 0; i < 4; i++) codes.push((await app.inject({ method: 'GET', url: '/limited' })).statusCode)
  assert.deepEqual(codes, [200, 200, 200, 429])
  assert.ok((await valkey.keys(`${prefixes.rl}*`)).length > 0, 'counted in Redis')
})

async function login(): Promise<Record<string, string>> {
  const res = await app.inject({ method: 'POST', url: '/login' })
  const sid = res.cookies.find((c) => c.name === 'sid')
  assert.ok(sid, 'a session cookie')
  return { sid: sid.value }
}

test('idempotency: the same key replays the first response', async () => {
  // With the session plugin, a key belongs to the session's principal.
  const cookies = await login()
  const send = () =>
    app.inject({
      method: 'POST',
      url: '/orders',
      cookies,
      headers: { 'idempotency-key': 'vk-1' },
      payload: {},
    })
  const first = await send()
  const again = await send()
  assert.deepEqual([first.statusCode, again.statusCode], [200, 200])
  assert.deepEqual(again.json(), { order: 1 })
  assert.equal(again.headers['idempotent-replayed'], 'true')
  assert.equal(orders, 1)
})

test('session: what one request stores, the next one reads', async () => {
  const cookies = await login()
  assert.equal((await app.inject({ method: 'PUT', url: '/cart', cookies })).statusCode, 200)
  const read = await app.inject({ method: 'GET', url: '/cart', cookies })
  assert.deepEqual(read.json(), { principal: 'valkey-user', cart: ['tea'] })
  assert.equal((await app.inject({ method: 'GET', url: '/cart' })).statusCode, 401)
})

test('cache: a miss loads, the next read is a hit', async () => {
  const first = await app.inject({ method: 'GET', url: '/cached' })
  const second = await app.inject({ method: 'GET', url: '/cached' })
  assert.deepEqual([first.json(), second.json()], [1, 1])
  assert.equal(loads, 1)
})

test('a primitive takes an iovalkey client too', async () => {
  const lock = createLock(valkey, { keyPrefix: prefixes.lock })
  const handle = await lock.acquire('job', 10_000)
  assert.ok(handle)
  assert.equal(await lock.acquire('job', 10_000), null, 'held: a second acquire is refused')
  assert.equal(await lock.release(handle), true)
})
