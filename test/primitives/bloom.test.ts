import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { Cluster, Redis } from 'ioredis'
import { InvalidOptionError, RedisClientError, UnknownOptionError } from '../../src/plugins/common/errors.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import {
  BLOOM_MAX_BATCH,
  type BloomFilter,
  type BloomFilterOptions,
  BloomRebuildError,
  bloomSize,
  createBloomFilter,
} from '../../src/primitives/bloom.ts'
import { InvalidArgumentError } from '../../src/primitives/checks.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../helpers/index.ts'

// The Bloom filter on the suites' Redis (a Cluster under `npm run test:cluster`): no false negative
// for an added id, ever, including after its keys are lost; a false-positive rate near the one
// configured; one script call per shard per batch; rebuilds that readers never see half done.

const connection = testRedisConnection()
const redis = createRedisClient({ ...connection, commandTimeoutMs: 10_000 })
const prefix = uniquePrefix('bloom')
const filters: BloomFilter[] = []
before(() => connectRedis(redis))
after(async () => {
  await Promise.allSettled(filters.map((filter) => filter.destroy()))
  for (const key of await scanKeys(redis, prefix)) await redis.del(key)
  redis.disconnect()
})

const N = 20_000
const P = 0.01
let named = 0

/** A filter under this suite's prefix: 20,000 ids at 1 %, split over 3 shards of 64 Kibit unless told. */
function filter(options: Partial<BloomFilterOptions> = {}, client = redis): BloomFilter {
  const created = createBloomFilter(client, {
    key: `${prefix}f${named++}`,
    expectedItems: N,
    falsePositiveRate: P,
    maxBitsPerShard: 65_536,
    ...options,
  })
  filters.push(created)
  return created
}

const ids = (label: string, count: number, from = 0) =>
  Array.from({ length: count }, (_, i) => `${label}-${from + i}`)

/** `call` over `items` in batches of 1000, the answers concatenated in order. */
async function batched<T>(items: readonly string[], call: (batch: string[]) => Promise<T[]>): Promise<T[]> {
  const answers: T[] = []
  for (let at = 0; at < items.length; at += 1000) answers.push(...(await call(items.slice(at, at + 1000))))
  return answers
}

const count = <T>(values: readonly T[], value: T) => values.filter((v) => v === value).length

/** Deletes every key whose name starts with `start` (one DEL per key: they are on several slots). */
async function lose(start: string): Promise<number> {
  const keys = await scanKeys(redis, start)
  await Promise.all(keys.map((key) => redis.del(key)))
  return keys.length
}

/** A source that yields `items`, stopping before item `at` until `resume()`; `paused` resolves there. */
function pausing(items: readonly string[], at: number) {
  let resume!: () => void
  let reached!: () => void
  const resumed = new Promise<void>((resolve) => {
    resume = resolve
  })
  const paused = new Promise<void>((resolve) => {
    reached = resolve
  })
  async function* source() {
    for (let i = 0; i < items.length; i++) {
      if (i === at) {
        reached()
        await resumed
      }
      yield items[i]!
    }
  }
  return { source: source(), paused, resume }
}

const tagOf = (key: string) => /\{([^}]*)\}/.exec(key)?.[1]

test('sizes by m = ceil(-n ln p / (ln 2)^2) and k = round(m/n ln 2), split into shards of at most maxBitsPerShard', () => {
  for (const [n, p] of [
    [1_000_000, 0.1],
    [1_000_000, 0.01],
    [1_000_000, 0.001],
    [100_000_000, 0.01],
  ] as const) {
    const m = Math.ceil((-n * Math.log(p)) / Math.LN2 ** 2)
    const size = bloomSize(n, p)
    assert.equal(size.hashes, Math.round((m / n) * Math.LN2))
    assert.equal(size.shards, Math.ceil(m / (2 ** 26 - 64)))
    assert.ok(size.shards * size.shardBits >= m && size.shards * size.shardBits < m + size.shards * 8)
    assert.equal(size.keyBits, size.shardBits + 64)
    assert.ok(size.keyBits <= 2 ** 26 && size.keyBits % 8 === 0)
  }
  assert.deepEqual(
    [bloomSize(1_000_000, 0.1).hashes, bloomSize(1_000_000, 0.01).hashes, bloomSize(1_000_000, 0.001).hashes],
    [3, 7, 10],
  )
  const big = createBloomFilter(redis, {
    key: `${prefix}big`,
    expectedItems: 100_000_000,
    falsePositiveRate: 0.01,
  })
  assert.deepEqual([big.shards, big.hashes], [15, 7])
  assert.equal(big.bytes, (big.shards * (big.bits / big.shards + 64)) / 8)
})

