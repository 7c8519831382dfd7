import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import { type RedisClusterProcess, startRedisCluster } from '../../../scripts/redis-cluster.ts'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { counter } from './fixtures.ts'

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

function l1Hits(app: FastifyInstance, name: string): Promise<number> {
  return counter(app, 'cache_l1_hits_total', name)
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
  assert.equal(await l1Hits(b, 'account'), keys.length)

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

test('tags on a Redis Cluster: entries and tag generations in many slots, across instances and their L1', async () => {
  const keyPrefix = uniquePrefix('t')
  const a = await clusterCache({ keyPrefix, l1TtlMs: 60_000 })
  const b = await clusterCache({ keyPrefix, l1TtlMs: 60_000 })
  // 30 keys (many slots), each with two tags (others again): its shop's and the whole catalog's.
  const keys = Array.from({ length: 30 }, (_, i) => `product:${i + 1}`)
  const tagsOf = (key: string) => ['catalog', `shop:${Number(key.split(':')[1]) % 3}`]
  let version = 'v1'
  let loads = 0
  const loader = async () => {
    loads++
    return version
  }
  const read = (app: FastifyInstance, key: string) => app.cache.getOrLoad(key, loader, { tags: tagsOf(key) })
  const readAll = (app: FastifyInstance) => Promise.all(keys.map((key) => read(app, key)))
  /** Reads on `app` until every key shows `expected(key)` (b's L1 learns through pub/sub). */
  const until = async (app: FastifyInstance, expected: (key: string) => string) => {
    let seen: Array<string | null> = []
    for (let i = 0; i < 100; i++) {
      seen = await readAll(app)
      if (seen.every((v, k) => v === expected(keys[k]!))) return
      await sleep(20)
    }
    assert.fail(JSON.stringify(seen))
  }

  const both = await Promise.all([readAll(a), readAll(b)])
  assert.ok(both.flat().every((v) => v === 'v1'))
  assert.equal(loads, keys.length)

  // One shop's tag: only its ten keys load again, at once on a, and on b once its L1 is told.
  version = 'v2'
  assert.equal(await a.cache.invalidateTags(['shop:1']), true)
  const shop1 = (key: string) => tagsOf(key)[1] === 'shop:1'
  for (const key of keys) assert.equal(await read(a, key), shop1(key) ? 'v2' : 'v1')
  assert.equal(loads, keys.length + keys.filter(shop1).length)
  await until(b, (key) => (shop1(key) ? 'v2' : 'v1'))
  assert.equal(loads, keys.length + keys.filter(shop1).length)

  // The catalog tag drops them all, on both instances.
  version = 'v3'
  assert.equal(await b.cache.invalidateTags(['catalog']), true)
  await until(b, () => 'v3')
  await until(a, () => 'v3')

  // The tag fence: a fill whose tag generation moved while it loaded is refused.
  let loaded!: () => void
  const hasLoaded = new Promise<void>((resolve) => {
    loaded = resolve
  })
  let release!: () => void
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  const slow = b.cache.getOrLoad(
    'product:99',
    async () => {
      const value = version
      loaded()
      await held
      return value
    },
    { tags: ['catalog', 'shop:0'] },
  )
  await hasLoaded
  version = 'v4'
  await a.cache.invalidateTags(['shop:0'])
  release()
  assert.equal(await slow, 'v3')
  assert.equal(await a.cache.getOrLoad('product:99', loader, { tags: ['catalog', 'shop:0'] }), 'v4')

  // get, set, has, delete, with tags.
  assert.equal(await a.cache.set('product:100', 'set', { tags: ['catalog'] }), true)
  assert.equal(await b.cache.get('product:100'), 'set')
  assert.equal(await b.cache.has('product:100'), true)
  await a.cache.invalidateTags(['catalog'])
  assert.equal(await b.cache.get('product:100'), undefined)
  await a.cache.set('product:101', 'set')
  assert.equal(await b.cache.delete('product:101'), true)
  assert.equal(await a.cache.has('product:101'), false)
})
