import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import { InvalidationRetry } from '../../../src/plugins/cache/retry.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { signal } from './fixtures.ts'

const apps: FastifyInstance[] = []
const clients: RedisClient[] = []
after(async () => {
  await Promise.all(apps.map((app) => app.close()))
  for (const client of clients) client.disconnect()
})

function client(): RedisClient {
  const created = createRedisClient(testRedisConnection())
  clients.push(created)
  return created
}

async function cacheApp(options: CachePluginOptions): Promise<FastifyInstance> {
  const app = Fastify()
  await app.register(cachePlugin, { redis: options.redis ?? client(), ttlMs: 60_000, ...options })
  await app.ready()
  apps.push(app)
  return app
}

before(async () => {
  await Promise.all(clients.map(connectRedis))
})

test('a key that fails again while an older retry of it is in flight is retried after that retry succeeds', async (t) => {
  const app = await cacheApp({ keyPrefix: uniquePrefix('cretry') })
  let balance = 100
  const read = () => app.cache.getOrLoad('account:1', async () => balance)
  assert.equal(await read(), 100)

  // The retry's invalidations are real (the cache's own, on Redis); the test only holds back the
  // reply of the first one, as a slow network would, to interleave the second failure with it.
  const firstRan = signal()
  const firstReplies = signal()
  const secondRan = signal()
  let attempts = 0
  const retry = new InvalidationRetry(
    async (keys) => {
      if (!(await app.cache.invalidate(keys))) throw new Error('invalidation failed')
      attempts++
      if (attempts === 1) {
        firstRan.resolve()
        await firstReplies.promise
      } else secondRan.resolve()
    },
    60_000,
    app.log,
  )
  t.after(() => retry.close())
  // Commit 1; the route's invalidation fails and is queued.
  balance = 200
  retry.add(['account:1'])
  await firstRan.promise
  // The first retry has invalidated in Redis; a reader fills the entry from the source meanwhile.
  assert.equal(await read(), 200)
  // Commit 2; its invalidation fails too, while the first retry still waits for its reply.
  balance = 300
  retry.add(['account:1'])
  firstReplies.resolve()

  await Promise.race([secondRan.promise, sleep(5000, undefined, { ref: false })])
  assert.equal(attempts, 2, 'the newer failure was retried')
  assert.equal(await read(), 300, 'the balance is not stale until the TTL')
})

test('an invalidation published while the L1 subscriber is resubscribing does not leave the L1 stale', async () => {
  const keyPrefix = uniquePrefix('cl1')
  // The reader's subscriber connection is the test's: its SUBSCRIBE can be held back after a reconnect.
  const readerRedis = client()
  let hold: Promise<void> | undefined
  let lastSubscribe: Promise<unknown> | undefined
  let subscriber: RedisClient | undefined
  const duplicate = readerRedis.duplicate.bind(readerRedis) as () => RedisClient
  readerRedis.duplicate = (() => {
    subscriber = duplicate()
    const subscribe = subscriber.subscribe.bind(subscriber) as (...channels: string[]) => Promise<unknown>
    subscriber.subscribe = ((...channels: string[]) => {
      const held = hold
      lastSubscribe = held ? held.then(() => subscribe(...channels)) : subscribe(...channels)
      return lastSubscribe
    }) as typeof subscriber.subscribe
    return subscriber
  }) as typeof readerRedis.duplicate
  const reader = await cacheApp({ keyPrefix, redis: readerRedis, l1TtlMs: 60_000 })
  const writer = await cacheApp({ keyPrefix, l1TtlMs: 60_000 })
  let balance = 100
  const read = () => reader.cache.getOrLoad('account:7', async () => balance)
  // Subscribed at boot: reads are coherent and land in the L1.
  await lastSubscribe
  await sleep(0)
  assert.equal(await read(), 100)

  const subscribeReleased = signal()
  hold = subscribeReleased.promise
  const reconnected = new Promise((resolve) => subscriber!.once('ready', resolve))
  subscriber!.disconnect(true)
  await reconnected
  await sleep(0)
  // The subscriber is connected, its SUBSCRIBE not yet confirmed: a read goes to Redis (still 100).
  assert.equal(await read(), 100)
  // A change and its invalidation, published while the reader is not subscribed: it never arrives.
  balance = 200
  assert.equal(await writer.cache.invalidate(['account:7']), true)
  hold = undefined
  subscribeReleased.resolve()
  // Once subscribed again the L1 serves, and must not serve what was read before the subscription.
  await lastSubscribe
  await sleep(0)
  assert.equal(await read(), 200)
})