test('no false negative over 20,000 ids (rebuilt and added), and a false-positive rate below 2p over 20,000 absent ids', async () => {
  const bloom = filter()
  const present = ids('user', N)
  const rebuilt = await bloom.rebuild(present.slice(0, N / 2))
  assert.equal(rebuilt.items, N / 2)
  const added = await batched(present.slice(N / 2), (batch) => bloom.add(batch))
  // A new id is "possibly new" unless its k bits all happened to be set already (a false positive).
  assert.ok(count(added, false) < 2 * P * N, `${count(added, false)} adds found all their bits set`)
  const answers = await batched(present, (batch) => bloom.check(batch))
  assert.equal(count(answers, 'maybe'), N)
  assert.equal(count(await batched(present, (batch) => bloom.mightContain(batch)), true), N)
  const absent = await batched(ids('nobody', N), (batch) => bloom.mightContain(batch))
  const rate = count(absent, true) / N
  assert.ok(rate < 2 * P, `false-positive rate ${rate} at p = ${P}`)
  // Adding again finds every bit set; single items answer single values.
  assert.deepEqual(await bloom.add(present.slice(0, 3)), [false, false, false])
  assert.equal(await bloom.mightContain(present[0]!), true)
  assert.equal(await bloom.check('nobody-1'), (await bloom.check(['nobody-1']))[0])
})

test('several shards: one key each, with a hash tag of its own, at the computed size, each holding its items', async () => {
  const bloom = filter()
  assert.equal(bloom.shards, 3)
  assert.equal(bloom.hashes, 7)
  await bloom.rebuild(ids('user', N))
  const shards = [0, 1, 2].map((shard) => bloom.keys(shard))
  const tags = shards.map((shard) => tagOf(shard.bits))
  assert.equal(new Set(tags).size, 3, `tags ${tags.join(', ')}`)
  for (const shard of shards) {
    assert.equal(tagOf(shard.building), tagOf(shard.bits), 'one slot per shard')
    assert.equal(tagOf(shard.rebuild), tagOf(shard.bits), 'one slot per shard')
    assert.equal(await redis.strlen(shard.bits), bloom.bytes / bloom.shards)
    assert.ok(bloom.bytes / bloom.shards <= 65_536 / 8)
  }
  assert.throws(() => bloom.keys(3), { code: 'FRG_INVALID_ARGUMENT' })
  // The hash spreads the items over the shards; each item's bits are all in its shard.
  const perShard = [0, 0, 0]
  for (const id of ids('user', 3000)) perShard[bloom.shardOf(id)]!++
  for (const n of perShard) assert.ok(n > 800 && n < 1200, `items per shard: ${perShard.join(', ')}`)
  // Exactly each shard's bits and rebuild state exist (the bits built were renamed over the bits).
  const keys = (await scanKeys(redis, `${bloom.key}:`)).sort()
  assert.deepEqual(keys, shards.flatMap((shard) => [shard.bits, shard.rebuild]).sort())
})

test('one script call per shard the batch touches, all sent together', async (t) => {
  const counter = connection.clusterNodes ? new Cluster(connection.clusterNodes) : new Redis(connection.url!)
  counter.on('error', () => {})
  type SendCommand = (this: Redis, command: { name: string; args: unknown[] }, stream?: unknown) => unknown
  const original = Redis.prototype.sendCommand as unknown as SendCommand
  const sent: Array<{ name: string; key: unknown }> = []
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, stream) {
    // EVALSHA sha numkeys key ...
    sent.push({ name: command.name, key: command.args[2] })
    return original.call(this, command, stream)
  }
  const bloom = createBloomFilter(counter, {
    key: `${prefix}counted`,
    expectedItems: N,
    falsePositiveRate: P,
    maxBitsPerShard: 65_536,
  })
  t.after(async () => {
    ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = original
    await bloom.destroy()
    counter.disconnect()
  })
  await bloom.rebuild(ids('user', 3000))
  // Every script already ran on every shard's node (EVALSHA finds them: no EVAL fallback below).
  await bloom.add(ids('warm', 300))
  await bloom.check(ids('warm', 300))
  const scripts = () => sent.filter((c) => c.name !== 'cluster' && c.name !== 'info')
  const bits = [0, 1, 2].map((shard) => bloom.keys(shard).bits)

  sent.length = 0
  await bloom.check(ids('user', 3000))
  assert.deepEqual(
    scripts().map((c) => c.name),
    ['evalsha', 'evalsha', 'evalsha'],
  )
  assert.deepEqual(
    scripts()
      .map((c) => c.key)
      .sort(),
    [...bits].sort(),
  )

  sent.length = 0
  await bloom.add(ids('more', 3000))
  assert.deepEqual(
    scripts().map((c) => c.name),
    ['evalsha', 'evalsha', 'evalsha'],
  )

  // A batch whose items all fall on shard 1 is one call, to shard 1.
  const onOne = ids('pick', 200).filter((id) => bloom.shardOf(id) === 1)
  sent.length = 0
  assert.equal(count(await bloom.mightContain(onOne), false), count(await bloom.check(onOne), 'absent'))
  assert.deepEqual(scripts(), [
    { name: 'evalsha', key: bits[1] },
    { name: 'evalsha', key: bits[1] },
  ])

  // One item: one call, to its shard.
  sent.length = 0
  assert.equal(await bloom.mightContain('user-7'), true)
  assert.deepEqual(scripts(), [{ name: 'evalsha', key: bits[bloom.shardOf('user-7')] }])
})

