import assert from 'node:assert/strict'
import Fastify from 'fastify'
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
await done('cache', app, redis)
