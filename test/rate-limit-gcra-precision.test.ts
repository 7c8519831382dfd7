import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify from 'fastify'
import { runScript } from '../src/lua/index.ts'
import rateLimit from '../src/plugins/rate-limit/index.ts'
import { connectRedis, createRedisClient } from '../src/plugins/redis.ts'
import { testRedisConnection, uniquePrefix } from './helpers.ts'

const redis = createRedisClient(testRedisConnection())
before(() => connectRedis(redis))
after(() => redis.quit())

// Redis stores a Lua number argument with its shortest exact form, so sub-millisecond steps survive;
// this guards against a change that would round them away (tostring keeps only 14 digits).
test('the GCRA arrival time keeps sub-millisecond steps (a fast policy still advances)', async () => {
  const key = `${uniquePrefix('gcra')}{k}:fast`
  // 100 per ms: each unit moves the theoretical arrival time by 0.01 ms.
  const consume = () => runScript<number[]>(redis, 'rateLimitGcra', [key], ['c', '', 100, 1, 1, 0])
  await consume()
  const first = Number(await redis.get(key))
  for (let i = 0; i < 20; i++) await consume()
  const [seconds, micros] = (await redis.time()) as unknown as [string, string]
  const now = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000)
  const stored = Number(await redis.get(key))
  assert.ok(stored - first > 0, `the arrival time moved (${first} -> ${stored})`)
  assert.notEqual(stored % 1, 0, 'sub-millisecond part kept')
  assert.ok(stored <= now + 1 + 21 * 0.01 + 0.001, 'never more than the consumed units ahead')
})

test('a gcra policy finer than 100 per ms of window fails the boot with a message', async () => {
  const app = Fastify()
  await assert.rejects(
    async () => {
      await app.register(rateLimit, {
        redis,
        policies: [{ name: 'fast', algorithm: 'gcra', limit: 1_000_001, windowMs: 10_000 }],
      })
      await app.ready()
    },
    { message: /`limit` of a gcra policy may be at most 100 per millisecond of `windowMs`/ },
  )
})
