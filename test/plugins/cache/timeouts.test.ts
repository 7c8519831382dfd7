import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import { CacheLoadTimeoutError, InvalidOptionError } from '../../../src/index.ts'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { counter } from './fixtures.ts'

const apps: FastifyInstance[] = []
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

/** A loader the test controls: each call waits until the test resolves or rejects it. */
function heldLoader<T>() {
  const pending: Array<{ resolve: (value: T) => void; reject: (err: Error) => void }> = []
  let started!: () => void
  let startedPromise = new Promise<void>((r) => {
    started = r
  })
  const load = () =>
    new Promise<T>((resolve, reject) => {
      pending.push({ resolve, reject })
      started()
    })
  return {
    load,
    /** Calls waiting for the test to settle them. */
    get pending() {
      return pending.length
    },
    /** Resolves once the next call has started. */
    async started() {
      await startedPromise
      startedPromise = new Promise<void>((r) => {
        started = r
      })
    },
    resolve(value: T) {
      for (const p of pending.splice(0)) p.resolve(value)
    },
    reject(err: Error) {
      for (const p of pending.splice(0)) p.reject(err)
    },
  }
}

/** Polls until `check` holds (a background fill has landed); fails after ~2 s. */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (await check()) return
    await sleep(20)
  }
  assert.fail(`never: ${what}`)
}

/** An app whose entries go stale at once and keep a stale copy for a minute, with `value` cached. */
async function staleEntry(options: CachePluginOptions, key: string, value: string) {
  const app = await cacheApp({ jitter: 0, staleWhileRevalidateMs: 60_000, ...options })
  await app.cache.set(key, value, { ttlMs: 1 })
  await sleep(20)
  assert.equal(await app.cache.get(key), undefined, 'past its soft TTL')
  return app
}

describe('options', () => {
  const cases: Array<[CachePluginOptions, string]> = [
    [{ softTimeoutMs: -1 }, 'cache plugin: `softTimeoutMs` must be an integer of at least 0, got -1'],
    [{ hardTimeoutMs: 1.5 }, 'cache plugin: `hardTimeoutMs` must be an integer of at least 0, got 1.5'],
    [
      { onLoadError: 'retry' as 'fail' },
      "cache plugin: `onLoadError` must be 'serve-stale' or 'fail', got a string ('retry')",
    ],
  ]
  for (const [options, message] of cases) {
    test(`rejects ${JSON.stringify(options)}`, async () => {
      const app = Fastify()
      await assert.rejects(async () => {
        await app.register(cachePlugin, { enabled: false, ...options })
        await app.ready()
      }, new InvalidOptionError(message))
      await app.close()
    })
  }

  test('per-call values are checked too', async () => {
    const app = await cacheApp()
    const load = async () => 1
    const calls: Array<[object, string]> = [
      [
        { softTimeoutMs: -5 },
        'cache: getOrLoad options: `softTimeoutMs` must be an integer of at least 0, got -5',
      ],
      [
        { hardTimeoutMs: '100' },
        "cache: getOrLoad options: `hardTimeoutMs` must be an integer of at least 0, got a string ('100')",
      ],
      [{ ttlMs: 0 }, 'cache: getOrLoad options: `ttlMs` must be an integer of at least 1, got 0'],
      [
        { onLoadError: 'ignore' },
        "cache: getOrLoad options: `onLoadError` must be 'serve-stale' or 'fail', got a string ('ignore')",
      ],
    ]
    for (const [options, message] of calls)
      assert.throws(() => app.cache.getOrLoad('item:1', load, options), new InvalidOptionError(message))
  })
})

