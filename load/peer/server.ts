// THE PEER STACK: the demo's balance route assembled from what a Fastify team would pick today,
// each library configured as its README recommends, on the same Redis and Postgres as the gateway:
//   @fastify/rate-limit with its Redis store (ioredis options from its example: connectTimeout 500,
//     maxRetriesPerRequest 1), global, high limit so nothing is rejected;
//   @fastify/session with connect-redis v10 on a node-redis v6 client (defaults: rolling sessions;
//     saveUninitialized false as connect-redis recommends; secure 'auto' since the bench is plain HTTP);
//   bentocache for the balance: the docs' multi-tier store (memory L1 + Redis L2 + Redis bus), or
//     Redis only with PEER_CACHE=redis.
// Business logic (queries, password check) is the gateway's own, so only the middleware differs.
// Env: REDIS_URL, DATABASE_URL (migrated and seeded by the gateway), SESSION_SECRET.
import fastifyCookie from '@fastify/cookie'
import rateLimit from '@fastify/rate-limit'
import fastifySession, { type FastifySessionObject } from '@fastify/session'
import { BentoCache, bentostore } from 'bentocache'
import { memoryDriver } from 'bentocache/drivers/memory'
import { redisBusDriver, redisDriver } from 'bentocache/drivers/redis'
import { RedisStore } from 'connect-redis'
import Fastify, { type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { createClient } from 'redis'
import { Type } from 'typebox'
import { createPgDatabase } from '../../src/db/database.ts'
import { findCustomerByUsername, getOwnAccount } from '../../src/ledger/ledger.ts'
import { verifyPassword } from '../../src/ledger/passwords.ts'
import { Account } from '../../src/routes/schemas.ts'

declare module 'fastify' {
  interface Session {
    customerId?: number
  }
}

// The gateway's own session plugin types `request.session` project-wide; this app uses @fastify/session's.
const sessionOf = (request: FastifyRequest) =>
  (request as unknown as { session: FastifySessionObject }).session

const redisUrl = new URL(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
const connection = { host: redisUrl.hostname, port: Number(redisUrl.port || 6379) }
const db = createPgDatabase({
  connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1/postgres',
})
let transactions = 0
db.observe?.({ transaction: () => void transactions++ })

const sessionClient = createClient({ url: redisUrl.toString() })
await sessionClient.connect()
const rateLimitClient = new Redis({ ...connection, connectTimeout: 500, maxRetriesPerRequest: 1 })

const l2 = redisDriver({ connection })
const bento = new BentoCache({
  default: 'balances',
  stores: {
    balances:
      process.env.PEER_CACHE === 'redis'
        ? bentostore().useL2Layer(l2)
        : bentostore()
            .useL1Layer(memoryDriver({ maxSize: '10mb' }))
            .useL2Layer(l2)
            .useBus(redisBusDriver({ connection })),
  },
})

const app = Fastify({ logger: false })
await app.register(rateLimit, { max: 1_000_000_000, timeWindow: '1 minute', redis: rateLimitClient })
await app.register(fastifyCookie)
await app.register(fastifySession, {
  secret: process.env.SESSION_SECRET ?? 'peer-stack-secret-0123456789-abcdefghij',
  store: new RedisStore({ client: sessionClient, prefix: 'peer:sess:' }),
  saveUninitialized: false,
  cookie: { secure: 'auto', httpOnly: true, sameSite: 'lax', maxAge: 30 * 60_000 },
})

app.post<{ Body: { username: string; password: string } }>(
  '/session',
  {
    schema: {
      body: Type.Object({ username: Type.String(), password: Type.String() }),
      response: { 200: Type.Object({ customerId: Type.Integer() }) },
    },
  },
  async (request, reply) => {
    const customer = await findCustomerByUsername(db, request.body.username)
    if (!(await verifyPassword(request.body.password, customer?.password_hash)) || !customer) {
      return reply.code(401).send()
    }
    await sessionOf(request).regenerate()
    sessionOf(request).set('customerId', customer.id)
    return { customerId: customer.id }
  },
)

app.get<{ Params: { accountId: string } }>(
  '/accounts/:accountId/balance',
  {
    schema: {
      params: Type.Object({ accountId: Type.String({ pattern: '^[1-9][0-9]{0,9}$' }) }),
      response: { 200: Account },
    },
  },
  async (request, reply) => {
    const customerId = sessionOf(request).get('customerId')
    if (!customerId) return reply.code(401).send()
    const accountId = Number(request.params.accountId)
    const account = await bento.getOrSet({
      key: `balance:${customerId}:${accountId}`,
      ttl: '1m',
      factory: () => getOwnAccount(db, customerId, accountId),
    })
    if (!account) return reply.code(404).send()
    return account
  },
)

app.get('/__bench/counters', async () => ({ dbQueries: db.queryCount, dbTransactions: transactions }))

const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', async () => {
  await app.close()
  await Promise.allSettled([bento.disconnectAll(), sessionClient.quit(), rateLimitClient.quit(), db.close()])
  process.exit(0)
})
console.log(`LISTENING ${url}`)
