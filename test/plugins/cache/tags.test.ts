import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { scriptSources } from '../../../src/redis/scripts.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { counter, signal } from './fixtures.ts'

// Runs on the Redis the suites use: a single node, or the Redis Cluster under `npm run test:cluster`
// (tags live in other slots than the entries that carry them).
const apps: FastifyInstance[] = []
const clients: RedisClient[] = []
const redis = createRedisClient(testRedisConnection())
before(() => connectRedis(redis))
after(async () => {
  await Promise.all(apps.map((app) => app.close()))
  for (const client of clients) client.disconnect()
  redis.disconnect()
})

async function cacheApp(options: CachePluginOptions = {}, client?: RedisClient): Promise<FastifyInstance> {
  const app = Fastify()
  const own = client ?? createRedisClient(testRedisConnection())
  clients.push(own)
  await app.register(metrics, { processMetrics: false, path: false })
  await app.register(cachePlugin, { redis: own, keyPrefix: uniquePrefix('c'), ...options })
  await app.ready()
  apps.push(app)
  return app
}

/** Two instances of one app (same key prefix), each with its own connection. */
async function twoInstances(options: CachePluginOptions = {}) {
  const keyPrefix = uniquePrefix('tg')
  const apps = [await cacheApp({ keyPrefix, ...options }), await cacheApp({ keyPrefix, ...options })] as const
  return apps
}

/** A loader that returns the current value of `source()` and counts its calls. */
function loader<T>(source: () => T) {
  const counted = async () => {
    counted.calls++
    return source()
  }
  counted.calls = 0
  return counted
}

/** The scripts and commands a client sends, by name, and how many were in flight at once at most. */
function recordCommands(client: RedisClient) {
  const byShaOrName = new Map([...scriptSources].map(([name, { sha }]) => [sha, name]))
  const log: string[] = []
  let inFlight = 0
  let maxInFlight = 0
  const original = client.sendCommand.bind(client) as (command: {
    name: string
    args: unknown[]
    promise: Promise<unknown>
  }) => unknown
  ;(client as unknown as { sendCommand: typeof original }).sendCommand = (command) => {
    const name =
      command.name === 'evalsha' ? (byShaOrName.get(String(command.args[0])) ?? 'evalsha') : command.name
    log.push(name)
    inFlight++
    maxInFlight = Math.max(maxInFlight, inFlight)
    const settled = () => {
      inFlight--
    }
    command.promise.then(settled, settled)
    return original(command)
  }
  return {
    log,
    reset() {
      log.length = 0
      maxInFlight = 0
    },
    get maxInFlight() {
      return maxInFlight
    },
  }
}

describe('arguments', () => {
  test('tags must be a short list of namespace or namespace:id strings', async () => {
    const app = await cacheApp()
    const rule =
      "a tag is <namespace> or <namespace>:<id>, the namespace 1 to 32 characters of a-z, 0-9 and '-', starting with a letter, the id 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-' (no braces, no spaces)"
    const cases: Array<[unknown, string]> = [
      [['Products'], `cache: invalid tag 'Products' (8 characters): ${rule}`],
      [['a{b}'], `cache: invalid tag 'a{b}' (4 characters): ${rule}`],
      [['user:'], `cache: invalid tag 'user:' (5 characters): ${rule}`],
      [['a b'], `cache: invalid tag 'a b' (3 characters): ${rule}`],
      [[42], `cache: invalid tag a number: ${rule}`],
      ['products', "cache: `tags` must be an array of at most 16 tags, got a string ('products')"],
      [
        Array.from({ length: 17 }, (_, i) => `t${i}`),
        'cache: `tags` must be an array of at most 16 tags, got 17 tags',
      ],
    ]
    for (const [tags, message] of cases) {
      const expected = { name: 'CacheTagInvalidError', code: 'FRG_CACHE_TAG_INVALID', message }
      assert.throws(() => app.cache.getOrLoad('item:1', async () => 1, { tags: tags as string[] }), TypeError)
      assert.throws(() => app.cache.getOrLoad('item:1', async () => 1, { tags: tags as string[] }), expected)
      assert.throws(() => app.cache.set('item:1', 1, { tags: tags as string[] }), expected)
      await assert.rejects(app.cache.invalidateTags(tags as string[]), expected)
    }
  })

  test('get, has, set and delete follow the key rules of getOrLoad', async () => {
    const app = await cacheApp()
    for (const key of ['item', 'item:', 'item:{x}', `item:${'9'.repeat(65)}`, 'Item:1']) {
      assert.throws(() => app.cache.get(key), TypeError, key)
      assert.throws(() => app.cache.has(key), TypeError, key)
      assert.throws(() => app.cache.set(key, 1), TypeError, key)
      assert.throws(() => app.cache.delete(key), TypeError, key)
    }
    assert.throws(() => app.cache.set('item:1', undefined), {
      name: 'CacheValueNotJsonError',
      code: 'FRG_CACHE_VALUE_NOT_JSON',
      message:
        'cache: the value for \'item:1\' cannot be stored: it is undefined (return or set null to cache "not found")',
    })
    assert.throws(() => app.cache.set('item:1', 1, { ttlMs: 0 }), {
      name: 'InvalidOptionError',
      code: 'FRG_INVALID_OPTION',
      message: 'cache: set options: `ttlMs` must be an integer of at least 1, got 0',
    })
  })
})

