import assert from 'node:assert/strict'
import Fastify from 'fastify'
import rateLimit from 'fastify-redis-gateway/rate-limit'
import { done, newRedis, prefix } from './assert-helpers.mjs'

const redis = newRedis()
const app = Fastify()
await app.register(rateLimit, {
  redis,
  keyPrefix: prefix('rl'),
  policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 3, windowMs: 60_000 }],
})
app.get('/', async () => ({ hello: 'world' }))

const statuses = []
for (let i = 0; i < 4; i++) {
  const res = await app.inject('/')
  statuses.push(res.statusCode)
  assert.match(String(res.headers['ratelimit-policy']), /^"ip";q=3;w=60$/)
  assert.match(String(res.headers.ratelimit), /^"ip";r=\d+;t=\d+$/)
  if (i === 3) {
    assert.equal(res.headers['content-type'], 'application/problem+json; charset=utf-8')
    assert.equal(res.json().type, '/problems/rate-limited')
    assert.ok(Number(res.headers['retry-after']) >= 1)
  }
}
assert.deepEqual(statuses, [200, 200, 200, 429])

// store 'memory': no Redis at all, the same algorithms and headers; durations as strings.
const local = Fastify()
await local.register(rateLimit, {
  store: 'memory',
  namedPolicies: [
    { name: 'ip', algorithm: 'sliding-log', limit: 2, windowMs: '1 minute' },
    {
      name: 'login',
      algorithm: 'fixed-window',
      limit: 2,
      windowMs: '10s',
      blockMs: '15 minutes',
      key: (request) => `username:${request.headers['x-user']}`,
    },
  ],
  errorResponse: (request, decision) => ({
    error: 'slow down',
    policy: decision.policy.name,
    url: request.url,
  }),
})
local.get('/', { config: { rateLimits: 'ip' } }, async () => 'ok')
local.get('/login', { config: { rateLimits: 'login' } }, async () => 'ok')
await local.ready()
assert.equal(local.hasDecorator('redis'), false)
const memoryStatuses = []
for (let i = 0; i < 3; i++) memoryStatuses.push((await local.inject('/')).statusCode)
assert.deepEqual(memoryStatuses, [200, 200, 429])
const custom = await local.inject('/')
assert.equal(custom.statusCode, 429)
assert.equal(custom.headers['content-type'], 'application/json; charset=utf-8')
assert.deepEqual(custom.json(), { error: 'slow down', policy: 'ip', url: '/' })
assert.equal(custom.headers['ratelimit-policy'], '"ip";q=2;w=60')
assert.ok(Number(custom.headers['retry-after']) >= 1)

// blockMs: over the limit once, rejected for the block; consume/reset share the route's quota.
const user = { 'x-user': 'ann' }
const first = await local.rateLimiter.consume('login', 'username:ann')
assert.deepEqual(
  {
    allowed: first.allowed,
    remaining: first.remaining,
    limit: first.limit,
    retryAfterMs: first.retryAfterMs,
  },
  { allowed: true, remaining: 1, limit: 2, retryAfterMs: 0 },
)
assert.equal((await local.inject({ url: '/login', headers: user })).statusCode, 200)
const blocked = await local.inject({ url: '/login', headers: user })
assert.equal(blocked.statusCode, 429)
assert.equal(blocked.headers['retry-after'], '900')
assert.equal((await local.rateLimiter.consume('login', 'username:ann', 0)).allowed, false)
await local.rateLimiter.reset('login', 'username:ann')
assert.equal((await local.inject({ url: '/login', headers: user })).statusCode, 200)
await local.rateLimiter.block('login', 'username:ann', '1h')
assert.equal((await local.inject({ url: '/login', headers: user })).headers['retry-after'], '3600')
await local.close()
await done('rate-limit', app, redis)
