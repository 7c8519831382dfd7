// Our rate-limit plugin as a benchmark target: GET /limited/<algorithm> for each of the five
// algorithms, keyed by client IP, with a limit no run reaches, and GET /limited/shadow: the fixed
// window in shadow mode (decided and counted, never enforced). Env: REDIS_URL; REDIS_BATCH=off writes
// every script call on its own (to measure what write batching brings).
import Fastify from 'fastify'
import rateLimit, { type Algorithm, type RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'

const BENCH_LIMIT = 1_000_000_000
const BENCH_WINDOW_MS = 10_000

const redis = createRedisClient({
  url: process.env.REDIS_URL,
  batchWrites: process.env.REDIS_BATCH !== 'off',
})
await connectRedis(redis)
const app = Fastify({ logger: false })
await app.register(rateLimit, { redis })
const algorithms: Algorithm[] = ['fixed-window', 'sliding-log', 'sliding-counter', 'token-bucket', 'gcra']
for (const algorithm of algorithms) {
  const policy: RateLimitPolicy =
    algorithm === 'token-bucket'
      ? {
          name: algorithm,
          algorithm,
          limit: BENCH_LIMIT,
          refillPerSecond: BENCH_LIMIT / (BENCH_WINDOW_MS / 1000),
        }
      : algorithm === 'gcra'
        ? // GCRA's finest rate is 100 per ms of window (still never reached here).
          { name: algorithm, algorithm, limit: BENCH_WINDOW_MS * 100, windowMs: BENCH_WINDOW_MS }
        : { name: algorithm, algorithm, limit: BENCH_LIMIT, windowMs: BENCH_WINDOW_MS }
  app.get(`/limited/${algorithm}`, { config: { rateLimits: policy } }, async () => ({ ok: true }))
}
// Requests in flight: a slot taken and given back per request.
app.get(
  '/limited/concurrency',
  { config: { rateLimits: { name: 'concurrency', algorithm: 'concurrency', limit: BENCH_LIMIT } } },
  async () => ({ ok: true }),
)
app.get(
  '/limited/shadow',
  {
    config: {
      rateLimits: {
        name: 'shadow',
        algorithm: 'fixed-window',
        limit: BENCH_LIMIT,
        windowMs: BENCH_WINDOW_MS,
        shadow: true,
      },
    },
  },
  async () => ({ ok: true }),
)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
// Nothing to flush: exit at once, so a stop never waits on idle keep-alive sockets.
process.on('SIGTERM', () => process.exit(0))
console.log(`LISTENING ${url}`)
