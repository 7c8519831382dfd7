import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { freePort } from '../../../src/embedded/redis-server.ts'
import {
  CacheKeyInvalidError,
  CacheValueNotJsonError,
  InvalidOptionError,
  UnknownOptionError,
} from '../../../src/index.ts'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import { connectRedis, createRedisClient } from '../../../src/plugins/redis/index.ts'
import { testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { counter } from './fixtures.ts'

// What the cache refuses instead of letting a guarantee lapse in silence: values its serializer
// cannot hold, unknown or wrong options, routes it does not cover, and how it reports a Redis away.

const redis = createRedisClient(testRedisConnection())
before(() => connectRedis(redis))
after(() => redis.disconnect())

type LogLine = { level: number; msg: string; err?: { code?: string } }

/** A cache app on its own client and key prefix, with metrics and a log the test reads. */
async function cacheApp(t: { after(fn: () => unknown): void }, options: CachePluginOptions = {}) {
  const lines: LogLine[] = []
  const app = Fastify({
    logger: { level: 'warn', stream: { write: (line) => void lines.push(JSON.parse(line)) } },
  })
  const client = createRedisClient(testRedisConnection())
  const keyPrefix = uniquePrefix('cb')
  t.after(async () => {
    await app.close()
    client.disconnect()
  })
  await app.register(metrics, { processMetrics: false, path: false })
  await app.register(cachePlugin, { redis: client, keyPrefix, ...options })
  await app.ready()
  return { app, lines, keyPrefix }
}

function counted<T>(value: () => T) {
  const loader = async () => {
    loader.calls++
    return value()
  }
  loader.calls = 0
  return loader
}

describe('values the serializer cannot hold', () => {
  test('a BigInt from the loader rejects every caller of the flight; nothing stored, the lease released, no Redis error counted', async (t) => {
    const { app, keyPrefix } = await cacheApp(t)
    const bigint = counted(() => ({ id: 1, balance: 10n }))
    const [first, joined] = await Promise.allSettled([
      app.cache.getOrLoad('account:1', bigint),
      app.cache.getOrLoad('account:1', bigint),
    ])
    assert.equal(bigint.calls, 1, 'one flight')
    assert.equal(first.status, 'rejected')
    assert.equal(joined.status, 'rejected')
    const err = (first as PromiseRejectedResult).reason
    assert.equal(
      (joined as PromiseRejectedResult).reason,
      err,
      'the waiter of the flight gets the same rejection',
    )
    assert.ok(err instanceof CacheValueNotJsonError && err instanceof TypeError)
    assert.equal(err.code, 'FRG_CACHE_VALUE_NOT_JSON')
    assert.equal(
      err.message,
      "cache: the value for 'account:1' cannot be stored: a bigint at .balance (convert it to a string or a number)",
    )
    assert.equal(await redis.exists(`${keyPrefix}{account:1}:v`), 0, 'nothing stored')
    assert.equal(await redis.exists(`${keyPrefix}{account:1}:l`), 0, 'the fill lease is released')
    assert.equal(await counter(app, 'cache_redis_errors_total', 'account'), 0)

    const fine = counted(() => ({ id: 1, balance: '10' }))
    assert.deepEqual(await app.cache.getOrLoad('account:1', fine), { id: 1, balance: '10' })
    assert.equal(fine.calls, 1, 'the next read loads')
    assert.equal(await counter(app, 'cache_lease_waits_total', 'account'), 0, 'without waiting for a lease')
    assert.deepEqual(await app.cache.get('account:1'), { id: 1, balance: '10' })
  })

  test('a cycle, undefined and a function are refused with what they are; set refuses them too', async (t) => {
    const { app, keyPrefix } = await cacheApp(t)
    const cyclic: { id: number; self?: unknown } = { id: 1 }
    cyclic.self = cyclic
    const cases: Array<[unknown, string]> = [
      [cyclic, 'a circular reference at .self'],
      [undefined, 'it is undefined (return or set null to cache "not found")'],
      [() => 1, 'it is a function'],
      [[1, 2n], 'a bigint at [1] (convert it to a string or a number)'],
    ]
    for (const [value, what] of cases) {
      const expected = {
        name: 'CacheValueNotJsonError',
        code: 'FRG_CACHE_VALUE_NOT_JSON',
        message: `cache: the value for 'item:1' cannot be stored: ${what}`,
      }
      await assert.rejects(
        app.cache.getOrLoad('item:1', async () => value),
        expected,
      )
      assert.throws(() => app.cache.set('item:1', value), expected)
    }
    // The key's generation (the fence) is created by the read itself; no value, no lease.
    assert.deepEqual(await redis.keys(`${keyPrefix}*`), [`${keyPrefix}{item:1}:g`])
  })

  test('a custom serialize that returns no string is refused the same way', async (t) => {
    const { app } = await cacheApp(t, { serialize: () => 42 as unknown as string })
    await assert.rejects(
      app.cache.getOrLoad('item:1', async () => 'x'),
      {
        code: 'FRG_CACHE_VALUE_NOT_JSON',
        message:
          "cache: the value for 'item:1' cannot be stored: serialize returned a number, expected a string",
      },
    )
  })
})

describe('serialize and deserialize', () => {
  const iso = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
  const revive = (payload: string) =>
    JSON.parse(payload, (_key, value) =>
      typeof value === 'string' && iso.test(value) ? new Date(value) : value,
    )
  const at = new Date('2026-01-02T03:04:05.678Z')

  test('a Date comes back from Redis as its ISO string by default, as a Date with a reviver-based deserialize', async (t) => {
    const plain = (await cacheApp(t)).app
    await plain.cache.getOrLoad('event:1', async () => ({ at }))
    const plainHit = counted(() => ({ at }))
    assert.deepEqual(await plain.cache.getOrLoad('event:1', plainHit), { at: at.toISOString() })
    assert.equal(plainHit.calls, 0, 'a hit from Redis')

    const { app } = await cacheApp(t, { deserialize: revive })
    await app.cache.getOrLoad('event:1', async () => ({ at }))
    const hit = counted(() => ({ at }))
    const value = (await app.cache.getOrLoad('event:1', hit)) as { at: Date }
    assert.equal(hit.calls, 0, 'a hit from Redis')
    assert.ok(value.at instanceof Date)
    assert.equal(value.at.getTime(), at.getTime())
    assert.ok(((await app.cache.get('event:1')) as { at: Date }).at instanceof Date)
  })
})

describe('keys', () => {
  test('an invalid key names itself (cut), its length and the pattern in words', async (t) => {
    const { app } = await cacheApp(t)
    const key = `account:${'9'.repeat(100)}`
    assert.throws(
      () => app.cache.getOrLoad(key, async () => 1),
      (err: CacheKeyInvalidError) => {
        assert.ok(err instanceof CacheKeyInvalidError && err instanceof TypeError)
        assert.equal(err.code, 'FRG_CACHE_KEY_INVALID')
        assert.equal(
          err.message,
          `cache: invalid key '${key.slice(0, 80)}…' (108 characters): a key is <namespace>:<id>, the namespace 1 to 32 characters of a-z, 0-9 and '-', starting with a letter, the id 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-' (no braces, no spaces)`,
        )
        return true
      },
    )
    await assert.rejects(app.cache.invalidate('account:1' as unknown as string[]), {
      code: 'FRG_CACHE_KEY_INVALID',
      message:
        "cache: `invalidate` takes an array of keys, got a string ('account:1'); for one key: `delete(key)`",
    })
  })
})

describe('strict options', () => {
  const rejects = async (options: Record<string, unknown>, expected: object) => {
    const app = Fastify()
    await assert.rejects(async () => {
      await app.register(cachePlugin, { redis, ...options })
      await app.ready()
    }, expected)
    await app.close()
  }

  test('unknown plugin options are refused with the valid ones, a did-you-mean or the bentocache name', async () => {
    await rejects(
      { ttl: 60_000 },
      (err: UnknownOptionError) =>
        err instanceof UnknownOptionError &&
        err.code === 'FRG_UNKNOWN_OPTION' &&
        err.option === 'ttl' &&
        err.validOptions.includes('ttlMs') &&
        err.message.startsWith(
          "cache plugin: unknown option `ttl`. bentocache's `ttl` is `ttlMs` here (milliseconds). Valid options: enabled, redis,",
        ),
    )
    await rejects(
      { grace: 1000 },
      { message: /bentocache's `grace` is the plugin option `staleWhileRevalidateMs`/ },
    )
    await rejects({ ttlMS: 1000 }, { code: 'FRG_UNKNOWN_OPTION', message: /Did you mean `ttlMs`\?/ })
    await rejects({ enabled: false, leaseWait: 10 }, { message: /Did you mean `leaseWaitMs`\?/ })
  })

  test('wrong values are refused: serialize, deserialize, flags and connectTimeoutMs', async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ serialize: 'json' }, "cache plugin: `serialize` must be a function, got a string ('json')"],
      [{ deserialize: null }, 'cache plugin: `deserialize` must be a function, got null'],
      [
        { sharedWithDurableData: 'yes' },
        "cache plugin: `sharedWithDurableData` must be true or false, got a string ('yes')",
      ],
      [{ connectTimeoutMs: -1 }, 'cache plugin: `connectTimeoutMs` must be an integer of at least 0, got -1'],
    ]
    for (const [options, message] of cases) await rejects(options, new InvalidOptionError(message))
  })

  test('per-call options of getOrLoad and set are checked for unknown keys too', async (t) => {
    const { app } = await cacheApp(t)
    assert.throws(() => app.cache.getOrLoad('item:1', async () => 1, { ttl: 1000 } as never), {
      name: 'UnknownOptionError',
      code: 'FRG_UNKNOWN_OPTION',
      message:
        "cache: getOrLoad options: unknown option `ttl`. bentocache's `ttl` is `ttlMs` here (milliseconds). Valid options: ttlMs, tags, softTimeoutMs, hardTimeoutMs, onLoadError, admit.",
    })
    assert.throws(() => app.cache.getOrLoad('item:1', async () => 1, { timeout: 50 } as never), {
      message: /bentocache's `timeout` is `softTimeoutMs` here/,
    })
    assert.throws(() => app.cache.set('item:1', 1, { tag: ['a'] } as never), {
      name: 'UnknownOptionError',
      message: 'cache: set options: unknown option `tag`. Did you mean `tags`? Valid options: ttlMs, tags.',
    })
    assert.throws(() => app.cache.set('item:1', 1, { hardTimeoutMs: 5 } as never), {
      message: /set options: unknown option `hardTimeoutMs`/,
    })
  })

  test('the disabled cache checks the key and options of getOrLoad as the enabled one does', async (t) => {
    const app = Fastify()
    t.after(() => app.close())
    await app.register(cachePlugin, { enabled: false })
    assert.throws(() => app.cache.getOrLoad('Item:1', async () => 1), { code: 'FRG_CACHE_KEY_INVALID' })
    assert.throws(() => app.cache.getOrLoad('item:1', async () => 1, { ttl: 5 } as never), {
      code: 'FRG_UNKNOWN_OPTION',
    })
    assert.equal(await app.cache.getOrLoad('item:1', async () => 1, { ttlMs: 5 }), 1)
  })
})

