import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify from 'fastify'
import { memoryStoreOf } from '../../../src/plugins/rate-limit/engine.ts'
import rateLimit, { type Algorithm, keyBy } from '../../../src/plugins/rate-limit/index.ts'
import { MemoryStore } from '../../../src/plugins/rate-limit/memory.ts'
import { runEncoded } from '../../../src/plugins/rate-limit/protocol.ts'
import { connectRedis, createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

// The memory store runs the scripts' logic in process. The algorithm suite runs against both stores
// (algorithms.test.ts); here: what only the memory store has (no Redis at all, bounded
// keys, sharing per key prefix), and the same calls made to the Lua scripts and to the memory
// store, step by step, answering the same.

let redis: RedisClient
before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(() => redis.disconnect())

test('store: memory needs no Redis at all: 429 after the limit, the same headers and problem', async (t) => {
  const app = Fastify()
  await app.register(rateLimit, {
    store: 'memory',
    keyPrefix: uniquePrefix('mem'),
    policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 3, windowMs: '1 minute' }],
  })
  app.get('/', async () => ({ ok: true }))
  await app.ready()
  t.after(() => app.close())
  assert.equal(app.hasDecorator('redis'), false, 'no redis plugin, no client')
  const statuses = []
  for (let i = 0; i < 4; i++) {
    const res = await app.inject('/')
    statuses.push(res.statusCode)
    assert.equal(res.headers['ratelimit-policy'], '"ip";q=3;w=60')
    assert.match(String(res.headers.ratelimit), new RegExp(`^"ip";r=${Math.max(0, 2 - i)};t=\\d+$`))
  }
  assert.deepEqual(statuses, [200, 200, 200, 429])
  const limited = await app.inject('/')
  assert.equal(limited.headers['content-type'], 'application/problem+json; charset=utf-8')
  assert.equal(limited.json().type, '/problems/rate-limited')
  assert.ok(Number(limited.headers['retry-after']) >= 59)
})

test('memory is bounded: a flood of identities keeps at most memoryMaxKeys keys, dropping the least recently used', async (t) => {
  const keyPrefix = uniquePrefix('mem')
  const app = Fastify()
  await app.register(rateLimit, {
    store: 'memory',
    keyPrefix,
    memoryMaxKeys: 100,
    policies: [
      { name: 'user', algorithm: 'sliding-log', limit: 2, windowMs: 60_000, key: keyBy.header('x-user') },
    ],
  })
  app.get('/', async () => 'ok')
  await app.ready()
  t.after(() => app.close())
  const store = memoryStoreOf(keyPrefix)!
  const as = (user: string) => app.inject({ url: '/', headers: { 'x-user': user } })
  // A client that keeps coming back stays recently used while 500 others pass by, 50 at a time.
  assert.equal((await as('regular')).statusCode, 200)
  for (let batch = 0; batch < 10; batch++) {
    await Promise.all(Array.from({ length: 50 }, (_, i) => as(`flood-${batch}-${i}`)))
    assert.ok(store.size <= 100, `${store.size} keys`)
    await as('regular')
  }
  assert.equal(store.size, 100)
  assert.equal((await as('regular')).statusCode, 429, 'the regular client kept its count')
  // The oldest of the flood were dropped: such a client starts afresh.
  assert.equal((await as('flood-0-0')).statusCode, 200)
})

test('expired keys are swept as Redis expires them', (t) => {
  let now = 1_000_000
  const store = new MemoryStore(1000, () => now)
  t.after(() => store.close())
  for (let i = 0; i < 50; i++) store.run('fixed-window', [`k${i}`], ['c', '', 5, 1000, 1, 0])
  store.run('token-bucket', ['bucket'], ['c', '', 5, 0.5, 1, 0])
  assert.equal(store.size, 51)
  now += 1000
  store.sweep()
  assert.deepEqual(store.keys(), ['bucket'], 'the windows ended; the bucket refills for 1000 ms more')
  now += 1000
  store.sweep()
  assert.equal(store.size, 0)
})

test('fixed-window refunds: one within its window gives back; one after a newer window opened gives nothing', async (t) => {
  const key = `${uniquePrefix('refund')}{k}`
  let now = 5_000_000
  const memory = new MemoryStore(100, () => now)
  // The same calls to both stores; Redis's clock moves by sleeping, the memory store's is set.
  const consume = async (advanceMs = 0) => {
    if (advanceMs > 0) await new Promise((r) => setTimeout(r, advanceMs))
    now += advanceMs
    const argv = ['c', '', 10, 60_000, 2, 0]
    const fromRedis = await runEncoded(redis, 'fixed-window', { keys: [key], argv })
    // Each store's TTL at the consume is the tag its refund carries.
    return { redis: fromRedis[3]!, memory: memory.run('fixed-window', [key], argv)[3]! }
  }
  const refund = async (tags: { redis: number; memory: number }) => {
    await runEncoded(redis, 'fixed-window', { keys: [key], argv: ['r', '', 10, 60_000, 2, tags.redis] })
    memory.run('fixed-window', [key], ['r', '', 10, 60_000, 2, tags.memory])
  }
  const counts = async () => ({ redis: Number(await redis.get(key)), memory: memory.inspect(key)?.n })
  t.after(async () => {
    memory.close()
    await redis.del(key)
  })
  await consume()
  const second = await consume(30)
  assert.ok(second.redis < 60_000 && second.memory < 60_000, 'the second consume came later in the window')
  assert.deepEqual(await counts(), { redis: 4, memory: 4 })
  await refund(second)
  assert.deepEqual(await counts(), { redis: 2, memory: 2 }, 'refunded within its window')
  // The window ends (here: a reset) and a newer one opens; a refund of a consume made 30 ms into
  // the old window must not take from it.
  const stale = await consume(30)
  await redis.del(key)
  memory.delete([key])
  await consume()
  await refund(stale)
  assert.deepEqual(await counts(), { redis: 2, memory: 2 }, 'the newer window kept its count')
})

