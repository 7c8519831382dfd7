import assert from 'node:assert/strict'
import { AsyncLocalStorage } from 'node:async_hooks'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { cache, idempotency, keyBy, rateLimit, session } from '../src/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../src/plugins/redis/index.ts'
import { cookieHeader, TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from './helpers/index.ts'

// The plugins' chain on one client, as an app registers it: sessions, a per-IP bucket for every
// route and a per-principal window on writes, Idempotency-Key on writes, cache-aside reads with
// prefetch. Round trips as the client lives them: a new one starts whenever a command is sent while
// none of the request's commands is in flight. Only the measured request's own commands count: its
// tally travels in its async context. (The demo gateway's chain, Postgres included, is counted in
// test/demo/round-trips.test.ts.)
interface Tally {
  roundTrips: number
  commands: number
  inFlight: number
}
const measured = new AsyncLocalStorage<Tally>()
type SendCommand = (this: Redis, command: { promise: Promise<unknown> }, stream?: unknown) => unknown
const original = Redis.prototype.sendCommand as unknown as SendCommand

let redis: RedisClient
let app: FastifyInstance
let cookie: string
const balances = new Map([
  ['1', 1_000_000],
  ['2', 1_000_000],
])

const balanceKey = (request: FastifyRequest) => `balance:${(request.params as { id: string }).id}`

before(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, stream) {
    const current = measured.getStore()
    if (current) {
      current.commands++
      if (current.inFlight++ === 0) current.roundTrips++
      const settled = () => {
        current.inFlight--
      }
      command.promise.then(settled, settled)
    }
    return original.call(this, command, stream)
  }
  // Created once sendCommand is wrapped: a client's write batching holds on to the method it found.
  // One Redis server, even under test:cluster: on a Cluster a request's keys live on several nodes,
  // each its own connection, and the counts below are those of one connection.
  redis = createRedisClient({ url: TEST_REDIS_URL })
  await connectRedis(redis)
  const prefix = uniquePrefix('rt')
  app = Fastify()
  await app.register(cache, { redis, keyPrefix: `${prefix}cache:` })
  await app.register(session, { redis, secrets: [TEST_SECRET], keyPrefix: `${prefix}sess:` })
  // Every limit high enough not to reject.
  await app.register(rateLimit, {
    redis,
    keyPrefix: `${prefix}rl:`,
    policies: [{ name: 'ip', algorithm: 'token-bucket', limit: 100_000, refillPerSecond: 100_000 }],
    namedPolicies: [
      {
        name: 'writes',
        algorithm: 'fixed-window',
        limit: 100_000,
        windowMs: 60_000,
        key: keyBy.customer,
        hook: 'preHandler',
      },
    ],
  })
  await app.register(idempotency, { redis, keyPrefix: `${prefix}idem:` })
  app.post('/login', { config: { rateLimits: false } }, async (_request, reply) => {
    await reply.regenerateSession('alice')
    return { ok: true }
  })
  app.get(
    '/balances/:id',
    { config: { session: 'required', cache: { prefetch: balanceKey } } },
    async (request) => ({
      balance: await app.cache.getOrLoad(balanceKey(request), async () =>
        balances.get((request.params as { id: string }).id),
      ),
    }),
  )
  // The invalidation starts in the handler and is awaited in the route's last onSend hook, after the
  // Idempotency-Key record is stored: both are in flight together (one round trip instead of two),
  // and the client still sees its response only once both are done.
  const invalidations = new WeakMap<FastifyRequest, Promise<boolean>>()
  // The idempotency plugin's onRoute hook (registered earlier) adds its onSend first: this one comes last.
  app.addHook('onRoute', (route) => {
    const awaitInvalidation = async (request: FastifyRequest) => {
      await invalidations.get(request)
    }
    if (route.url === '/moves') route.onSend = [route.onSend ?? []].flat().concat(awaitInvalidation)
  })
  app.post(
    '/moves',
    {
      config: {
        session: 'required',
        rateLimits: 'writes',
        idempotency: { required: true, onRedisError: 'open' },
      },
    },
    async (request, reply) => {
      const { from, to, amount } = request.body as { from: string; to: string; amount: number }
      balances.set(from, balances.get(from)! - amount)
      balances.set(to, balances.get(to)! + amount)
      invalidations.set(request, app.cache.invalidate([`balance:${from}`, `balance:${to}`]))
      return reply.code(201).send({ from, to, amount })
    },
  )
  await app.ready()
  cookie = cookieHeader((await app.inject({ method: 'POST', url: '/login' })).headers['set-cookie'])
})
after(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = original
  await app?.close()
  redis?.disconnect()
})

async function measure(run: () => PromiseLike<{ statusCode: number }>) {
  const tally: Tally = { roundTrips: 0, commands: 0, inFlight: 0 }
  // inject() returns a thenable that starts the request when its then() is called: called here,
  // inside the context (awaiting it would call then() from a microtask outside it, on Node 20).
  const response = await measured.run(tally, () => run().then((sent) => sent))
  return { status: response.statusCode, roundTrips: tally.roundTrips, commands: tally.commands }
}

test('a cached read through the whole chain: one Redis round trip', async () => {
  const read = () => app.inject({ url: '/balances/1', headers: { cookie } })
  await read()
  const cached = await measure(read)
  // The per-IP bucket and the entry's peek (GET), sent together; the session comes from the
  // session L1 (the first read loaded it; its idle expiry was slid at login, less than
  // touchAfterMs ago); the hit needs nothing more.
  assert.deepEqual(cached, { status: 200, roundTrips: 1, commands: 2 })
})

test('an idempotent write that invalidates two entries: at most four Redis round trips', async () => {
  const write = await measure(() =>
    app.inject({
      method: 'POST',
      url: '/moves',
      headers: { cookie, 'idempotency-key': randomUUID() },
      payload: { from: '1', to: '2', amount: 1 },
    }),
  )
  assert.equal(write.status, 201)
  assert.ok(write.roundTrips <= 4, `${write.roundTrips} round trips (${write.commands} commands)`)
})
