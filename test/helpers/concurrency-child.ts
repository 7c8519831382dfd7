import Fastify from 'fastify'
import rateLimit from '../../src/plugins/rate-limit/index.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import { testRedisConnection } from './index.ts'

// A process the concurrency tests SIGKILL while it holds slots: `/` takes one slot of the
// `exports` policy (limit and lease from CHILD_LIMIT and CHILD_LEASE_MS, keys under CHILD_PREFIX)
// and never answers. It prints its URL, then one line per request it holds.

const redis = createRedisClient(testRedisConnection())
await connectRedis(redis)
const app = Fastify()
await app.register(rateLimit, { redis, keyPrefix: process.env.CHILD_PREFIX! })
app.get(
  '/',
  {
    config: {
      rateLimits: [
        {
          name: 'exports',
          algorithm: 'concurrency',
          limit: Number(process.env.CHILD_LIMIT),
          leaseMs: Number(process.env.CHILD_LEASE_MS),
          key: (request) => `customer:${String(request.headers['x-customer'])}`,
        },
      ],
    },
  },
  async () => {
    console.log('holding')
    return new Promise(() => {})
  },
)
console.log(await app.listen({ port: 0, host: '127.0.0.1' }))
