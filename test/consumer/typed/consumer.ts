// Type-checked against the shipped .d.ts only: what a TypeScript user of the package writes.
import Fastify, { type RouteShorthandOptions } from 'fastify'
import {
  type AnyRedisClient,
  type BloomAnswer,
  type CachePluginOptions,
  cache,
  cacheKey,
  createBloomFilter,
  type Decision,
  GatewayError,
  type IdempotencyPluginOptions,
  idempotency,
  keyBy,
  makeIdempotent,
  metrics,
  type PrincipalFunction,
  type RateLimitPolicy,
  rateLimit,
  requireSession,
  type SessionRecord,
  session,
  UnknownOptionError,
} from 'fastify-redis-gateway'
import compatRateLimit from 'fastify-redis-gateway/compat/fastify-rate-limit'
import redisPlugin, { createRedisClient, type RedisClient } from 'fastify-redis-gateway/redis'
import { Redis } from 'ioredis'
import { Redis as Valkey } from 'iovalkey'

const client: RedisClient = new Redis()
const principal: PrincipalFunction = (request) => request.headers['x-user'] as string | undefined
const policy: RateLimitPolicy = {
  name: 'per-user',
  algorithm: 'gcra',
  limit: 10,
  windowMs: 1000,
  key: keyBy.customer,
  hook: 'preHandler',
  onRedisError: 'local',
}
const idem: IdempotencyPluginOptions = { redis: client, principal, onRedisError: 'open' }
const cached: CachePluginOptions = {
  redis: createRedisClient({ url: 'redis://127.0.0.1:6379' }),
  ttlMs: 5000,
}

const app = Fastify()
await app.register(redisPlugin, { redis: client })
await app.register(rateLimit, { namedPolicies: [policy], principal })
await app.register(idempotency, idem)
await app.register(session, { secrets: ['x'.repeat(32)], sameSite: 'strict' })
await app.register(cache, cached)
await app.register(metrics, { path: '/metrics' })

app.post('/pay', { config: { rateLimits: 'per-user', idempotency: { required: true } } }, async (request) => {
  const current: SessionRecord | null = request.session
  const balance: number | null = await app.cache.getOrLoad('balance:1', async () => 42)
  const decisions: Decision[] = await app.rateLimiter.peek(request, 'per-user')
  return { user: current?.principal ?? null, balance, remaining: decisions[0]?.remaining ?? null }
})
app.metrics.registry.contentType.toLowerCase()

const charge = makeIdempotent(
  async (orderId: string, cents: number) => ({ orderId, cents, at: Date.now() }),
  {
    redis: client,
    name: 'charge',
    keyOf: (orderId) => `charge:${orderId}`,
  },
)
const receipt: { orderId: string; cents: number; at: number } = await charge('o-1', 500)
receipt.orderId.toUpperCase()

// The README's snippets under `strict`: a required session read without a null check, and the
// library's coded errors told apart by class.
app.get('/me', { config: { session: 'required' } }, async (request) => ({
  user: requireSession(request).principal,
}))
try {
  await Fastify().register(rateLimit, { redis: client, policies: [policy], connectTimeoutMs: 0 })
} catch (err) {
  if (err instanceof UnknownOptionError) console.error(err.code, err.option, err.validOptions.join(', '))
  else if (err instanceof GatewayError) console.error(err.code)
}

// A Bloom filter from the root: overloads give one answer for one item, an array for an array.
const ids = createBloomFilter(client, { key: 'ids', expectedItems: 1_000_000, falsePositiveRate: 0.01 })
const one: BloomAnswer = await ids.check('42')
const many: boolean[] = await ids.mightContain(['42', '43'])
console.log(one, many.length, ids.bytes)

// An iovalkey client where an ioredis one goes, with no cast; a cache key built from any parts.
const valkey = new Valkey({ lazyConnect: true })
const onValkey: CachePluginOptions = { redis: valkey }
await Fastify().register(cache, onValkey)
await Fastify().register(session, { redis: valkey, secrets: ['x'.repeat(32)] })
const valkeyClient: AnyRedisClient = valkey
createBloomFilter(valkeyClient, { key: 'ids-vk', expectedItems: 1000, falsePositiveRate: 0.01 })
const reportKey: string = cacheKey('report', 'tenant/acme', 42)
console.log(reportKey.length)

// The @fastify/rate-limit drop-in with @fastify/rate-limit not installed: route options typed apart
// from the route keep `config.rateLimit`, with upstream's option types.
const legacy = Fastify()
await legacy.register(compatRateLimit, {
  max: 100,
  timeWindow: '1 minute',
  redis: client,
  connectTimeoutMs: 500,
})
const weekly: RouteShorthandOptions = { config: { rateLimit: { max: 3, timeWindow: '1 week' } } }
legacy.get('/weekly', weekly, async (request) => request.routeOptions.config.rateLimit !== false)
