import assert from 'node:assert/strict'
import Fastify from 'fastify'
import { CacheLoadTimeoutError } from 'fastify-redis-gateway'
import cache from 'fastify-redis-gateway/cache'
import { done, newRedis, prefix } from './assert-helpers.mjs'

const redis = newRedis()
const app = Fastify()
await app.register(cache, { redis, keyPrefix: prefix('cache'), ttlMs: 60_000 })
let loads = 0
app.get('/balance/:id', async (request) =>
  app.cache.getOrLoad(`balance:${request.params.id}`, async () => ({ id: request.params.id, load: ++loads })),
)

assert.deepEqual((await app.inject('/balance/7')).json(), { id: '7', load: 1 })
assert.deepEqual((await app.inject('/balance/7')).json(), { id: '7', load: 1 }, 'the second read is cached')
assert.equal(loads, 1)
assert.equal(await app.cache.invalidate(['balance:7']), true)
assert.deepEqual((await app.inject('/balance/7')).json(), { id: '7', load: 2 }, 'invalidated: loaded again')

// Tags: invalidating one tag drops every entry carrying it, and only those.
let productLoads = 0
const product = (id, tags) =>
  app.cache.getOrLoad(`product:${id}`, async () => ({ id, load: ++productLoads }), { tags })
assert.deepEqual(await product(1, ['catalog', 'shop:1']), { id: 1, load: 1 })
assert.deepEqual(await product(2, ['catalog', 'shop:2']), { id: 2, load: 2 })
assert.deepEqual(await product(1, ['catalog', 'shop:1']), { id: 1, load: 1 }, 'cached')
assert.equal(await app.cache.invalidateTags(['shop:1']), true)
assert.deepEqual(
  await product(1, ['catalog', 'shop:1']),
  { id: 1, load: 3 },
  'its tag invalidated: loaded again',
)
assert.deepEqual(await product(2, ['catalog', 'shop:2']), { id: 2, load: 2 }, 'another tag: still cached')
assert.equal(await app.cache.invalidateTags(['catalog']), true)
assert.deepEqual(await product(2, ['catalog', 'shop:2']), { id: 2, load: 4 }, 'the shared tag: loaded again')

// get, set, has, delete.
assert.equal(await app.cache.get('user:1'), undefined)
assert.equal(await app.cache.has('user:1'), false)
assert.equal(await app.cache.set('user:1', { name: 'Ada' }, { tags: ['team:1'] }), true)
assert.deepEqual(await app.cache.get('user:1'), { name: 'Ada' })
assert.equal(await app.cache.has('user:1'), true)
assert.deepEqual(await app.cache.getOrLoad('user:1', async () => assert.fail('set, so cached')), {
  name: 'Ada',
})
await app.cache.invalidateTags(['team:1'])
assert.equal(await app.cache.has('user:1'), false, 'set with a tag, dropped with it')
await app.cache.set('user:2', null)
assert.equal(await app.cache.get('user:2'), null, 'a cached "not found"')
assert.equal(await app.cache.delete('user:2'), true)
assert.equal(await app.cache.has('user:2'), false)
assert.throws(() => app.cache.get('not a key'), TypeError)

// A load slower than hardTimeoutMs fails the read with the exported error; the load still fills.
let finish
const slow = new Promise((resolve) => {
  finish = resolve
})
await assert.rejects(
  app.cache.getOrLoad('report:1', () => slow, { hardTimeoutMs: 20 }),
  (err) => err instanceof CacheLoadTimeoutError && err.key === 'report:1',
)
finish('ready')
let report
for (let i = 0; i < 100 && report === undefined; i++) {
  report = await app.cache.get('report:1')
  if (report === undefined) await new Promise((resolve) => setTimeout(resolve, 20))
}
assert.equal(report, 'ready', 'the timed-out load filled the entry')
await done('cache', app, redis)
