import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import { CACHE_RELEASE } from '../../../src/plugins/cache/scripts.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { isCluster } from '../../../src/redis/client.ts'
import { callScript } from '../../../src/redis/scripts.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { parse } from '../../helpers/metrics-scrape.ts'

const apps: FastifyInstance[] = []
// Each cache app's own connection: the plugin never closes a client it is given, so these close after the apps.
const clients: RedisClient[] = []
const redis = createRedisClient(testRedisConnection())
before(() => connectRedis(redis))
after(async () => {
  await Promise.all(apps.map((app) => app.close()))
  for (const client of clients) client.disconnect()
  redis.disconnect()
})

async function cacheApp(options: CachePluginOptions = {}): Promise<FastifyInstance> {
  const app = Fastify()
  const client = createRedisClient(testRedisConnection())
  clients.push(client)
  await app.register(metrics, { processMetrics: false, path: false })
  await app.register(cachePlugin, { redis: client, keyPrefix: uniquePrefix('c'), ...options })
  await app.ready()
  apps.push(app)
  return app
}

export async function counter(app: FastifyInstance, metric: string, name: string): Promise<number> {
  const found = await app.metrics.registry.getSingleMetric(metric)?.get()
  return found?.values.find((v) => v.labels.name === name)?.value ?? 0
}

/** A loader that counts its calls and can be held back until released. */
function loader<T>(value: () => T, delayMs = 0) {
  const counted = async () => {
    counted.calls++
    if (delayMs) await sleep(delayMs)
    return value()
  }
  counted.calls = 0
  return counted
}

describe('options', () => {
  const cases: Array<[CachePluginOptions, string]> = [
    [{ ttlMs: 0 }, 'cache plugin: `ttlMs` must be an integer of at least 1, got 0'],
    [{ jitter: 1.5 }, 'cache plugin: `jitter` must be a number from 0 to 1, got 1.5'],
    [
      { leaseWaitMs: 5000, leaseTtlMs: 1000 },
      'cache plugin: `leaseWaitMs` (5000) must not exceed `leaseTtlMs` (1000)',
    ],
    [
      { keyPrefix: 'a{b}:' },
      "cache plugin: `keyPrefix` must not contain braces (they would change the hash tag), got 'a{b}:'",
    ],
    [{ maxConcurrentLoads: 0 }, 'cache plugin: `maxConcurrentLoads` must be an integer of at least 1, got 0'],
    [{ earlyRefreshBeta: -1 }, 'cache plugin: `earlyRefreshBeta` must be a number from 0 to 10, got -1'],
  ]
  for (const [options, message] of cases) {
    test(`rejects ${JSON.stringify(options)}`, async () => {
      const app = Fastify()
      await assert.rejects(
        async () => {
          await app.register(cachePlugin, { enabled: false, ...options })
          await app.ready()
        },
        { name: 'InvalidOptionError', code: 'FRG_INVALID_OPTION', message },
      )
      await app.close()
    })
  }

  test('keys built from unbounded input are refused', async () => {
    const app = await cacheApp()
    for (const key of [
      'account',
      'account:',
      'account:{x}',
      `account:${'9'.repeat(65)}`,
      'Account:1',
      'a b:1',
    ]) {
      assert.throws(
        () => app.cache.getOrLoad(key, async () => 1),
        (err: Error & { code?: string }) =>
          err instanceof TypeError &&
          err.code === 'FRG_CACHE_KEY_INVALID' &&
          err.message.includes(`(${key.length} characters)`) &&
          err.message.includes('a key is <namespace>:<id>'),
        key,
      )
    }
  })
})