describe('tags', () => {
  test('invalidateTags on instance A: instance B loads again on its next read', async () => {
    const [a, b] = await twoInstances()
    let price = 10
    const load = loader(() => ({ price }))
    const read = (app: FastifyInstance) => app.cache.getOrLoad('product:1', load, { tags: ['products'] })
    assert.deepEqual(await read(b), { price: 10 })
    assert.deepEqual(await read(a), { price: 10 })
    assert.deepEqual(await read(b), { price: 10 })
    assert.equal(load.calls, 1)

    price = 12
    assert.equal(await a.cache.invalidateTags(['products']), true)
    assert.deepEqual(await read(b), { price: 12 })
    assert.equal(load.calls, 2)
    assert.deepEqual(await read(a), { price: 12 })
    assert.equal(load.calls, 2)
  })

  test('many keys under one tag: one SET per tag, no scan, and every one of them loads again', async () => {
    const keyPrefix = uniquePrefix('tm')
    const writerClient = createRedisClient(testRedisConnection())
    const writer = await cacheApp({ keyPrefix }, writerClient)
    const reader = await cacheApp({ keyPrefix })
    const n = 300
    let version = 1
    const load = loader(() => version)
    const other = loader(() => 'other')
    const readAll = () =>
      Promise.all(
        Array.from({ length: n }, (_, i) => reader.cache.getOrLoad(`item:${i}`, load, { tags: ['catalog'] })),
      )
    assert.ok((await readAll()).every((v) => v === 1))
    assert.equal(await reader.cache.getOrLoad('item:other', other, { tags: ['other'] }), 'other')
    assert.equal(load.calls, n)

    version = 2
    const sent = recordCommands(writerClient)
    assert.equal(await writer.cache.invalidateTags(['catalog']), true)
    // One SET for the tag and its PUBLISH (for the L1s of other instances): no scan, nothing per key.
    assert.deepEqual(sent.log, ['set', 'publish'])
    // The entries are still in Redis; they read as misses because their tag moved on.
    assert.equal((await scanKeys(redis, keyPrefix)).filter((k) => k.endsWith(':v')).length, n + 1)

    assert.ok((await readAll()).every((v) => v === 2))
    assert.equal(load.calls, 2 * n)
    assert.ok((await readAll()).every((v) => v === 2))
    assert.equal(load.calls, 2 * n)
    // Another tag's entry is untouched.
    assert.equal(await reader.cache.getOrLoad('item:other', other, { tags: ['other'] }), 'other')
    assert.equal(other.calls, 1)
  })

  test('an entry with two tags is dropped by either; an unrelated tag leaves it', async () => {
    const [a, b] = await twoInstances()
    let status = 'placed'
    const load = loader(() => status)
    const read = () => b.cache.getOrLoad('order:1', load, { tags: ['customer:7', 'shop:3'] })
    assert.equal(await read(), 'placed')

    assert.equal(await a.cache.invalidateTags(['customer:8', 'shop']), true)
    assert.equal(await read(), 'placed')
    assert.equal(load.calls, 1)

    status = 'paid'
    await a.cache.invalidateTags(['shop:3'])
    assert.equal(await read(), 'paid')
    assert.equal(load.calls, 2)

    status = 'shipped'
    await a.cache.invalidateTags(['customer:7'])
    assert.equal(await read(), 'shipped')
    assert.equal(load.calls, 3)
    assert.equal(await read(), 'shipped')
    assert.equal(load.calls, 3)
  })

  test('the order and repetition of tags in a call do not matter', async () => {
    const app = await cacheApp()
    const load = loader(() => 'v')
    await app.cache.getOrLoad('order:2', load, { tags: ['shop:3', 'customer:7', 'shop:3'] })
    await app.cache.getOrLoad('order:2', load, { tags: ['customer:7', 'shop:3'] })
    assert.equal(load.calls, 1)
  })

  test('a read without tags honours the tags the entry was filled with', async () => {
    const [a, b] = await twoInstances()
    let name = 'Ada'
    const load = loader(() => name)
    assert.equal(await a.cache.getOrLoad('user:1', load, { tags: ['team:1'] }), 'Ada')
    assert.equal(await b.cache.getOrLoad('user:1', load), 'Ada')
    assert.equal(load.calls, 1)
    name = 'Grace'
    await a.cache.invalidateTags(['team:1'])
    assert.equal(await b.cache.getOrLoad('user:1', load), 'Grace')
    assert.equal(load.calls, 2)
    // That reload kept the entry's tags: the next invalidation of the tag drops it again.
    name = 'Edsger'
    await a.cache.invalidateTags(['team:1'])
    assert.equal(await b.cache.getOrLoad('user:1', load, { tags: ['team:1'] }), 'Edsger')
    assert.equal(load.calls, 3)
  })

  test('a lost tag generation (eviction, expiry) costs a reload, never a stale value', async () => {
    const keyPrefix = uniquePrefix('te')
    const app = await cacheApp({ keyPrefix })
    let value = 'old'
    const load = loader(() => value)
    await app.cache.getOrLoad('item:1', load, { tags: ['catalog'] })
    value = 'new'
    await redis.del(`${keyPrefix}{catalog}:t`)
    assert.equal(await app.cache.getOrLoad('item:1', load, { tags: ['catalog'] }), 'new')
    assert.equal(load.calls, 2)
  })

  test('a fill whose tag was invalidated while it loaded is refused', async () => {
    const [reader, writer] = await twoInstances()
    let source = 'old'
    const loaded = signal()
    const release = signal()
    const slowRead = reader.cache.getOrLoad(
      'product:1',
      async () => {
        const value = source
        loaded.resolve()
        await release.promise
        return value
      },
      { tags: ['products'] },
    )
    await loaded.promise
    source = 'new'
    assert.equal(await writer.cache.invalidateTags(['products']), true)
    release.resolve()
    assert.equal(await slowRead, 'old')
    assert.equal(await counter(reader, 'cache_fence_rejections_total', 'product'), 1)
    assert.equal(await writer.cache.getOrLoad('product:1', async () => source, { tags: ['products'] }), 'new')
  })

  test('an invalidation landing between the tag check and the fill: stored, but never served', async () => {
    const keyPrefix = uniquePrefix('tw')
    const readerClient = createRedisClient(testRedisConnection())
    const reader = await cacheApp({ keyPrefix }, readerClient)
    const writer = await cacheApp({ keyPrefix })
    let source = 'old'
    // Hold the reader's cache-fill.lua (sent after its tag check passed) until the writer has
    // invalidated the tag: the fill then lands after the invalidation.
    const fillSha = scriptSources.get('cacheFill')!.sha
    const original = readerClient.call.bind(readerClient) as (...args: unknown[]) => Promise<unknown>
    let held = false
    ;(readerClient as unknown as { call: typeof original }).call = async (...args: unknown[]) => {
      if (!held && args[0] === 'evalsha' && args[1] === fillSha) {
        held = true
        source = 'new'
        assert.equal(await writer.cache.invalidateTags(['products']), true)
      }
      return original(...args)
    }
    assert.equal(await reader.cache.getOrLoad('product:1', async () => source, { tags: ['products'] }), 'old')
    assert.ok(held)
    assert.equal(await counter(reader, 'cache_fence_rejections_total', 'product'), 0)
    const later = loader(() => source)
    assert.equal(await writer.cache.getOrLoad('product:1', later, { tags: ['products'] }), 'new')
    assert.equal(await writer.cache.get('product:1'), 'new')
    assert.equal(later.calls, 1)
  })

  test('reads racing writes and tag invalidations: once the last invalidation returns, every read is new', async () => {
    const [a, b] = await twoInstances()
    const keys = Array.from({ length: 20 }, (_, i) => `product:${i}`)
    let version = 0
    const load = async () => {
      const seen = version
      await sleep(Math.random() * 5)
      return seen
    }
    const read = (app: FastifyInstance, key: string) => app.cache.getOrLoad(key, load, { tags: ['products'] })
    let stop = false
    const readers = [a, b].map(async (app) => {
      while (!stop) await Promise.all(keys.map((key) => read(app, key)))
    })
    for (let i = 0; i < 20; i++) {
      version++
      assert.equal(await (i % 2 ? a : b).cache.invalidateTags(['products']), true)
      await sleep(2)
    }
    stop = true
    await Promise.all(readers)
    for (const app of [a, b]) {
      const seen = await Promise.all(keys.map((key) => read(app, key)))
      assert.ok(
        seen.every((v) => v === version),
        `${seen}`,
      )
    }
  })

  test('costs: an untagged hit is one script; a tagged hit adds one call per tag, sent concurrently', async () => {
    const client = createRedisClient(testRedisConnection())
    const app = await cacheApp({}, client)
    await app.cache.getOrLoad('plain:1', async () => 1)
    await app.cache.getOrLoad('tagged:1', async () => 1, { tags: ['a', 'b'] })
    const sent = recordCommands(client)
    await app.cache.getOrLoad('plain:1', async () => 1)
    assert.deepEqual(sent.log, ['cacheGet'])
    sent.reset()
    await app.cache.getOrLoad('tagged:1', async () => 1, { tags: ['a', 'b'] })
    assert.deepEqual(sent.log.sort(), ['cacheGet', 'cacheTags', 'cacheTags'])
    assert.equal(sent.maxInFlight, 3)
  })

  test("with the L1: invalidateTags drops the tag's entries from every instance's L1", async () => {
    const [a, b] = await twoInstances({ l1TtlMs: 60_000 })
    let source = 'old'
    const load = loader(() => source)
    const read = (app: FastifyInstance) => app.cache.getOrLoad('product:1', load, { tags: ['products'] })
    const readPlain = (app: FastifyInstance) => app.cache.getOrLoad('product:2', load, { tags: ['other'] })
    for (const app of [a, b, a, b]) {
      assert.equal(await read(app), 'old')
      assert.equal(await readPlain(app), 'old')
    }
    assert.equal(await counter(b, 'cache_l1_hits_total', 'product'), 2)
    source = 'new'
    await a.cache.invalidateTags(['products'])
    assert.equal(await read(a), 'new')
    // Only the pub/sub message can take 'old' out of b's L1 (its TTL is a minute): wait for it.
    let seen = 'old'
    for (let i = 0; i < 100 && seen === 'old'; i++) {
      seen = (await read(b)) as string
      if (seen === 'old') await sleep(20)
    }
    assert.equal(seen, 'new')
    // The entry under another tag stayed in b's L1.
    assert.equal(await readPlain(b), 'old')
  })
})

