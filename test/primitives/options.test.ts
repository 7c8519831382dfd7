import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { Redis } from 'ioredis'
import { InvalidOptionError, RedisClientError, UnknownOptionError } from '../../src/plugins/common/errors.ts'
import { createBloomFilter } from '../../src/primitives/bloom.ts'
import { InvalidArgumentError } from '../../src/primitives/checks.ts'
import { createDelayedQueue } from '../../src/primitives/delayed-queue.ts'
import { createFeed } from '../../src/primitives/feed.ts'
import { createLeaderboard } from '../../src/primitives/leaderboard.ts'
import { createLock } from '../../src/primitives/lock.ts'
import { createShardedCounter } from '../../src/primitives/sharded-counter.ts'
import {
  appendEachOnce,
  appendJsonEntries,
  appendOnce,
  createStreamConsumer,
} from '../../src/primitives/stream-consumer.ts'
import { TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

// Every primitive refuses what it cannot use, before anything reaches Redis: an unknown key of an
// options object (a typo or another library's name would otherwise change nothing, in silence), a
// wrong value, and something that is not an ioredis client.

let redis: Redis
before(() => {
  redis = new Redis(TEST_REDIS_URL)
})
after(() => redis.quit())

const prefix = uniquePrefix('primopts')

function unknown(option: string, owner: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof UnknownOptionError, String(err))
    assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
    assert.equal(err.option, option)
    assert.match(err.message, owner)
    return true
  }
}

test('something that is not an ioredis client is a RedisClientError naming what was passed', () => {
  const url = 'redis://127.0.0.1:6379'
  const factories: Array<[string, () => unknown]> = [
    ['lock', () => createLock(url as never)],
    ['delayed queue', () => createDelayedQueue(url as never, { name: 'q' })],
    ['leaderboard', () => createLeaderboard(url as never)],
    [
      'bloom filter',
      () =>
        createBloomFilter(url as never, { key: `${prefix}b`, expectedItems: 10, falsePositiveRate: 0.01 }),
    ],
    ['sharded counter', () => createShardedCounter(url as never, { key: (s) => `${prefix}c:{${s}}` })],
    [
      'feed',
      () =>
        createFeed(url as never, {
          source: { followingOf: async () => [], followerCountsOf: async () => [], itemsOf: async () => [] },
        }),
    ],
    [
      'createStreamConsumer',
      () =>
        createStreamConsumer(url as never, {
          stream: 's',
          group: 'g',
          consumer: 'c',
          handler: async () => {},
        }),
    ],
  ]
  for (const [owner, create] of factories) {
    assert.throws(create, (err: RedisClientError) => {
      assert.ok(err instanceof RedisClientError, `${owner}: ${err}`)
      assert.equal(err.code, 'FRG_REDIS_CLIENT_INVALID')
      assert.match(
        err.message,
        new RegExp(`^${owner}: \`redis\` must be an ioredis client .*got a string \\('redis://`),
      )
      return true
    })
  }
})

test('delayed queue: unknown keys and wrong values of its options and of consume()', async () => {
  assert.throws(
    () => createDelayedQueue(redis, { name: 'q', visibilityTimeout: 5000 } as never),
    unknown(
      'visibilityTimeout',
      /^delayed queue: unknown option `visibilityTimeout`\. Did you mean `visibilityTimeoutMs`\?/,
    ),
  )
  assert.throws(() => createDelayedQueue(redis, { name: 'q', batch: 5000 }), {
    code: 'FRG_INVALID_OPTION',
    message: /`batch` must be an integer from 1 to 1000, got 5000/,
  })
  assert.throws(() => createDelayedQueue(redis, { name: 'q', onError: 'log' as never }), InvalidOptionError)
  assert.throws(() => createDelayedQueue(redis, undefined as never), InvalidOptionError)
  const queue = createDelayedQueue(redis, { name: 'q', keyPrefix: prefix })
  assert.throws(
    () => queue.consume(async () => {}, { concurency: 4 } as never),
    unknown('concurency', /Did you mean `concurrency`\?/),
  )
  await assert.rejects(queue.schedule('job', Number.NaN), (err: InvalidArgumentError) => {
    assert.ok(
      err instanceof InvalidArgumentError && err instanceof TypeError,
      'err instanceof InvalidArgumentError && err instanceof TypeError',
    )
    assert.equal(err.code, 'FRG_INVALID_ARGUMENT')
    return true
  })
  assert.equal(await redis.exists(queue.keys.delayed(queue.instanceId)), 0)
})

