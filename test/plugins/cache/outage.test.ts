import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import cachePlugin from '../../../src/plugins/cache/index.ts'
import { RedisServerError } from '../../../src/plugins/common/errors.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { startTcpProxy, uniquePrefix } from '../../helpers/index.ts'
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

for (const commandTimeout of [undefined, 100])
  test(`an L1 whose subscriber goes silent (no FIN) stops serving within two heartbeats, and serves again once its PING is answered${commandTimeout ? ' (a client with commandTimeout: its PINGs time out)' : ''}`, async (t) => {
    const server = await startRedisServer()
    // Instance B reaches Redis through a proxy the test freezes: its connections stay open and nothing
    // passes, as when a network or a host goes away without closing anything.
    const proxy = await startTcpProxy(server.port)
    const clients = [
      createRedisClient({ url: server.url }),
      commandTimeout
        ? new Redis(`redis://127.0.0.1:${proxy.port}`, { commandTimeout, lazyConnect: true })
        : createRedisClient({ url: `redis://127.0.0.1:${proxy.port}` }),
    ]
    for (const client of clients) client.on('error', () => {})
    const keyPrefix = uniquePrefix('hb')
    const apps: FastifyInstance[] = []
    t.after(async () => {
      proxy.thaw()
      for (const app of apps) await app.close()
      for (const client of clients) client.disconnect()
      await proxy.close()
      await server.stop()
    })
    for (const redis of clients) {
      const app = Fastify()
      await app.register(metrics, { processMetrics: false, path: false })
      await app.register(cachePlugin, { redis, keyPrefix, l1TtlMs: 60_000 })
      await app.ready()
      apps.push(app)
    }
    const [a, b] = apps as [FastifyInstance, FastifyInstance]
    let source = 'old'
    const load = async () => source
    assert.equal(await b.cache.getOrLoad('account:1', load), 'old')
    assert.equal(await b.cache.getOrLoad('account:1', load), 'old')
    assert.equal(await counter(b, 'cache_l1_hits_total', 'account'), 1)

    proxy.freeze()
    source = 'new'
    // Published to a subscriber that will not hear it: B's L1 still holds 'old', for a minute by its TTL.
    await a.cache.invalidate(['account:1'])
    // B's heartbeat PING goes unanswered for an interval (1 s): the L1 is bypassed, B's read goes to
    // Redis, gives up on it and asks the source. Waited for well within the L1's TTL.
    let seen = 'old'
    for (const deadline = Date.now() + 20_000; seen === 'old' && Date.now() < deadline; ) {
      seen = (await b.cache.getOrLoad('account:1', load)) as string
      if (seen === 'old') await sleep(100)
    }
    assert.equal(seen, 'new', 'the L1 kept serving what another instance invalidated')

    // The network comes back: the PING's answer arrives after the invalidation it was queued behind,
    // and the L1 serves again (emptied, then filled by the next read).
    proxy.thaw()
    const hitsBefore = await counter(b, 'cache_l1_hits_total', 'account')
    let hits = hitsBefore
    for (const deadline = Date.now() + 20_000; hits === hitsBefore && Date.now() < deadline; ) {
      assert.equal(await b.cache.getOrLoad('account:1', load), 'new')
      hits = await counter(b, 'cache_l1_hits_total', 'account')
      if (hits === hitsBefore) await sleep(100)
    }
    assert.ok(hits > hitsBefore, 'the L1 serves again once its PING is answered')
  })