test('plugin instances sharing a key prefix share the memory store, as they would share Redis keys', async (t) => {
  const keyPrefix = uniquePrefix('mem')
  const policy = { name: 'shared', algorithm: 'gcra', limit: 3, windowMs: 60_000 } as const
  const a = Fastify()
  const b = Fastify()
  for (const app of [a, b]) {
    await app.register(rateLimit, { store: 'memory', keyPrefix, policies: [policy] })
    app.get('/', async () => 'ok')
    await app.ready()
  }
  t.after(async () => {
    await a.close()
    assert.ok(memoryStoreOf(keyPrefix), 'kept while an instance uses it')
    await b.close()
    assert.equal(memoryStoreOf(keyPrefix), undefined, 'released with the last one')
  })
  const statuses = []
  for (let i = 0; i < 6; i++) statuses.push((await (i % 2 ? b : a).inject('/')).statusCode)
  assert.deepEqual(statuses, [200, 200, 200, 429, 429, 429])
})

test('one name under another algorithm has keys of its own (the algorithm is part of the key): both limit', async (t) => {
  const keyPrefix = uniquePrefix('mem')
  const app = Fastify()
  await app.register(rateLimit, { store: 'memory', keyPrefix })
  app.get(
    '/a',
    { config: { rateLimits: { name: 'x', algorithm: 'gcra', limit: 3, windowMs: 60_000 } } },
    () => 'ok',
  )
  await app.ready()
  const other = Fastify()
  await other.register(rateLimit, { store: 'memory', keyPrefix })
  other.get(
    '/b',
    { config: { rateLimits: { name: 'x', algorithm: 'sliding-log', limit: 3, windowMs: 60_000 } } },
    () => 'ok',
  )
  await other.ready()
  t.after(async () => {
    await app.close()
    await other.close()
  })
  const statuses = async (target: typeof app, url: string) => {
    const out = []
    for (let i = 0; i < 4; i++) out.push((await target.inject(url)).statusCode)
    return out
  }
  assert.deepEqual(await statuses(app, '/a'), [200, 200, 200, 429])
  assert.deepEqual(await statuses(other, '/b'), [200, 200, 200, 429])
  assert.deepEqual(
    memoryStoreOf(keyPrefix)!
      .keys()
      .map((key) => key.slice(key.indexOf('}:') + 2))
      .sort(),
    ['x:gcra', 'x:sliding-log'],
  )
})

