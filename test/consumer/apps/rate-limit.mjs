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
await done('rate-limit', app, redis)
