import assert from 'node:assert/strict'
import Fastify from 'fastify'
import idempotency from 'fastify-redis-gateway/idempotency'
import { done, newRedis, prefix } from './assert-helpers.mjs'

const redis = newRedis()
const app = Fastify()
await app.register(idempotency, { redis, keyPrefix: prefix('idem') })
let runs = 0
app.post('/orders', { config: { idempotency: true } }, async (request, reply) =>
  reply.code(201).send({ order: ++runs, item: request.body.item }),
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
await done('idempotency', app, redis)
