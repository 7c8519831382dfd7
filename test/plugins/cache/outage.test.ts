import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import cachePlugin from '../../../src/plugins/cache/index.ts'
import { RedisServerError } from '../../../src/plugins/common/errors.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { counter } from './fixtures.ts'

test('with the cache Redis down, loads run under the concurrency cap and all succeed', async (t) => {
  const server = await startRedisServer()
  const app = Fastify()
  // The cache's own client: the plugin never closes it, the test does after the app.
  const redis = createRedisClient({ url: server.url })
  await app.register(metrics, { processMetrics: false, path: false })
  await app.register(cachePlugin, { redis, keyPrefix: uniquePrefix('o'), maxConcurrentLoads: 4 })
  await app.ready()
  await server.stop()
  t.after(async () => {
    await app.close()
    redis.disconnect()
  })
  let running = 0
  let peak = 0
  const results = await Promise.all(
    Array.from({ length: 50 }, (_, i) =>
      app.cache.getOrLoad(`account:${i}`, async () => {
        peak = Math.max(peak, ++running)
        await sleep(10)
        running--
        return i
      }),
    ),
  )
  assert.deepEqual(
    results,
    Array.from({ length: 50 }, (_, i) => i),
  )
  assert.equal(peak, 4)
  assert.equal(await counter(app, 'cache_loads_total', 'account'), 50)
})

test('refuses to share a Redis that evicts any key with sessions and idempotency records', async (t) => {
  const server = await startRedisServer()
  const admin = new Redis(server.url)
  const clients: RedisClient[] = []
  t.after(async () => {
    // The cache plugin never closes a client it was given.
    for (const client of clients) client.disconnect()
    admin.disconnect()
    await server.stop()
  })
  // A dedicated server: changing its policy touches nothing shared.
  await admin.config('SET', 'maxmemory-policy', 'allkeys-lru')
  const app = Fastify()
  const shared = createRedisClient({ url: server.url })
  clients.push(shared)
  await assert.rejects(
    async () => {
      await app.register(cachePlugin, { redis: shared, sharedWithDurableData: true })
      await app.ready()
    },
    (err: Error & { code?: string }) => {
      assert.ok(err instanceof RedisServerError)
      assert.equal(err.code, 'FRG_REDIS_EVICTION_POLICY')
      assert.match(err.message, /^cache plugin: Redis at .* has maxmemory-policy allkeys-lru/)
      assert.match(
        err.message,
        /this Redis also holds sessions, idempotency records and rate limits, which that policy may evict: give the cache a Redis of its own \(its `redis` option\)/,
      )
      return true
    },
  )
  await app.close()
  // The same instance as a dedicated cache is what it is for.
  const dedicated = Fastify()
  const own = createRedisClient({ url: server.url })
  clients.push(own)
  await dedicated.register(cachePlugin, { redis: own, sharedWithDurableData: false })
  await dedicated.ready()
  await dedicated.close()
})