test('the largest batch at the most hashes (5000 items, k = 30) goes in one call per shard', async () => {
  const bloom = filter({ expectedItems: 5000, falsePositiveRate: 1e-9, maxBitsPerShard: 2 ** 26 })
  assert.deepEqual([bloom.hashes, bloom.shards], [30, 1])
  await bloom.rebuild([])
  const items = ids('wide', BLOOM_MAX_BATCH)
  assert.equal(count(await bloom.add(items), true), BLOOM_MAX_BATCH)
  assert.equal(count(await bloom.mightContain(items), true), BLOOM_MAX_BATCH)
  assert.equal(count(await bloom.check(ids('narrow', BLOOM_MAX_BATCH)), 'absent'), BLOOM_MAX_BATCH)
})

test('keys lost (never built, deleted, flushed): every id answers unknown, never absent, until a rebuild', async () => {
  const bloom = filter()
  const present = ids('user', N)
  assert.equal(await bloom.ready(), false)
  assert.equal(count(await batched(present, (batch) => bloom.check(batch)), 'unknown'), N)

  await bloom.rebuild(present)
  assert.equal(await bloom.ready(), true)
  assert.ok(count(await batched(ids('nobody', 5000), (batch) => bloom.check(batch)), 'absent') > 4800)

  // One shard's bits lost: that shard's items answer unknown, the others as before.
  await redis.del(bloom.keys(1).bits)
  const answers = await batched(present, (batch) => bloom.check(batch))
  present.forEach((id, i) => {
    assert.equal(answers[i], bloom.shardOf(id) === 1 ? 'unknown' : 'maybe', id)
  })
  assert.equal(await bloom.ready(), false)

  // Every key lost: nothing answers absent, an add stores nothing (it would not make the filter whole).
  assert.ok((await lose(`${bloom.key}:`)) >= 5)
  assert.equal(count(await batched(present, (batch) => bloom.mightContain(batch)), true), N)
  assert.equal(count(await batched(ids('nobody', N), (batch) => bloom.check(batch)), 'unknown'), N)
  assert.deepEqual(await bloom.add(['new-1', 'new-2']), [true, true])
  assert.deepEqual(await scanKeys(redis, `${bloom.key}:`), [])

  // The rebuild from the source of truth answers again.
  await bloom.rebuild(present)
  assert.equal(await bloom.ready(), true)
  assert.equal(count(await batched(present, (batch) => bloom.check(batch)), 'maybe'), N)
  const absent = await batched(ids('nobody', N), (batch) => bloom.mightContain(batch))
  assert.ok(count(absent, true) < 2 * P * N, `${count(absent, true)} false positives`)
})