/** A small deterministic generator, so a failing sequence can be replayed. */
function prng(seed: number) {
  let s = seed >>> 0
  return () => {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

async function redisTime(): Promise<number> {
  const [seconds, micros] = await redis.time()
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000)
}

describe('the memory store answers every script call as the Lua script does', () => {
  // Long windows and slow refills: the milliseconds between the two calls of a step change no
  // count. Times (reset, retry, delay) may differ by the time the script call took, everything
  // else is compared exactly.
  const params: Record<Algorithm, { limit: number; second: number; maxDelay: number[] }> = {
    'fixed-window': { limit: 4, second: 86_400_000, maxDelay: [0] },
    'sliding-log': { limit: 4, second: 86_400_000, maxDelay: [0] },
    'sliding-counter': { limit: 4, second: 86_400_000, maxDelay: [0] },
    'token-bucket': { limit: 4, second: 0.05, maxDelay: [0, 60_000] },
    gcra: { limit: 4, second: 86_400_000, maxDelay: [0, 30_000_000] },
    // The sliding log's script: a slot per member, its lease the window.
    concurrency: { limit: 4, second: 86_400_000, maxDelay: [0] },
  }
  for (const algorithm of Object.keys(params) as Algorithm[]) {
    test(`${algorithm}: 400 random calls (consume, peek, refund, several policies, blocks, resets)`, async (t) => {
      const random = prng(algorithm.length * 7919)
      const prefix = uniquePrefix('diff')
      let redisNow = 0
      let maxSlack = 1
      const seen = new Set<string>()
      const memory = new MemoryStore(10_000, () => redisNow)
      const { limit, second, maxDelay } = params[algorithm]
      const policies = [0, 1].map((p) => ({
        key: `${prefix}{k}:p${p}`,
        block: `${prefix}{k}:p${p}:block`,
        limit: limit + p * 2,
        second,
        maxDelay: maxDelay[p % maxDelay.length]!,
        blockMs: p === 0 ? 86_400_000 : 0,
      }))
      const refundable: Array<{
        argv: Array<string | number>
        keys: string[]
        memoryArgv: Array<string | number>
      }> = []
      t.after(async () => {
        memory.close()
        await redis.del(...policies.flatMap((p) => [p.key, p.block]))
      })
      for (let step = 0; step < 400; step++) {
        const roll = random()
        if (roll < 0.04) {
          // A reset: both stores lose the counters and blocks.
          const keys = policies.flatMap((p) => [p.key, p.block])
          await redis.del(...keys)
          memory.delete(keys)
          // A refund tells windows apart by TTL, to the millisecond; the memory store runs at the
          // time before the script, so a refund into a window opened since the consume could be
          // taken by one store and refused by the other at a millisecond edge. Refunds across a
          // reset are tested on their own (a newer window gives nothing back).
          refundable.length = 0
          continue
        }
        if (roll < 0.12 && refundable.length > 0) {
          const { keys, argv, memoryArgv } = refundable.splice(
            Math.floor(random() * refundable.length),
            1,
          )[0]!
          redisNow = await redisTime()
          const fromRedis = await runEncoded(redis, algorithm, { keys, argv })
          assert.deepEqual(memory.run(algorithm, keys, memoryArgv), fromRedis, `refund at step ${step}`)
          seen.add('refunded')
          continue
        }
        const op = roll < 0.25 ? 'p' : 'c'
        const used = random() < 0.5 ? [policies[0]!] : policies
        const withBlocks = random() < 0.5
        const nonce = `n${step}`
        const argv: Array<string | number> = [op, nonce]
        const keys: string[] = []
        for (const p of used) {
          const cost = 1 + Math.floor(random() * (p.limit + 1))
          argv.push(p.limit, p.second, cost, p.maxDelay)
          keys.push(p.key)
        }
        if (withBlocks)
          used.forEach((p, i) => {
            if (p.blockMs === 0) return
            keys.push(p.block)
            argv.push(i + 1, p.blockMs)
          })
        // The memory store runs at the Redis time before the script; the script ran by the time after.
        redisNow = await redisTime()
        const fromRedis = await runEncoded(redis, algorithm, { keys, argv })
        // Timestamps written at an earlier step carry that step's difference too.
        maxSlack = Math.max(maxSlack, (await redisTime()) - redisNow + 1)
        const slack = 2 * maxSlack
        const fromMemory = memory.run(algorithm, keys, argv)
        if (fromRedis[0] === 0) seen.add('rejected')
        if (fromRedis[1]! > 0) seen.add('delayed')
        if (withBlocks && fromRedis[4]! > 3_600_000 && fromRedis[2] === 0) seen.add('blocked')
        if (fromRedis[0] === 1 && op === 'c') seen.add('admitted')
        const label = `step ${step}: ${JSON.stringify(argv)} redis ${JSON.stringify(fromRedis)} memory ${JSON.stringify(fromMemory)}`
        assert.equal(fromMemory.length, fromRedis.length, label)
        assert.equal(fromMemory[0], fromRedis[0], `allowed, ${label}`)
        assert.ok(Math.abs(fromMemory[1]! - fromRedis[1]!) <= slack, `delay, ${label}`)
        used.forEach((_, i) => {
          const at = 2 + i * 4
          assert.equal(fromMemory[at], fromRedis[at], `remaining of policy ${i}, ${label}`)
          for (const offset of [1, 2, 3])
            assert.ok(
              Math.abs(fromMemory[at + offset]! - fromRedis[at + offset]!) <= slack,
              `field ${offset} of policy ${i}, ${label}`,
            )
        })
        if (op === 'c' && fromRedis[0] === 1 && used.length === 1) {
          // Refund what this consume took: the window tag each store gave back.
          const tagOf = (reply: number[]) =>
            algorithm === 'fixed-window' || algorithm === 'sliding-counter' ? reply[5]! : 0
          const base = ['r', nonce, argv[2]!, argv[3]!, argv[4]!]
          refundable.push({
            keys: [policies[0]!.key],
            argv: [...base, tagOf(fromRedis)],
            memoryArgv: [...base, tagOf(fromMemory)],
          })
        }
      }
      const expected = ['admitted', 'rejected', 'blocked', 'refunded']
      if (maxDelay.some((d) => d > 0)) expected.push('delayed')
      assert.deepEqual([...seen].sort(), expected.sort(), 'every path was taken')
      // Both stores hold the same keys with the same TTLs (to within the steps' time apart).
      for (const p of policies) {
        for (const key of [p.key, p.block]) {
          const ttl = await redis.pttl(key)
          const entry = memory.inspect(key)
          if (ttl < 0) assert.equal(entry, undefined, `${key} only in memory`)
          else assert.ok(entry && Math.abs(entry.exp - redisNow - ttl) <= 1000, `${key} TTL`)
        }
      }
    })
  }
})
