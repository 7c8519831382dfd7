import assert from 'node:assert/strict'
import { test } from 'node:test'
import Fastify from 'fastify'
import type { Cluster } from 'ioredis'
import { startRedisCluster } from '../../../scripts/redis-cluster.ts'
import idempotency, {
  IdempotencyKeyMismatchError,
  makeIdempotent,
} from '../../../src/plugins/idempotency/index.ts'
import redisPlugin, { createRedisClient } from '../../../src/plugins/redis/index.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { answerProblems } from '../../helpers/plain-app.ts'

test('claims, replays, conflicts and mismatches work unchanged on a three-master Redis Cluster, for routes and functions', async (t) => {
  const cluster = await startRedisCluster()
  const client = createRedisClient({ clusterNodes: cluster.nodes })
  const app = Fastify()
  t.after(async () => {
    await app.close()
    client.disconnect()
    await cluster.stop()
  })
  answerProblems(app)
  await app.register(redisPlugin, { redis: client })
  await app.register(idempotency, { keyPrefix: uniquePrefix('idem'), scope: () => 'one-principal' })
  let runs = 0
  app.post('/things', { config: { idempotency: true } }, async (request, reply) =>
    reply.code(201).send({ run: ++runs, body: request.body }),
  )
  await app.ready()
  const post = (key: string, payload: object) =>
    app.inject({ method: 'POST', url: '/things', headers: { 'idempotency-key': key }, payload })
  // Enough keys to land on every master's slots.
  const keys = Array.from({ length: 60 }, (_, i) => `cluster-key-${i}`)
  const firsts = await Promise.all(keys.map((key) => post(key, { key })))
  const replays = await Promise.all(keys.map((key) => post(key, { key })))
  for (let i = 0; i < keys.length; i++) {
    assert.equal(firsts[i]!.statusCode, 201)
    assert.deepEqual([replays[i]!.statusCode, replays[i]!.body], [201, firsts[i]!.body])
    assert.equal(replays[i]!.headers['idempotent-replayed'], 'true')
  }
  assert.equal(runs, keys.length)
  assert.equal((await post('cluster-key-0', { other: true })).statusCode, 422)
  // Functions wrapped with makeIdempotent use the same one-key scripts: no CROSSSLOT either.
  let calls = 0
  const job = makeIdempotent(async (id: string, amount: number) => ({ id, amount, call: ++calls }), {
    redis: client,
    keyPrefix: uniquePrefix('idemfn'),
    keyOf: (id) => id,
  })
  const ran = await Promise.all(keys.map((key, i) => job(key, i)))
  const again = await Promise.all(keys.map((key, i) => job(key, i)))
  assert.deepEqual(again, ran)
  assert.equal(calls, keys.length)
  await assert.rejects(job('cluster-key-0', 1), IdempotencyKeyMismatchError)
  const perMaster = await Promise.all((client as Cluster).nodes('master').map((node) => node.dbsize()))
  assert.ok(
    perMaster.every((n) => n > 0),
    `records on every master: ${perMaster.join(', ')}`,
  )
})