describe('softTimeoutMs', () => {
  test('a refresh slower than the soft timeout serves the stale copy, then fills when done', async () => {
    const app = await staleEntry({ softTimeoutMs: 50 }, 'item:1', 'old')
    const loader = heldLoader<string>()
    assert.equal(await app.cache.getOrLoad('item:1', loader.load), 'old')
    assert.equal(loader.pending, 1)
    assert.equal(await counter(app, 'cache_soft_timeouts_total', 'item'), 1)
    loader.resolve('new')
    await eventually(async () => (await app.cache.get('item:1')) === 'new', 'the refresh filled')
    assert.equal(loader.pending, 0)
  })

  test('a refresh within the soft timeout answers the new value', async () => {
    const app = await staleEntry({}, 'item:1', 'old')
    const loader = heldLoader<string>()
    const read = app.cache.getOrLoad('item:1', loader.load, { softTimeoutMs: 60_000 })
    await loader.started()
    loader.resolve('new')
    assert.equal(await read, 'new')
    assert.equal(await counter(app, 'cache_stale_served_total', 'item'), 0)
    assert.equal(await app.cache.get('item:1'), 'new')
  })

  test('without a soft timeout the stale copy is served at once (the load runs in the background)', async () => {
    const app = await staleEntry({}, 'item:1', 'old')
    const loader = heldLoader<string>()
    assert.equal(await app.cache.getOrLoad('item:1', loader.load), 'old')
    assert.equal(loader.pending, 1)
    loader.resolve('new')
    await eventually(async () => (await app.cache.get('item:1')) === 'new', 'the refresh filled')
  })

  test('simultaneous reads of a stale entry on two instances: one load, nobody waits past the soft timeout', async () => {
    const keyPrefix = uniquePrefix('ss')
    const a = await staleEntry({ keyPrefix, softTimeoutMs: 100 }, 'item:1', 'old')
    const b = await cacheApp({ keyPrefix, softTimeoutMs: 100, jitter: 0, staleWhileRevalidateMs: 60_000 })
    const loader = heldLoader<string>()
    const reads = await Promise.all(
      [a, b].flatMap((app) => Array.from({ length: 50 }, () => app.cache.getOrLoad('item:1', loader.load))),
    )
    assert.ok(reads.every((v) => v === 'old'))
    assert.equal(loader.pending, 1)
    loader.resolve('new')
    await eventually(async () => (await b.cache.get('item:1')) === 'new', 'the refresh filled')
  })
})

describe('hardTimeoutMs', () => {
  test('a miss whose load outlasts the hard timeout fails with CacheLoadTimeoutError; the load still fills', async () => {
    const app = await cacheApp({ hardTimeoutMs: 50 })
    const loader = heldLoader<string>()
    const failed = await app.cache.getOrLoad('item:1', loader.load).then(
      () => assert.fail('resolved'),
      (err: unknown) => err,
    )
    assert.ok(failed instanceof CacheLoadTimeoutError)
    assert.equal(failed.name, 'CacheLoadTimeoutError')
    assert.equal(failed.code, 'FRG_CACHE_LOAD_TIMEOUT')
    assert.equal(failed.key, 'item:1')
    assert.equal(failed.timeoutMs, 50)
    assert.equal(await counter(app, 'cache_hard_timeouts_total', 'item'), 1)
    loader.resolve('loaded')
    await eventually(async () => (await app.cache.get('item:1')) === 'loaded', 'the load filled')
    assert.equal(await app.cache.getOrLoad('item:1', async () => assert.fail('loaded again')), 'loaded')
  })

  test('waiting for another instance holding the lease is bounded by the hard timeout too', async () => {
    const keyPrefix = uniquePrefix('hl')
    const a = await cacheApp({ keyPrefix, leaseWaitMs: 5000, leaseTtlMs: 10_000 })
    const b = await cacheApp({ keyPrefix, leaseWaitMs: 5000, leaseTtlMs: 10_000 })
    const loader = heldLoader<string>()
    const holder = a.cache.getOrLoad('item:1', loader.load)
    await loader.started()
    await assert.rejects(
      b.cache.getOrLoad('item:1', async () => assert.fail('b must wait for the lease'), {
        hardTimeoutMs: 100,
      }),
      CacheLoadTimeoutError,
    )
    assert.equal(await counter(b, 'cache_lease_waits_total', 'item'), 1)
    loader.resolve('loaded')
    assert.equal(await holder, 'loaded')
    assert.equal(await b.cache.getOrLoad('item:1', async () => assert.fail('filled by a')), 'loaded')
  })

  test('a per-call 0 lifts the plugin-wide hard timeout', async () => {
    const app = await cacheApp({ hardTimeoutMs: 20 })
    const loader = heldLoader<string>()
    const read = app.cache.getOrLoad('item:1', loader.load, { hardTimeoutMs: 0 })
    await loader.started()
    await sleep(60)
    loader.resolve('slow but fine')
    assert.equal(await read, 'slow but fine')
  })

  test('a loader error before the hard timeout is the read’s error', async () => {
    const app = await cacheApp({ hardTimeoutMs: 60_000 })
    const loader = heldLoader<string>()
    const read = app.cache.getOrLoad('item:1', loader.load)
    await loader.started()
    loader.reject(new Error('database down'))
    await assert.rejects(read, new Error('database down'))
  })

  test('a read with a stale copy never fails on the hard timeout: it serves the copy', async () => {
    const app = await staleEntry({ hardTimeoutMs: 30, softTimeoutMs: 60_000 }, 'item:1', 'old')
    const loader = heldLoader<string>()
    assert.equal(await app.cache.getOrLoad('item:1', loader.load), 'old')
    assert.equal(await counter(app, 'cache_hard_timeouts_total', 'item'), 0)
    loader.resolve('new')
    await eventually(async () => (await app.cache.get('item:1')) === 'new', 'the refresh filled')
  })

  test('the disabled cache bounds its loader calls too', async () => {
    const app = await cacheApp({ enabled: false, hardTimeoutMs: 30 })
    const loader = heldLoader<string>()
    await assert.rejects(app.cache.getOrLoad('item:1', loader.load), CacheLoadTimeoutError)
    loader.resolve('late')
  })
})

