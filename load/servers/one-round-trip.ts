// The bare route plus one Redis round trip: the same JSON, read from Redis with a single GET on one
// ioredis client. No chain that waits on Redis once per request can beat it on the same machine.
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { Account } from '../../src/routes/schemas.ts'

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
const key = 'bench:one-round-trip:balance'
await redis.set(key, JSON.stringify({ currency: 'VND', balance: 100_000_000 }))
const app = Fastify({ logger: false })
app.addHook('onClose', async () => void (await redis.quit()))
app.get<{ Params: { accountId: string } }>(
  '/accounts/:accountId/balance',
  { schema: { response: { 200: Account } } },
  async (request) => {
    const { currency, balance } = JSON.parse((await redis.get(key))!) as { currency: string; balance: number }
    return { accountId: Number(request.params.accountId), currency, balance }
  },
)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)