describe('cache-aside', () => {
  test('a miss loads and stores with a TTL; the next read is a hit', async () => {
    const app = await cacheApp({ ttlMs: 60_000 })
    const load = loader(() => ({ balance: 7 }))
    assert.deepEqual(await app.cache.getOrLoad('account:1', load), { balance: 7 })
    assert.deepEqual(await app.cache.getOrLoad('account:1', load), { balance: 7 })
    assert.equal(load.calls, 1)
    assert.equal(await counter(app, 'cache_misses_total', 'account'), 1)
    assert.equal(await counter(app, 'cache_hits_total', 'account'), 1)
    assert.equal(await counter(app, 'cache_loads_total', 'account'), 1)
  })

  test('jitter spreads the expiry of keys filled together over [ttl, ttl * (1 + jitter)]', async () => {
    const prefix = uniquePrefix('j')
    const app = await cacheApp({ keyPrefix: prefix, ttlMs: 100_000, jitter: 0.5 })
    const n = 400
    await Promise.all(Array.from({ length: n }, (_, i) => app.cache.getOrLoad(`account:${i}`, async () => i)))
    const keys = (await scanKeys(redis, prefix)).filter((k) => k.endsWith(':v'))
    assert.equal(keys.length, n)
    const ttls = await Promise.all(keys.map((k) => redis.pttl(k)))
    // Ten equal buckets over the jitter range: a uniform spread puts about 40 in each.
    const buckets = new Array<number>(10).fill(0)
    for (const ttl of ttls) {
      assert.ok(ttl > 99_000 && ttl <= 150_000, `ttl ${ttl} outside [ttl, 1.5 ttl]`)
      buckets[Math.min(9, Math.max(0, Math.floor((ttl - 100_000) / 5_000)))]!++
    }
    for (const count of buckets) assert.ok(count >= 15 && count <= 75, `bucket counts ${buckets}`)
    const chiSquare = buckets.reduce((sum, c) => sum + (c - n / 10) ** 2 / (n / 10), 0)
    assert.ok(chiSquare < 27.9, `chi-square ${chiSquare.toFixed(1)} (p < 0.001 for 9 degrees of freedom)`)
  })

  test('a not-found is cached for the negative TTL, then looked up again', async () => {
    // Long enough that 20 reads finish within it on a loaded machine; the TTL then really passes.
    const app = await cacheApp({ negativeTtlMs: 2000, jitter: 0 })
    const load = loader(() => null)
    for (let i = 0; i < 20; i++) assert.equal(await app.cache.getOrLoad('account:404', load), null)
    assert.equal(load.calls, 1)
    await sleep(2100)
    assert.equal(await app.cache.getOrLoad('account:404', load), null)
    assert.equal(load.calls, 2)
  })

  test('simultaneous misses in three instances load once: single-flight plus the lease', async () => {
    const keyPrefix = uniquePrefix('s')
    const instances = await Promise.all([1, 2, 3].map(() => cacheApp({ keyPrefix })))
    const load = loader(() => 42, 100)
    const results = await Promise.all(
      instances.flatMap((app) => Array.from({ length: 100 }, () => app.cache.getOrLoad('account:9', load))),
    )
    assert.ok(results.every((r) => r === 42))
    assert.equal(load.calls, 1)
    const waits = await Promise.all(
      instances.map((app) => counter(app, 'cache_lease_waits_total', 'account')),
    )
    assert.equal(
      waits.reduce((a, b) => a + b),
      2,
    )
  })

  test('a lease is released only by its owner (compare-and-delete)', async () => {
    const key = `${uniquePrefix('l')}{account:1}:l`
    await redis.set(key, 'owner-a', 'PX', 10_000)
    assert.equal(await callScript(redis, CACHE_RELEASE, { lease: key }, { owner: 'owner-b' }), 'notOwner')
    assert.equal(await redis.get(key), 'owner-a')
    assert.equal(await callScript(redis, CACHE_RELEASE, { lease: key }, { owner: 'owner-a' }), 'released')
    assert.equal(await redis.exists(key), 0)
  })
})

