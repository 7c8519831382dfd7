import assert from 'node:assert/strict'
import Fastify from 'fastify'
import { cache, idempotency, metrics, rateLimit, session } from 'fastify-redis-gateway'
import { done, newRedis, prefix } from './assert-helpers.mjs'

// The metrics plugin registered last still exports every other plugin's series.
const redis = newRedis()
const app = Fastify()
await app.register(session, {
  redis,
  secrets: ['a-secret-of-at-least-32-characters!!'],
  keyPrefix: prefix('s'),
})
await app.register(rateLimit, {
  redis,
  keyPrefix: prefix('rl'),
  policies: [{ name: 'ip', algorithm: 'token-bucket', limit: 100, refillPerSecond: 10 }],
})
await app.register(idempotency, { redis, keyPrefix: prefix('idem') })
await app.register(cache, { redis, keyPrefix: prefix('cache') })
await app.register(metrics, { processMetrics: false })
app.post('/things', { config: { idempotency: { anonymous: true } } }, async () => ({ ok: true }))
app.get('/cached', async () => app.cache.getOrLoad('thing:1', async () => 1))

const key = { 'idempotency-key': 'k1' }
assert.equal(
  (await app.inject({ method: 'POST', url: '/things', headers: key, payload: {} })).statusCode,
  200,
)
assert.equal((await app.inject('/cached')).statusCode, 200)
assert.equal((await app.inject('/cached')).statusCode, 200)
const text = (await app.inject('/metrics')).body
for (const series of [
  'rate_limit_decisions_total{policy="ip",outcome="allowed"}',
  'idempotency_requests_total{outcome="new"} 1',
  'cache_hits_total{name="thing"} 1',
  'cache_misses_total{name="thing"} 1',
  'http_request_duration_seconds_count{method="GET",route="/cached",status="200"} 2',
]) {
  assert.ok(text.includes(series), `/metrics shows ${series}`)
}
// One client shared by every plugin: each command is timed once, under the plugin that sent it.
assert.match(
  text,
  /redis_command_duration_seconds_count\{client="rate-limit",command="script:rateLimitTokenBucket"\} [1-9]/,
)
assert.match(
  text,
  /redis_command_duration_seconds_count\{client="idempotency",command="script:idempotencyClaim"\} [1-9]/,
)
assert.ok(!text.includes('client="session",command="script:rateLimitTokenBucket"'))
await done('metrics', app, redis)