test('a rebuild under way is never authoritative: readers answer unknown or from the old generation, adds made meanwhile are kept', async () => {
  // Never built: mid-rebuild, the half written so far and the rest both answer unknown.
  const fresh = filter()
  const users = ids('user', N)
  const first = pausing(users, N / 2)
  const building = fresh.rebuild(first.source)
  await first.paused
  for (const shard of [0, 1, 2]) assert.equal(await redis.exists(fresh.keys(shard).building), 1)
  assert.equal(count(await batched(users, (batch) => fresh.check(batch)), 'unknown'), N)
  assert.equal(await fresh.ready(), false)
  // Ids created while the source is being read: added to the generation being built.
  const late = ids('late', 500)
  assert.equal(count(await fresh.add(late), true), 500)
  first.resume()
  assert.equal((await building).items, N)
  assert.equal(count(await batched([...users, ...late], (batch) => fresh.check(batch)), 'maybe'), N + 500)

  // Built from set A, rebuilt from set B (A less the removed ids, plus new ones): until the switch
  // readers use A's generation; afterwards B's, and A's bits are gone.
  const removed = users.slice(0, 5000)
  const kept = users.slice(5000)
  const added = ids('new', 5000)
  const second = pausing([...kept, ...added], N - 5000)
  const rebuilding = fresh.rebuild(second.source)
  await second.paused
  assert.equal(count(await batched(removed, (batch) => fresh.check(batch)), 'maybe'), 5000)
  assert.ok(
    count(await batched(added, (batch) => fresh.check(batch)), 'absent') > 4800,
    'A does not know them',
  )
  const alsoLate = ids('late2', 300)
  await fresh.add(alsoLate)
  second.resume()
  await rebuilding
  for (const shard of [0, 1, 2]) assert.equal(await redis.exists(fresh.keys(shard).building), 0)
  assert.equal(
    count(await batched([...kept, ...added, ...alsoLate], (batch) => fresh.check(batch)), 'maybe'),
    N + 300,
  )
  // A removed id stays "maybe" only as a false positive now.
  assert.ok(count(await batched(removed, (batch) => fresh.mightContain(batch)), true) < 2 * P * 5000)
})

test('two rebuilds at once: the later one goes live, the earlier rejects with FRG_BLOOM_REBUILD_SUPERSEDED', async () => {
  const bloom = filter()
  const early = pausing(ids('early', 4000), 2000)
  const first = bloom.rebuild(early.source)
  await early.paused
  const second = await bloom.rebuild(ids('user', 3000))
  early.resume()
  await assert.rejects(first, (err: BloomRebuildError) => {
    assert.ok(err instanceof BloomRebuildError)
    assert.equal(err.code, 'FRG_BLOOM_REBUILD_SUPERSEDED')
    assert.deepEqual(err.shards, [0, 1, 2])
    assert.match(err.message, /overtaken by a later rebuild/)
    return true
  })
  assert.equal(second.items, 3000)
  for (const shard of [0, 1, 2]) assert.equal(await redis.exists(bloom.keys(shard).building), 0)
  assert.equal(await bloom.ready(), true)
  assert.equal(count(await bloom.check(ids('user', 3000)), 'maybe'), 3000)
})

test('a rebuild that loses its writes (state or bits gone midway) rejects with FRG_BLOOM_REBUILD_LOST and never goes live', async () => {
  // Every key gone midway (a flush): the next batch finds no rebuild under way.
  const flushed = filter()
  const one = pausing(ids('user', 4000), 2000)
  const first = flushed.rebuild(one.source)
  await one.paused
  await lose(`${flushed.key}:`)
  one.resume()
  await assert.rejects(first, { name: 'BloomRebuildError', code: 'FRG_BLOOM_REBUILD_LOST' })
  assert.equal(count(await flushed.check(ids('user', 4000)), 'unknown'), 4000)

  // Only the bits being built gone (their state left): the next batch finds them without the mark
  // the rebuild's start made, and stops rather than write a partial string.
  const partial = filter()
  const two = pausing(ids('user', 6000), 3000)
  const second = partial.rebuild(two.source)
  await two.paused
  for (const shard of [0, 1, 2]) await redis.del(partial.keys(shard).building)
  two.resume()
  await assert.rejects(second, (err: BloomRebuildError) => {
    assert.equal(err.code, 'FRG_BLOOM_REBUILD_LOST')
    assert.deepEqual(err.shards, [0, 1, 2])
    return true
  })
  assert.equal(count(await batched(ids('user', 6000), (batch) => partial.check(batch)), 'unknown'), 6000)
  assert.deepEqual(
    (await scanKeys(redis, `${partial.key}:`)).sort(),
    [0, 1, 2].map((shard) => partial.keys(shard).rebuild).sort(),
    'no bits written, only the rebuild state is left',
  )
})

test('a filter with other options answers unknown on the old keys until rebuilt; a rebuild to fewer shards drops the others', async () => {
  const three = filter()
  await three.rebuild(ids('user', 5000))
  const one = createBloomFilter(redis, { key: three.key, expectedItems: 5000, falsePositiveRate: P })
  assert.equal(one.shards, 1)
  assert.equal(count(await one.check(ids('user', 5000)), 'unknown'), 5000)
  assert.equal(count(await three.check(ids('user', 5000)), 'maybe'), 5000)

  await one.rebuild(ids('user', 5000))
  assert.equal(count(await one.check(ids('user', 5000)), 'maybe'), 5000)
  assert.equal(count(await three.check(ids('user', 5000)), 'unknown'), 5000)
  const shard = one.keys(0)
  assert.deepEqual((await scanKeys(redis, `${three.key}:`)).sort(), [shard.bits, shard.rebuild].sort())
})

