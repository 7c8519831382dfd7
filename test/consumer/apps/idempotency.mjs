import assert from 'node:assert/strict'
import Fastify from 'fastify'
import { IdempotencyKeyMismatchError, makeIdempotent } from 'fastify-redis-gateway'
import idempotency, { makeIdempotent as fromSubpath } from 'fastify-redis-gateway/idempotency'
import { done, newRedis, prefix } from './assert-helpers.mjs'

const redis = newRedis()
const app = Fastify()
const replays = []
await app.register(idempotency, {
  redis,
  keyPrefix: prefix('idem'),
  onReplay: (_request, reply, replay) => {
    replays.push(replay.key)
    reply.header('x-replay-seen', 'yes')
  },
})
let runs = 0
app.post('/orders', { config: { idempotency: true } }, async (request, reply) =>
  reply.code(201).send({ order: ++runs, item: request.body.item }),
)

let formRuns = 0
app.post(
  '/form-orders',
  { config: { idempotency: { keyFrom: (request) => request.body.requestId } } },
  async () => ({
    order: ++formRuns,
  }),
)

const send = (item) =>
  app.inject({ method: 'POST', url: '/orders', headers: { 'idempotency-key': 'order-1' }, payload: { item } })
const first = await send('book')
assert.equal(first.statusCode, 201)
assert.equal(first.headers['idempotent-replayed'], undefined)
const again = await send('book')
assert.equal(again.statusCode, 201)
assert.equal(again.headers['idempotent-replayed'], 'true')
assert.deepEqual(again.json(), first.json())
const other = await send('pen')
assert.equal(other.statusCode, 422)
assert.equal(other.json().type, '/problems/idempotency-key-mismatch')
const missing = await app.inject({ method: 'POST', url: '/orders', payload: { item: 'x' } })
assert.equal(missing.statusCode, 400)
assert.equal(runs, 1)
assert.deepEqual(replays, ['order-1'])

// keyFrom: a client that cannot send the header puts the key in the body.
const sendForm = (requestId) =>
  app.inject({ method: 'POST', url: '/form-orders', payload: { requestId, item: 'lamp' } })
const byBody = await sendForm('form-1')
const byBodyAgain = await sendForm('form-1')
assert.equal(byBody.statusCode, 200)
assert.equal(byBodyAgain.headers['idempotent-replayed'], 'true')
assert.equal(byBodyAgain.headers['x-replay-seen'], 'yes')
assert.equal(byBodyAgain.body, byBody.body)
assert.equal((await sendForm(undefined)).statusCode, 400)
assert.equal((await sendForm('not a key')).statusCode, 400)
assert.equal(formRuns, 1)

// makeIdempotent: any async function, one run per key.
assert.equal(fromSubpath, makeIdempotent)
let charges = 0
const charge = makeIdempotent(async (orderId, amount) => ({ chargeId: `ch_${++charges}`, orderId, amount }), {
  redis,
  keyPrefix: prefix('idemfn'),
  name: 'charge',
  keyOf: (orderId) => orderId,
})
const [one, two] = await Promise.all([charge('o-1', 500), charge('o-1', 500)])
assert.deepEqual(one, { chargeId: 'ch_1', orderId: 'o-1', amount: 500 })
assert.deepEqual(two, one)
assert.deepEqual(await charge('o-1', 500), one)
await assert.rejects(charge('o-1', 600), IdempotencyKeyMismatchError)
assert.equal(charges, 1)
await done('idempotency', app, redis)
