// The peers as benchmark targets, each used as its README shows, on the same ioredis client options
// as ours but without our write batching (a plain ioredis client, as their users have): PEER=fastify-rate-limit (@fastify/rate-limit, global, Redis store) or
// PEER=rate-limiter-flexible (RateLimiterRedis consumed in an onRequest hook, keyed by IP), and our
// drop-in, PEER=compat (fastify-redis-gateway/compat/fastify-rate-limit, registered with the very
// options @fastify/rate-limit gets).
// Same route shape, key and limit as load/servers/rate-limit-ours.ts. Env: REDIS_URL, PEER.
import fastifyRateLimit from '@fastify/rate-limit'
import Fastify from 'fastify'
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible'
import compatRateLimit from '../../src/compat/fastify-rate-limit.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'

const LIMIT = 1_000_000_000
const WINDOW_MS = 10_000

const redis = createRedisClient({ url: process.env.REDIS_URL, batchWrites: false })
await connectRedis(redis)
const app = Fastify({ logger: false })
if (process.env.PEER === 'fastify-rate-limit') {
  await app.register(fastifyRateLimit, { redis, max: LIMIT, timeWindow: WINDOW_MS })
} else if (process.env.PEER === 'compat') {
  await app.register(compatRateLimit, { redis, max: LIMIT, timeWindow: WINDOW_MS })
} else if (process.env.PEER === 'rate-limiter-flexible') {
  const limiter = new RateLimiterRedis({ storeClient: redis, points: LIMIT, duration: WINDOW_MS / 1000 })
  app.addHook('onRequest', async (request, reply) => {
    try {
      await limiter.consume(request.ip)
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) throw err
      return reply.code(429).send({ error: 'Too Many Requests' })
    }
  })
} else {
  throw new Error('PEER must be fastify-rate-limit, compat or rate-limiter-flexible')
}
app.get('/limited/peer', async () => ({ ok: true }))
const url = await app.listen({ port: 0, host: '127.0.0.1' })
// Nothing to flush: exit at once, so a stop never waits on idle keep-alive sockets.
process.on('SIGTERM', () => process.exit(0))
console.log(`LISTENING ${url}`)
