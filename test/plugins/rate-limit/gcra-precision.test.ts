import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify from 'fastify'
import rateLimit from '../../../src/plugins/rate-limit/index.ts'
import { runEncoded } from '../../../src/plugins/rate-limit/protocol.ts'
import { connectRedis, createRedisClient } from '../../../src/plugins/redis/index.ts'
import { testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

const redis = createRedisClient(testRedisConnection())
before(() => connectRedis(redis))
after(() => redis.quit())

// Redis stores a Lua number argument with its shortest exact form, so sub-millisecond steps survive;
// this guards against a change that would round them away (tostring keeps only 14 digits).
test('the GCRA arrival time keeps sub-millisecond steps (a fast policy still advances)', async () => {
  const key = `${uniquePrefix('gcra')}{k}:fast`
  // 100 per ms: each unit moves the theoretical arrival time by 0.01 ms. A first request of half
  // the burst puts it 500 ms ahead, so the key outlives the test and each step adds exactly 0.01.
  const consume = (cost: number) =>
    runEncoded(redis, 'gcra', { keys: [key], argv: ['c', '', 100_000, 1000, cost, 0] })
  await consume(50_000)
  const first = Number(await redis.get(key))
  for (let i = 0; i < 20; i++) await consume(1)
  const stored = Number(await redis.get(key))
  assert.ok(first > 0, 'the arrival time is stored')
  // A double near 1.8e12 ms resolves about 0.00024 ms: each step may round by half of that.
  assert.ok(Math.abs(stored - first - 0.2) < 0.005, `20 steps of 0.01 ms each (${first} -> ${stored})`)
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
