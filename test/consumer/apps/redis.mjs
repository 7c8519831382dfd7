import assert from 'node:assert/strict'
import { once } from 'node:events'
import Fastify from 'fastify'
import { rateLimit } from 'fastify-redis-gateway'
import redisPlugin, { createRedisClient } from 'fastify-redis-gateway/redis'
import { Redis } from 'ioredis'
import { prefix } from './assert-helpers.mjs'

// The redis plugin's client serves every plugin registered without `redis`; SCRIPT FLUSH is harmless.
const app = Fastify()
await app.register(redisPlugin, { url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' })
await app.register(rateLimit, {
  keyPrefix: prefix('rl'),
  policies: [{ name: 'ip', algorithm: 'sliding-log', limit: 2, windowMs: 60_000 }],
})
app.get('/', async () => 'ok')
assert.ok(app.redis instanceof Redis)
assert.equal((await app.inject('/')).statusCode, 200)
await app.redis.script('FLUSH')
assert.equal((await app.inject('/')).statusCode, 200)
assert.equal((await app.inject('/')).statusCode, 429)
await app.close()
// A client the plugin created is closed with the app (if it never ended, the process would exit 13 here).
if (app.redis.status !== 'end') await once(app.redis, 'end')
const own = createRedisClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' })
await own.connect() // created lazy: no offline queue, so nothing is sent before it connects
assert.equal(await own.ping(), 'PONG')
own.disconnect()
console.log('ok redis')
