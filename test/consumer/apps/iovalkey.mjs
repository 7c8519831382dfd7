// The four plugins on an iovalkey client (the Valkey fork of ioredis), installed next to the package.
import assert from 'node:assert/strict'
import Fastify from 'fastify'
import { cache, cacheKey, idempotency, rateLimit, session } from 'fastify-redis-gateway'
import { Redis } from 'iovalkey'
import { done, prefix } from './assert-helpers.mjs'

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
const app = Fastify()
await app.register(session, {
  redis,
  secrets: ['consumer-secret-0123456789-abcdefghij'],
  keyPrefix: prefix('vk-sess'),
})
await app.register(rateLimit, {
  redis,
  keyPrefix: prefix('vk-rl'),
  namedPolicies: [{ name: 'three', algorithm: 'fixed-window', limit: 3, windowMs: 60_000 }],
})
await app.register(idempotency, { redis, keyPrefix: prefix('vk-idem') })
await app.register(cache, { redis, keyPrefix: prefix('vk-cache') })
let orders = 0
let loads = 0
app.get('/limited', { config: { rateLimits: 'three' } }, async () => ({ ok: true }))
app.post('/login', async (_request, reply) => {
  await reply.regenerateSession('valkey-user')
  return { ok: true }
})
app.put('/cart', { config: { session: 'required' } }, async (request) => {
  request.session.set('cart', ['tea'])
  return { ok: true }
})
app.get('/cart', { config: { session: 'required' } }, async (request) => ({
  cart: request.session.get('cart'),
}))
app.post('/orders', { config: { idempotency: true } }, async () => ({ order: ++orders }))
app.get('/report', async () =>
  app.cache.getOrLoad(cacheKey('report', 'tenant/acme', 'q=red shoes'), async () => ++loads),
)

const codes = []
for (let i = 0; i < 4; i++) codes.push((await app.inject('/limited')).statusCode)
assert.deepEqual(codes, [200, 200, 200, 429], 'rate limit')

const login = await app.inject({ method: 'POST', url: '/login' })
const cookies = { sid: login.cookies.find((c) => c.name === 'sid').value }
assert.equal((await app.inject({ method: 'PUT', url: '/cart', cookies })).statusCode, 200)
assert.deepEqual(
  (await app.inject({ url: '/cart', cookies })).json(),
  { cart: ['tea'] },
  'session round trip',
)

const order = () =>
  app.inject({ method: 'POST', url: '/orders', cookies, headers: { 'idempotency-key': 'k1' }, payload: {} })
const [first, again] = [await order(), await order()]
assert.deepEqual([first.json(), again.json()], [{ order: 1 }, { order: 1 }])
assert.equal(again.headers['idempotent-replayed'], 'true', 'idempotent replay')

assert.deepEqual(
  [(await app.inject('/report')).json(), (await app.inject('/report')).json()],
  [1, 1],
  'cache hit',
)
assert.equal(loads, 1)

await done('iovalkey', app, redis)
