import assert from 'node:assert/strict'
import { createBloomFilter } from 'fastify-redis-gateway/bloom'
import { createDelayedQueue } from 'fastify-redis-gateway/delayed-queue'
import { createFeed } from 'fastify-redis-gateway/feed'
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

// The feed: a follow, a publish fanned out by a worker, and the follower's read.
const items = [{ id: 'post-1', producer: 'alice', at: Date.now() }]
const follows = new Map([['bob', ['alice']]])
const feedPrefix = prefix('feed')
const feed = createFeed(redis, {
  keyPrefix: feedPrefix,
  source: {
    followingOf: async (reader) => follows.get(reader) ?? [],
    followerCountsOf: async (producers) =>
      producers.map((p) => [...follows.values()].filter((f) => f.includes(p)).length),
    itemsOf: async (producers, { limit }) =>
      items.filter((item) => producers.includes(item.producer)).slice(0, limit),
  },
})
await feed.follow('bob', 'alice')
assert.deepEqual((await feed.read('bob')).items, items, 'rebuilt by pull from the source')
const next = { id: 'post-2', producer: 'alice', at: Date.now() + 1 }
items.unshift(next)
assert.deepEqual(await feed.publish(next), { fanout: true })
const fanout = feed.createFanoutWorker({ consumer: 'consumer-app', blockMs: 100 })
await fanout.start()
while ((await feed.fanoutLag()).entries > 0) await new Promise((r) => setTimeout(r, 20))
await fanout.stop()
assert.deepEqual((await feed.read('bob')).items, items)
const feedKeys = [
  feed.keys.fanout,
  ...['alice', 'bob'].flatMap((id) => [feed.keys.reader(id), feed.keys.producer(id)]),
]
for (const key of feedKeys.flatMap((k) => (typeof k === 'string' ? [k] : Object.values(k))))
  await redis.del(key)

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
