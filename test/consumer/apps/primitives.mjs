import assert from 'node:assert/strict'
import { createBloomFilter } from 'fastify-redis-gateway/bloom'
import { createDelayedQueue } from 'fastify-redis-gateway/delayed-queue'
import { createLeaderboard } from 'fastify-redis-gateway/leaderboard'
import { createLock } from 'fastify-redis-gateway/lock'
import { createShardedCounter } from 'fastify-redis-gateway/sharded-counter'
import { appendOnce, createStreamConsumer } from 'fastify-redis-gateway/stream-consumer'
import { newRedis, prefix } from './assert-helpers.mjs'

// Each building block from its own subpath, on a plain client: its Lua ships in the package.
const redis = newRedis()

const lock = createLock(redis, { keyPrefix: prefix('lock') })
const held = await lock.acquire('job', 10_000)
assert.ok(held)
assert.equal(await lock.acquire('job', 10_000), null)
assert.equal(await lock.release(held), true)

const queue = createDelayedQueue(redis, { name: 'jobs', keyPrefix: prefix('dq'), instanceId: 'consumer-app' })
assert.equal(await queue.schedule('item-1', Date.now() - 1), true)
assert.equal(await queue.move(), 1)
assert.equal(await queue.take(), 'item-1')
assert.equal(await queue.ack('item-1'), true)

const stream = `${prefix('stream')}{s}`
const appended = await appendOnce(redis, {
  stream,
  marker: `${stream}:seen:1`,
  markerTtlMs: 60_000,
  fields: { n: '1' },
})
assert.equal(
  (await appendOnce(redis, { stream, marker: `${stream}:seen:1`, markerTtlMs: 60_000, fields: { n: '1' } }))
    .id,
  appended.id,
)
const seen = []
const consumer = createStreamConsumer(redis, {
  stream,
  group: 'g',
  consumer: 'c',
  blockMs: 100,
  handler: async (entry) => void seen.push(entry.fields.n),
})
await consumer.start()
while (seen.length === 0) await new Promise((r) => setTimeout(r, 20))
await consumer.stop()
assert.deepEqual(seen, ['1'])

const day = prefix('counter')
const counter = createShardedCounter(redis, { key: (shard) => `${day}{${shard}}`, shards: 4, ttlMs: 60_000 })
assert.equal(
  await counter.add([
    { id: 'e1', member: 'alice', counts: { n: 1 } },
    { id: 'e1', member: 'alice', counts: { n: 1 } },
  ]),
  1,
)
assert.deepEqual(await counter.read(), { counts: { n: 1 }, distinct: 1 })

const board = createLeaderboard(redis, { keyPrefix: prefix('lb') })
assert.equal(
  await board.add('week', [
    { id: 'e1', member: 'alice', amount: 5 },
    { id: 'e1', member: 'alice', amount: 5 },
  ]),
  1,
)
assert.deepEqual(await board.top('week', 10), [{ rank: 1, member: 'alice', score: 5 }])

// The Bloom filter answers `unknown` (maybe) until built, then from the built generation.
const ids = createBloomFilter(redis, {
  key: `${prefix('bloom')}ids`,
  expectedItems: 1000,
  falsePositiveRate: 0.01,
})
assert.deepEqual(await ids.check(['u1', 'u2']), ['unknown', 'unknown'])
async function* users() {
  yield* ['u1', 'u2', 'u3']
}
assert.equal((await ids.rebuild(users())).items, 3)
assert.equal(await ids.ready(), true)
assert.deepEqual(await ids.mightContain(['u1', 'u2', 'u3']), [true, true, true])
assert.deepEqual(await ids.add(['u4', 'u4']), [true, false])
assert.equal(await ids.mightContain('u4'), true)
await ids.destroy()

await redis.quit()
console.log('ok primitives')