describe('route coverage', () => {
  const prefetch = () => 'item:1'

  test('a route with config.cache declared before the plugin: ready() refuses; declared after it: ready', async (t) => {
    for (const enabled of [true, false]) {
      const early = Fastify()
      t.after(() => early.close())
      early.get('/early', { config: { cache: { prefetch } } }, async () => 1)
      await early.register(cachePlugin, { redis, enabled, keyPrefix: uniquePrefix('cb') })
      await assert.rejects(async () => early.ready(), {
        code: 'FRG_ROUTE_NOT_PROTECTED',
        message: /route GET \/early has `config\.cache` but no cache plugin covers it/,
      })

      const late = Fastify()
      t.after(() => late.close())
      await late.register(cachePlugin, { redis, enabled, keyPrefix: uniquePrefix('cb') })
      late.get('/late', { config: { cache: { prefetch } } }, async () => 1)
      late.get('/plain', { config: { cache: {} } }, async () => 2)
      await late.ready()
      assert.equal((await late.inject('/late')).body, '1')
    }
  })
})

describe('Redis away', () => {
  test('connectTimeoutMs 0 does not wait at boot; reads go to the loader, logged with FRG_CACHE_UNAVAILABLE', async (t) => {
    const port = await freePort()
    const client = new Redis({ port, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => 200 })
    client.on('error', () => {})
    t.after(() => client.disconnect())
    const { app, lines } = await cacheApp(t, { redis: client, connectTimeoutMs: 0 })
    assert.equal(lines.filter((line) => /not ready at boot/.test(line.msg)).length, 0, 'no boot wait')
    const load = counted(() => 'from the source')
    assert.equal(await app.cache.getOrLoad('item:1', load), 'from the source')
    assert.equal(load.calls, 1)
    const failed = lines.find((line) => line.msg === 'cache read failed; loading from the source')
    assert.equal(failed?.err?.code, 'FRG_CACHE_UNAVAILABLE')
    assert.equal(await counter(app, 'cache_redis_errors_total', 'item'), 1)
  })
})
