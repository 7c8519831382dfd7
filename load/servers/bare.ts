// The floor every stack is measured against: Fastify answering the balance route's path with the
// same JSON and the same response schema, and nothing else (no Redis, no Postgres, no plugins).
import Fastify from 'fastify'
import { Account } from '../../src/routes/schemas.ts'

const app = Fastify({ logger: false })
app.get<{ Params: { accountId: string } }>(
  '/accounts/:accountId/balance',
  { schema: { response: { 200: Account } } },
  async (request) => ({ accountId: Number(request.params.accountId), currency: 'VND', balance: 100_000_000 }),
)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)
