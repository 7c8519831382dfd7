// Window edges and settings changes, to the millisecond: a private redis-server whose clock the test
// sets (test/model/redis.ts), and the memory store on the same clock through the plugin's `now`.
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import rateLimit, {
  type RateLimitPolicy,
  type RateLimitResult,
} from '../../../src/plugins/rate-limit/index.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { type ModelRedis, startModelRedis } from '../../model/redis.ts'

let server: ModelRedis
let client: Redis
const apps: FastifyInstance[] = []

before(async () => {
  server = await startModelRedis()
  client = await server.client()
})

after(async () => {
  for (const app of apps) await app.close()
  await server.stop()
})

async function instance(store: 'redis' | 'memory', prefix: string, policies: RateLimitPolicy[]) {
  const app = Fastify()
  const now = () => server.clock.now()
  await app.register(
    rateLimit,
    store === 'redis'
      ? { redis: client, keyPrefix: prefix, namedPolicies: policies, now, overLimitCacheKeys: 0 }
      : { store: 'memory', keyPrefix: prefix, namedPolicies: policies, now },
  )
  await app.ready()
  apps.push(app)
  return app
}

const pick = ({ allowed, remaining, resetMs, retryAfterMs }: RateLimitResult) => ({
  allowed,
  remaining,
  resetMs,
  retryAfterMs,
})

for (const store of ['redis', 'memory'] as const) {
  test(`${store}: a fixed window of 1000 ms that starts at t admits again at t + 1000`, async () => {
    const app = await instance(store, uniquePrefix('rle'), [
      { name: 'fw', algorithm: 'fixed-window', limit: 3, windowMs: 1000 },
    ])
    assert.equal((await app.rateLimiter.consume('fw', 'k', 3)).allowed, true)
    server.clock.advance(999)
    assert.deepEqual(pick(await app.rateLimiter.consume('fw', 'k')), {
      allowed: false,
      remaining: 0,
      resetMs: 1,
      retryAfterMs: 1,
    })
    server.clock.advance(1)
    // The old window's key is still in Redis for this millisecond, with PTTL 0.
    assert.deepEqual(pick(await app.rateLimiter.consume('fw', 'k')), {
      allowed: true,
      remaining: 2,
      resetMs: 1000,
      retryAfterMs: 0,
    })
  })

  test(`${store}: a sliding log's reset counts from the oldest unit still in the window`, async () => {
    const app = await instance(store, uniquePrefix('rle'), [
      { name: 'log', algorithm: 'sliding-log', limit: 3, windowMs: 1000 },
    ])
    assert.equal((await app.rateLimiter.consume('log', 'k', 1)).allowed, true)
    server.clock.advance(600)
    assert.equal((await app.rateLimiter.consume('log', 'k', 2)).allowed, true)
    server.clock.advance(500)
    // The unit of t has left the window; the two of t + 600 leave at t + 1600, 500 ms from now.
    // A peek (cost 0) trims nothing first.
    assert.deepEqual(pick(await app.rateLimiter.consume('log', 'k', 0)), {
      allowed: true,
      remaining: 1,
      resetMs: 500,
      retryAfterMs: 0,
    })
    assert.deepEqual(pick(await app.rateLimiter.consume('log', 'k', 2)), {
      allowed: false,
      remaining: 1,
      resetMs: 500,
      retryAfterMs: 500,
    })
  })
}

test('a deploy that changes a sliding counter window starts a fresh counter; the old window keeps its own', async () => {
  const prefix = uniquePrefix('rle')
  const before = await instance('redis', prefix, [
    { name: 'sc', algorithm: 'sliding-counter', limit: 4, windowMs: 1000 },
  ])
  const after = await instance('redis', prefix, [
    { name: 'sc', algorithm: 'sliding-counter', limit: 4, windowMs: 800 },
  ])
  assert.equal((await after.rateLimiter.consume('sc', 'k', 1)).remaining, 3)
  // Counted under the 800 ms window's indexes, that unit would be read as this window's (or dropped).
  assert.equal((await before.rateLimiter.consume('sc', 'k', 1)).remaining, 3)
  assert.equal((await after.rateLimiter.consume('sc', 'k', 1)).remaining, 2)
})

test('during a rolling deploy a shorter sliding-log window never cuts the log the longer one still counts', async () => {
  const prefix = uniquePrefix('rle')
  const long = await instance('redis', prefix, [
    { name: 'log', algorithm: 'sliding-log', limit: 3, windowMs: 1000 },
  ])
  const short = await instance('redis', prefix, [
    { name: 'log', algorithm: 'sliding-log', limit: 5, windowMs: 600 },
  ])
  assert.equal((await long.rateLimiter.consume('log', 'k', 1)).allowed, true)
  server.clock.advance(100)
  assert.equal((await short.rateLimiter.consume('log', 'k', 2)).allowed, true)
  server.clock.advance(650)
  // 750 ms after the first unit: all three are in the long window, whatever the short one set.
  assert.deepEqual(pick(await long.rateLimiter.consume('log', 'k', 1)), {
    allowed: false,
    remaining: 0,
    resetMs: 250,
    retryAfterMs: 250,
  })
})