describe('the stale-set race, reproduced deterministically', () => {
  /**
   * A reader loads the old value, is held back, an invalidation runs (the source changed), then
   * the reader fills. Returns what a later read sees and the fence rejections counted.
   */
  async function race(fence: boolean) {
    const keyPrefix = uniquePrefix('r')
    const reader = await cacheApp({ keyPrefix, fence })
    const writer = await cacheApp({ keyPrefix })
    let source = 'old'
    let release!: () => void
    const held = new Promise<void>((resolve) => {
      release = resolve
    })
    let loaded!: () => void
    const hasLoaded = new Promise<void>((resolve) => {
      loaded = resolve
    })
    const slowRead = reader.cache.getOrLoad('account:1', async () => {
      const value = source
      loaded()
      await held
      return value
    })
    await hasLoaded
    source = 'new'
    assert.equal(await writer.cache.invalidate(['account:1']), true)
    release()
    assert.equal(await slowRead, 'old')
    const later = await writer.cache.getOrLoad('account:1', async () => source)
    return { later, rejections: await counter(reader, 'cache_fence_rejections_total', 'account') }
  }

  test('without the fence the old value is cached after the invalidation', async () => {
    assert.deepEqual(await race(false), { later: 'old', rejections: 0 })
  })

  test('with the fence the old fill is refused and the next read loads the new value', async () => {
    assert.deepEqual(await race(true), { later: 'new', rejections: 1 })
  })
})

describe('refresh', () => {
  test('stale-while-revalidate serves the old value past the TTL while one caller refreshes', async () => {
    const app = await cacheApp({ ttlMs: 100, jitter: 0, staleWhileRevalidateMs: 60_000 })
    let source = 1
    const load = loader(() => source, 100)
    assert.equal(await app.cache.getOrLoad('account:1', load), 1)
    source = 2
    await sleep(150)
    const reads = await Promise.all(Array.from({ length: 20 }, () => app.cache.getOrLoad('account:1', load)))
    assert.ok(reads.every((r) => r === 1))
    assert.equal(await counter(app, 'cache_stale_served_total', 'account'), 1)
    let latest = 1
    for (let i = 0; i < 40 && latest === 1; i++) {
      await sleep(25)
      latest = (await app.cache.getOrLoad('account:1', load)) as number
    }
    assert.equal(latest, 2)
    assert.equal(load.calls, 2)
  })

  test('XFetch refreshes a hot entry before it expires; with beta 0 it never does', async () => {
    for (const beta of [0, 10]) {
      const app = await cacheApp({ ttlMs: 2000, jitter: 0, earlyRefreshBeta: beta })
      const load = loader(() => 'v', 200)
      await app.cache.getOrLoad('account:1', load)
      // With a 200 ms load and beta 10, each read refreshes early with probability >= e^-1.
      for (let i = 0; i < 30; i++) await app.cache.getOrLoad('account:1', load)
      await sleep(250)
      if (beta === 0) assert.equal(load.calls, 1)
      else assert.ok(load.calls >= 2, `loads ${load.calls}`)
    }
  })
})

describe('L1', () => {
  test('an invalidation on one instance reaches the L1 of the other through pub/sub', async () => {
    const keyPrefix = uniquePrefix('h')
    const [a, b] = [
      await cacheApp({ keyPrefix, l1TtlMs: 60_000 }),
      await cacheApp({ keyPrefix, l1TtlMs: 60_000 }),
    ]
    let source = 'old'
    const load = loader(() => source)
    assert.equal(await a!.cache.getOrLoad('account:1', load), 'old')
    assert.equal(await b!.cache.getOrLoad('account:1', load), 'old')
    assert.equal(await b!.cache.getOrLoad('account:1', load), 'old')
    assert.equal(await counter(b!, 'cache_l1_hits_total', 'account'), 1)
    source = 'new'
    await a!.cache.invalidate(['account:1'])
    assert.equal(await a!.cache.getOrLoad('account:1', load), 'new')
    // Only the pub/sub message can take 'old' out of b's L1 (its TTL is a minute): wait for it.
    let seen = 'old'
    for (let i = 0; i < 100 && seen === 'old'; i++) {
      seen = (await b!.cache.getOrLoad('account:1', load)) as string
      if (seen === 'old') await sleep(20)
    }
    assert.equal(seen, 'new')
  })

  test('a key the L1 holds still refuses wrong options, and that call counts no hit', async () => {
    const app = (await cacheApp({ keyPrefix: uniquePrefix('l1o'), l1TtlMs: 60_000 }))!
    // Ready means subscribed: the first reads after it fill the L1 and are answered from it.
    const load = loader(() => 'v')
    assert.equal(await app.cache.getOrLoad('item:1', load), 'v')
    assert.equal(await app.cache.getOrLoad('item:1', load), 'v')
    assert.equal(await counter(app, 'cache_l1_hits_total', 'item'), 1)
    assert.throws(() => app.cache.getOrLoad('item:1', load, { ttlMs: -1 } as never), /getOrLoad options/)
    assert.equal(await counter(app, 'cache_l1_hits_total', 'item'), 1)
    assert.throws(() => app.cache.getOrLoad('Item:1', load), { code: 'FRG_CACHE_KEY_INVALID' })
    assert.equal(load.calls, 1)
  })
})

