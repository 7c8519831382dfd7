// The chain as a Fastify user registers it, on the bare route: the session plugin (its L1 on), a
// per-IP token bucket in buffered mode and the cache with an L1, on one ioredis client, in front of
// the same JSON and response schema as the bare and one-GET routes. Nothing else: no metrics, no
// logger, no Postgres (the balance's loader answers a constant), so its CPU beside the one-GET
// route's is what the three plugins cost. POST /login opens a session for the load's cookie.
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { cache, rateLimit, session } from '../../src/index.ts'
import { Account } from '../../src/routes/schemas.ts'

const SECRET = 'bench-secret-0123456789-abcdefghijklmnop'
const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
const app = Fastify({ logger: false })
app.addHook('onClose', async () => void (await redis.quit()))
await app.register(session, { redis, secrets: [SECRET], keyPrefix: 'bench:plugin-chain:sess:' })
await app.register(rateLimit, {
  redis,
  keyPrefix: 'bench:plugin-chain:rl:',
  // High enough never to refuse: the lease and heartbeat work is what is measured.
  policies: [
    {
      name: 'ip',
      algorithm: 'token-bucket',
      limit: 1_000_000_000,
      refillPerSecond: 1_000_000_000,
      sync: { intervalMs: 250, batch: 100 },
    },
  ],
})
await app.register(cache, { redis, keyPrefix: 'bench:plugin-chain:cache:', ttlMs: 60_000, l1TtlMs: 5_000 })

app.post('/login', { config: { rateLimits: false } }, async (_request, reply) => {
  await reply.regenerateSession('1')
  return { ok: true }
})
const balanceKey = (accountId: string) => `balance:${accountId}`
app.get<{ Params: { accountId: string } }>(
  '/accounts/:accountId/balance',
  {
    config: {
      session: 'required',
      cache: { prefetch: (request) => balanceKey((request.params as { accountId: string }).accountId) },
    },
    schema: { response: { 200: Account } },
  },
  async (request) => {
    const { accountId } = request.params
    const account = await app.cache.getOrLoad(balanceKey(accountId), async () => ({
      customerId: 1,
      currency: 'VND',
      balance: 100_000_000,
    }))
    if (account?.customerId !== Number(request.session!.principal)) throw new Error('not the owner')
    return { accountId: Number(accountId), currency: account.currency, balance: account.balance }
  },
)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)