test('stream consumer: unknown keys and wrong values are refused before it connects', () => {
  const base = { stream: `${prefix}s`, group: 'g', consumer: 'c', handler: async () => {} }
  assert.throws(
    () => createStreamConsumer(redis, { ...base, maxRetries: 3 } as never),
    unknown('maxRetries', /^createStreamConsumer: unknown option `maxRetries`/),
  )
  assert.throws(() => createStreamConsumer(redis, { ...base, handleBatch: async () => {} }), {
    code: 'FRG_INVALID_OPTION',
    message: /`handler` .* or `handleBatch` .* not both/,
  })
  assert.throws(() => createStreamConsumer(redis, { ...base, visibilityTimeoutMs: 0 }), {
    code: 'FRG_INVALID_OPTION',
    message: /`visibilityTimeoutMs` must be an integer of 1 or more, got 0/,
  })
  assert.throws(() => createStreamConsumer(redis, { ...base, group: '' }), InvalidOptionError)
})

test('appendEachOnce, appendOnce and appendJsonEntries: unknown keys and wrong values append nothing', async () => {
  const stream = `${prefix}append`
  const entry = { marker: `${stream}:m`, fields: { a: '1' } }
  await assert.rejects(
    appendEachOnce(redis, { stream, markerTtlMs: 1000, maxlen: 10, entries: [entry] } as never),
    unknown('maxlen', /^appendEachOnce: unknown option `maxlen`\. Did you mean `maxLen`\?/),
  )
  await assert.rejects(
    appendEachOnce(redis, { stream, markerTtlMs: 1000, entries: [{ ...entry, feilds: {} }] } as never),
    unknown('feilds', /entries\[\]: unknown option `feilds`/),
  )
  await assert.rejects(
    appendOnce(redis, { stream, markerTtl: 1000, ...entry } as never),
    unknown('markerTtl', /Did you mean `markerTtlMs`\?/),
  )
  await assert.rejects(
    appendEachOnce(redis, { markerTtlMs: 1000, entries: [entry] }),
    (err: InvalidOptionError) =>
      err instanceof InvalidOptionError && /an entry has no stream/.test(err.message),
  )
  await assert.rejects(
    appendJsonEntries(redis, { stream, entries: '[]', maxLength: 5 } as never),
    unknown('maxLength', /^appendJsonEntries: unknown option `maxLength`/),
  )
  await assert.rejects(appendJsonEntries(redis, { stream, entries: [] as never }), InvalidOptionError)
  assert.equal(await redis.exists(stream), 0)
})

test('sharded counter and leaderboard: unknown keys of options and items are refused, nothing is counted', async () => {
  const key = (shard: number) => `${prefix}count:{${shard}}`
  assert.throws(
    () => createShardedCounter(redis, { key, shard: 4 } as never),
    unknown('shard', /Did you mean `shards`\?/),
  )
  assert.throws(() => createShardedCounter(redis, { key, shards: 0 }), {
    code: 'FRG_INVALID_OPTION',
    message: /`shards` must be an integer from 1 to 1024, got 0/,
  })
  const counter = createShardedCounter(redis, { key, shards: 2 })
  await assert.rejects(
    counter.add({ id: 'e1', count: { hits: 1 } } as never),
    unknown('count', /Did you mean `counts`\?/),
  )
  await assert.rejects(counter.add({ counts: { hits: 1.5 } }), {
    code: 'FRG_INVALID_ARGUMENT',
    name: 'TypeError',
  })
  assert.deepEqual((await counter.read()).counts, {})

  assert.throws(
    () => createLeaderboard(redis, { prefix: 'lb:' } as never),
    unknown('prefix', /^leaderboard: unknown option `prefix`/),
  )
  const board = createLeaderboard(redis, { keyPrefix: `${prefix}lb:` })
  await assert.rejects(
    board.add('week', [{ id: 'e1', member: 'm', amount: 5 }], { expiresAtMs: Date.now() + 60_000 } as never),
    unknown('expiresAtMs', /Did you mean `expireAtMs`\?/),
  )
  await assert.rejects(
    board.add('week', [{ id: 'e1', member: 'm', ammount: 5 } as never]),
    unknown('ammount', /Did you mean `amount`\?/),
  )
  await assert.rejects(
    board.add('week', [{ id: 'e1', member: 'm', amount: 5 }], { expireAtMs: 1.5 }),
    InvalidOptionError,
  )
  await assert.rejects(board.top('week', 0), { code: 'FRG_INVALID_ARGUMENT' })
  assert.deepEqual(await board.top('week', 10), [])
})