test('options, items and sources are refused with coded errors before anything reaches Redis', async () => {
  const key = `${prefix}refused`
  const base = { key, expectedItems: 1000, falsePositiveRate: 0.01 }
  assert.throws(
    () => createBloomFilter(redis, { ...base, expectedItem: 10 } as never),
    (err: UnknownOptionError) => {
      assert.ok(err instanceof UnknownOptionError)
      assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
      assert.match(
        err.message,
        /^bloom filter: unknown option `expectedItem`\. Did you mean `expectedItems`\?/,
      )
      return true
    },
  )
  assert.throws(() => createBloomFilter(redis, { ...base, errorRate: 0.01 } as never), UnknownOptionError)
  const invalid: Array<[Partial<BloomFilterOptions>, RegExp]> = [
    [{ key: '' }, /`key` must be a string of 1 to 200 characters without \{ or \}, got a string/],
    [{ key: 'ids:{x}' }, /`key` must be .* without \{ or \}/],
    [{ expectedItems: 0 }, /`expectedItems` must be an integer from 1 to 10\^11, got 0/],
    [{ expectedItems: 1.5 }, /`expectedItems` .* got 1\.5/],
    [{ falsePositiveRate: 1 }, /`falsePositiveRate` must be a number from 1e-9 to 0\.5, got 1/],
    [{ falsePositiveRate: 0 }, /`falsePositiveRate` .* got 0/],
    [{ falsePositiveRate: Number.NaN }, /`falsePositiveRate` .* got NaN/],
    [{ maxBitsPerShard: 100 }, /`maxBitsPerShard` must be an integer from 1024 to 2\^32, got 100/],
    [
      { expectedItems: 1e11, falsePositiveRate: 1e-9 },
      /need \d+ shards .* more than 1024: raise `maxBitsPerShard`/,
    ],
  ]
  for (const [options, message] of invalid) {
    assert.throws(
      () => createBloomFilter(redis, { ...base, ...options }),
      (err: InvalidOptionError) => {
        assert.ok(err instanceof InvalidOptionError, String(err))
        assert.equal(err.code, 'FRG_INVALID_OPTION')
        assert.match(err.message, /^bloom filter: /)
        assert.match(err.message, message)
        return true
      },
    )
  }
  assert.throws(() => createBloomFilter('redis://127.0.0.1' as never, base), RedisClientError)
  assert.throws(() => createBloomFilter(redis, undefined as never), InvalidOptionError)

  const bloom = createBloomFilter(redis, base)
  const argument = (message: RegExp) => (err: InvalidArgumentError) => {
    assert.ok(err instanceof InvalidArgumentError && err instanceof TypeError, String(err))
    assert.equal(err.code, 'FRG_INVALID_ARGUMENT')
    assert.match(err.message, message)
    return true
  }
  await assert.rejects(bloom.add([42 as never]), argument(/an item must be a string, got (42|7)$/))
  await assert.rejects(bloom.check('x'.repeat(1025)), argument(/at most 1024 characters, got 1025/))
  await assert.rejects(
    bloom.mightContain(ids('x', BLOOM_MAX_BATCH + 1)),
    argument(/at most 5000 items per call, got 5001/),
  )
  await assert.rejects(bloom.add({ id: 'x' } as never), argument(/must be a string or an array/))
  await assert.rejects(bloom.rebuild(42 as never), argument(/source must be an iterable of items/))
  await assert.rejects(bloom.rebuild('abc' as never), argument(/source must be an iterable/))
  await assert.rejects(bloom.rebuild([], { batchSize: 0 }), {
    code: 'FRG_INVALID_OPTION',
    message: /rebuild: `batchSize` must be an integer from 1 to 5000, got 0/,
  })
  await assert.rejects(
    bloom.rebuild([], { batchsize: 10 } as never),
    (err: UnknownOptionError) =>
      err instanceof UnknownOptionError && /Did you mean `batchSize`/.test(err.message),
  )
  assert.deepEqual(await scanKeys(redis, key), [])

  // A source that yields something else midway: the rebuild rejects and its generation is dropped.
  async function* bad() {
    yield 'a'
    yield 7 as unknown as string
  }
  await assert.rejects(bloom.rebuild(bad()), argument(/an item must be a string, got (42|7)$/))
  assert.deepEqual(
    await Promise.all([bloom.keys(0).bits, bloom.keys(0).building].map((k) => redis.exists(k))),
    [0, 0],
  )
  await bloom.destroy()
  assert.deepEqual(await scanKeys(redis, key), [])
})
