import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import { type RedisClusterProcess, startRedisCluster } from '../scripts/redis-cluster.ts'
import cachePlugin, { type CachePluginOptions } from '../src/plugins/cache/index.ts'
import metrics from '../src/plugins/metrics/index.ts'
import { createRedisClient, type RedisClient } from '../src/plugins/redis/index.ts'
import { uniquePrefix } from './helpers.ts'

// Three masters: the cache's keys land in many slots.
let cluster: RedisClusterProcess
const apps: FastifyInstance[] = []
// The cache never closes the client it is given: each app's is closed after the apps.
const clients: RedisClient[] = []

before(async () => {
  cluster = await startRedisCluster()
})

after(async () => {
  await Promise.all(apps.map((app) => app.close()))
  for (const client of clients) client.disconnect()
  await cluster.stop()
})

async function clusterCache(options: CachePluginOptions): Promise<FastifyInstance> {
  const app = Fastify()
  await app.register(metrics, { processMetrics: false, path: false })
  const redis = createRedisClient({ clusterNodes: cluster.nodes })
  clients.push(redis)
  await app.register(cachePlugin, { redis, ...options })
  await app.ready()
  apps.push(app)
  return app
}

test('fills, fences, leases, multi-slot invalidation and the L1 channel work on a Redis Cluster', async () => {
  const keyPrefix = uniquePrefix('k')
  const a = await clusterCache({ keyPrefix, l1TtlMs: 60_000, sharedWithDurableData: true })
  const b = await clusterCache({ keyPrefix, l1TtlMs: 60_000 })
  const keys = Array.from({ length: 30 }, (_, i) => `account:${i + 1}`)
  let version = 'old'
  let loads = 0
  const loader = async () => {
    loads++
    await sleep(20)
    return version
  }

  // Simultaneous misses on two instances: one load per key across both.
  const first = await Promise.all(
    keys.flatMap((key) => [a, b].map((app) => app.cache.getOrLoad(key, loader))),
  )
  assert.ok(first.every((v) => v === 'old'))
  assert.equal(loads, keys.length)

  // b serves them from its L1 now (its pub/sub subscription to the cluster is up).
  for (const key of keys) assert.equal(await b.cache.getOrLoad(key, loader), 'old')
  const l1Hits = await b.metrics.registry.getSingleMetric('cache_l1_hits_total')?.get()
  assert.equal(l1Hits?.values[0]?.value, keys.length)

  // One invalidation spanning many slots; b's L1 learns of it through pub/sub.
  version = 'new'
  assert.equal(await a.cache.invalidate(keys), true)
  for (const key of keys) assert.equal(await a.cache.getOrLoad(key, loader), 'new')
  let seen: Array<string | null> = []
  for (let i = 0; i < 100; i++) {
    seen = await Promise.all(keys.map((key) => b.cache.getOrLoad(key, loader)))
    if (seen.every((v) => v === 'new')) break
    await sleep(20)
  }
  assert.ok(
    seen.every((v) => v === 'new'),
    JSON.stringify(seen),
  )

  // The fence: a fill whose generation predates an invalidation is refused.
  let loaded!: () => void
  const hasLoaded = new Promise<void>((resolve) => {
    loaded = resolve
  })
  let release!: () => void
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  const slow = b.cache.getOrLoad('account:99', async () => {
    const value = version
    loaded()
    await held
    return value
  })
  await hasLoaded
  version = 'newest'
  await a.cache.invalidate(['account:99'])
  release()
  assert.equal(await slow, 'new')
  assert.equal(await a.cache.getOrLoad('account:99', async () => version), 'newest')
})