describe('get, set, has, delete', () => {
  test('set on one instance, get and has on the other; delete removes it', async () => {
    const [a, b] = await twoInstances()
    assert.equal(await b.cache.get('user:1'), undefined)
    assert.equal(await b.cache.has('user:1'), false)
    assert.equal(await a.cache.set('user:1', { name: 'Ada' }), true)
    assert.deepEqual(await b.cache.get('user:1'), { name: 'Ada' })
    assert.equal(await b.cache.has('user:1'), true)
    const load = loader(() => ({ name: 'unused' }))
    assert.deepEqual(await b.cache.getOrLoad('user:1', load), { name: 'Ada' })
    assert.equal(load.calls, 0)
    assert.equal(await b.cache.delete('user:1'), true)
    assert.equal(await a.cache.get('user:1'), undefined)
    assert.equal(await a.cache.has('user:1'), false)
  })

  test('null is a cached "not found": get answers null, has answers true', async () => {
    const app = await cacheApp()
    await app.cache.set('user:404', null)
    assert.equal(await app.cache.get('user:404'), null)
    assert.equal(await app.cache.has('user:404'), true)
    assert.equal(await app.cache.getOrLoad('user:404', async () => 'loaded'), null)
  })

  test('set with tags: invalidateTags drops it for get, has and getOrLoad', async () => {
    const [a, b] = await twoInstances()
    await a.cache.set('user:1', 'Ada', { tags: ['team:1'] })
    await a.cache.set('user:2', 'Grace', { tags: ['team:2'] })
    assert.equal(await b.cache.get('user:1'), 'Ada')
    await b.cache.invalidateTags(['team:1'])
    assert.equal(await a.cache.get('user:1'), undefined)
    assert.equal(await a.cache.has('user:1'), false)
    assert.equal(await a.cache.getOrLoad('user:1', async () => 'Ada L.', { tags: ['team:1'] }), 'Ada L.')
    assert.equal(await a.cache.get('user:2'), 'Grace')
  })

  test('set fences off a fill that loaded before it', async () => {
    const [reader, writer] = await twoInstances()
    const loaded = signal()
    const release = signal()
    const slowRead = reader.cache.getOrLoad('user:1', async () => {
      loaded.resolve()
      await release.promise
      return 'before'
    })
    await loaded.promise
    assert.equal(await writer.cache.set('user:1', 'after'), true)
    release.resolve()
    assert.equal(await slowRead, 'before')
    assert.equal(await counter(reader, 'cache_fence_rejections_total', 'user'), 1)
    assert.equal(await reader.cache.get('user:1'), 'after')
  })

  test('set and delete reach the L1 of the other instance', async () => {
    const [a, b] = await twoInstances({ l1TtlMs: 60_000 })
    await a.cache.set('user:1', 'v1')
    // b's L1 holds it once its subscription is up and the set's own message has passed.
    for (let i = 0; i < 100 && (await counter(b, 'cache_l1_hits_total', 'user')) === 0; i++) {
      assert.equal(await b.cache.getOrLoad('user:1', async () => 'unused'), 'v1')
      assert.equal(await b.cache.get('user:1'), 'v1')
      await sleep(10)
    }
    assert.ok((await counter(b, 'cache_l1_hits_total', 'user')) > 0)
    await a.cache.set('user:1', 'v2')
    let seen: unknown = 'v1'
    for (let i = 0; i < 100 && seen === 'v1'; i++) {
      seen = await b.cache.get('user:1')
      if (seen === 'v1') await sleep(20)
    }
    assert.equal(seen, 'v2')
    await b.cache.getOrLoad('user:1', async () => 'unused')
    await a.cache.delete('user:1')
    for (let i = 0; i < 100 && seen !== undefined; i++) {
      seen = await b.cache.get('user:1')
      if (seen !== undefined) await sleep(20)
    }
    assert.equal(seen, undefined)
  })

  test('get does not answer a stale copy; getOrLoad serves it and refreshes', async () => {
    const app = await cacheApp({ jitter: 0, staleWhileRevalidateMs: 60_000 })
    await app.cache.set('user:1', 'old', { ttlMs: 1 })
    await sleep(20)
    assert.equal(await app.cache.get('user:1'), undefined)
    assert.equal(await app.cache.has('user:1'), false)
    assert.equal(await app.cache.getOrLoad('user:1', async () => 'new'), 'old')
  })

  test('a disabled cache stores nothing', async () => {
    const app = await cacheApp({ enabled: false })
    assert.equal(await app.cache.set('user:1', 'v'), true)
    assert.equal(await app.cache.get('user:1'), undefined)
    assert.equal(await app.cache.has('user:1'), false)
    assert.equal(await app.cache.delete('user:1'), true)
    assert.equal(await app.cache.invalidateTags(['team:1']), true)
  })
})