describe('onLoadError', () => {
  test("'serve-stale' (the default): a refresh that throws serves the stale copy", async () => {
    const app = await staleEntry({ softTimeoutMs: 60_000 }, 'item:1', 'old')
    const loader = heldLoader<string>()
    const read = app.cache.getOrLoad('item:1', loader.load)
    await loader.started()
    loader.reject(new Error('database down'))
    assert.equal(await read, 'old')
    assert.equal(await counter(app, 'cache_stale_on_error_total', 'item'), 1)
  })

  test("'fail': a refresh that throws rejects the read with the loader's error", async () => {
    const app = await staleEntry({ softTimeoutMs: 60_000, onLoadError: 'fail' }, 'item:1', 'old')
    const loader = heldLoader<string>()
    const read = app.cache.getOrLoad('item:1', loader.load)
    await loader.started()
    loader.reject(new Error('database down'))
    await assert.rejects(read, new Error('database down'))
    // The lease was released: the next read refreshes at once.
    const next = heldLoader<string>()
    const again = app.cache.getOrLoad('item:1', next.load)
    await next.started()
    next.resolve('new')
    assert.equal(await again, 'new')
  })

  test('per call it overrides the plugin-wide choice, both ways', async () => {
    const failing = await staleEntry({ softTimeoutMs: 60_000, onLoadError: 'fail' }, 'item:1', 'old')
    let loader = heldLoader<string>()
    let read = failing.cache.getOrLoad('item:1', loader.load, { onLoadError: 'serve-stale' })
    await loader.started()
    loader.reject(new Error('database down'))
    assert.equal(await read, 'old')

    const serving = await staleEntry({ softTimeoutMs: 60_000 }, 'item:2', 'old')
    loader = heldLoader<string>()
    read = serving.cache.getOrLoad('item:2', loader.load, { onLoadError: 'fail' })
    await loader.started()
    loader.reject(new Error('database down'))
    await assert.rejects(read, new Error('database down'))
  })

  test('with no stale copy a loader error fails the read, whatever onLoadError says', async () => {
    const app = await cacheApp({ onLoadError: 'serve-stale' })
    await assert.rejects(
      app.cache.getOrLoad('item:1', async () => {
        throw new Error('database down')
      }),
      new Error('database down'),
    )
  })
})