test('one invalidation drops several entries: each value gone, each generation new, one script on one Redis', async () => {
  const prefix = uniquePrefix('inv')
  const app = await cacheApp({ keyPrefix: prefix })
  // Script calls that ran: a node that had not cached the script answers NOSCRIPT, then EVAL runs it.
  const scripts = async () => {
    const scrape = parse(await app.metrics.registry.metrics())
    const command = { command: 'script:cacheInvalidate' }
    return (
      scrape.value('redis_command_duration_seconds_count', command) -
      scrape.value('redis_script_reloads_total', command)
    )
  }
  const load = loader(() => 7)
  for (const id of [1, 2, 3]) await app.cache.getOrLoad(`account:${id}`, load)
  const generation = (id: number) => redis.get(`${prefix}{account:${id}}:g`)
  const before = await Promise.all([1, 2, 3].map(generation))
  const calls = await scripts()

  assert.equal(await app.cache.invalidate(['account:1', 'account:2']), true)

  // A single Redis takes both entries in one call; a Cluster one call per entry (a slot each).
  assert.equal((await scripts()) - calls, isCluster(redis) ? 2 : 1)
  assert.equal(await redis.exists(`${prefix}{account:1}:v`), 0)
  assert.equal(await redis.exists(`${prefix}{account:2}:v`), 0)
  assert.equal(await redis.exists(`${prefix}{account:3}:v`), 1)
  const after = await Promise.all([1, 2, 3].map(generation))
  assert.notEqual(after[0], before[0])
  assert.notEqual(after[1], before[1])
  assert.equal(after[2], before[2])
  assert.ok(after[0] && after[1], 'each invalidated entry has a generation')
  const loads = load.calls
  assert.equal(await app.cache.getOrLoad('account:1', load), 7)
  assert.equal(await app.cache.getOrLoad('account:3', load), 7)
  assert.equal(load.calls, loads + 1, 'the invalidated entry loads again, the other is still cached')
})

test('a disabled cache calls the loader every time and touches no Redis', async () => {
  const prefix = uniquePrefix('d')
  const app = await cacheApp({ enabled: false, keyPrefix: prefix })
  const load = loader(() => 1)
  await app.cache.getOrLoad('account:1', load)
  await app.cache.getOrLoad('account:1', load)
  assert.equal(load.calls, 2)
  assert.equal(await app.cache.invalidate(['account:1']), true)
  assert.deepEqual(await scanKeys(redis, prefix), [])
})

test('admit: false answers null without a load or any key; true loads as usual; a hit never asks', async () => {
  const prefix = uniquePrefix('adm')
  const app = await cacheApp({ keyPrefix: prefix })
  const load = loader(() => ({ id: 1 }))
  let asked = 0
  const admit = (answer: boolean) => async () => {
    asked++
    return answer
  }
  assert.equal(await app.cache.getOrLoad('account:404', load, { admit: admit(false) }), null)
  assert.equal(load.calls, 0)
  assert.deepEqual(await scanKeys(redis, prefix), [], 'no lease, generation or "not found" entry')
  assert.deepEqual(await app.cache.getOrLoad('account:1', load, { admit: admit(true) }), { id: 1 })
  assert.equal(load.calls, 1)
  assert.equal(asked, 2)
  assert.deepEqual(await app.cache.getOrLoad('account:1', load, { admit: admit(false) }), { id: 1 })
  assert.equal(asked, 2, 'a hit does not ask')
  // The disabled cache asks too.
  const off = await cacheApp({ enabled: false })
  assert.equal(await off.cache.getOrLoad('account:404', load, { admit: admit(false) }), null)
  assert.equal(load.calls, 1)
})
