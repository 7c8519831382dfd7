import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import idempotency from '../../../src/plugins/idempotency/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit from '../../../src/plugins/rate-limit/index.ts'
import { rawClient, sentBy } from '../../../src/redis/client.ts'
import { delta, scrape } from '../../helpers/metrics-scrape.ts'

// A dedicated server: SCRIPT FLUSH would make every other suite on the shared Redis reload its scripts.
let server: Awaited<ReturnType<typeof startRedisServer>>
let client: Redis
let app: FastifyInstance
before(async () => {
  server = await startRedisServer()
  client = new Redis(server.url)
  // One client shared by two plugins, as a user passes their own client to each.
  app = Fastify({ logger: false })
  await app.register(metrics, { processMetrics: false })
  await app.register(rateLimit, {
    redis: client,
    policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 100, windowMs: 60_000 }],
  })
  await app.register(idempotency, { redis: client })
  app.post('/orders', { config: { idempotency: true } }, async () => ({ ok: true }))
  await app.ready()
})
after(async () => {
  await app?.close()
  client?.disconnect()
  await server?.stop()
})

const post = (key: string) =>
  app.inject({ method: 'POST', url: '/orders', headers: { 'idempotency-key': key }, payload: {} })

test('on one client shared by two plugins, each command is labelled by the plugin that sent it', async () => {
  // The server learns the scripts first (an EVALSHA answered NOSCRIPT and an EVAL each).
  assert.equal((await post('k0')).statusCode, 200)
  const before = await scrape(app)
  assert.equal((await post('k1')).statusCode, 200)
  const replay = await post('k1')
  assert.equal(replay.headers['idempotent-replayed'], 'true')
  const moved = delta(before, await scrape(app))
  const count = (labels: Record<string, string>) => moved('redis_command_duration_seconds_count', labels)
  // Two requests: two limit decisions, two claims and one completion.
  assert.equal(count({ client: 'rate-limit', command: 'script:rateLimitFixedWindow' }), 2)
  assert.equal(count({ client: 'idempotency', command: 'script:idempotencyClaim' }), 2)
  assert.equal(count({ client: 'idempotency', command: 'script:idempotencyComplete' }), 1)
  assert.equal(count({ client: 'rate-limit', command: 'script:idempotencyClaim' }), 0)
  assert.equal(count({ client: 'idempotency', command: 'script:rateLimitFixedWindow' }), 0)
})

test('a fresh start (SCRIPT FLUSH) reloads the scripts without counting an error', async () => {
  await client.script('FLUSH')
  const before = await scrape(app)
  assert.equal((await post('k2')).statusCode, 200)
  const moved = delta(before, await scrape(app))
  assert.equal(moved('redis_command_errors_total'), 0)
  // Each script's EVALSHA answered NOSCRIPT once and was sent again as EVAL.
  const reloads = (labels: Record<string, string>) => moved('redis_script_reloads_total', labels)
  assert.equal(reloads({ client: 'rate-limit', command: 'script:rateLimitFixedWindow' }), 1)
  assert.equal(reloads({ client: 'idempotency', command: 'script:idempotencyClaim' }), 1)
  assert.equal(reloads({ client: 'idempotency', command: 'script:idempotencyComplete' }), 1)
  assert.equal(reloads({}), 3)
})

test("a plugin's view is the client itself: its state, its events, pipelines and duplicate()", async () => {
  const view = sentBy(client, 'mine')
  assert.equal(rawClient(view), client)
  assert.equal(view.status, client.status)
  const before = await scrape(app)
  assert.equal(await view.ping(), 'PONG')
  const replies = await view.pipeline().ping().ping().exec()
  assert.deepEqual(replies, [
    [null, 'PONG'],
    [null, 'PONG'],
  ])
  const moved = delta(before, await scrape(app))
  // The view's commands, pipelined ones too, under its name; none under the client's.
  assert.equal(moved('redis_command_duration_seconds_count', { client: 'mine', command: 'ping' }), 3)
  assert.equal(moved('redis_command_duration_seconds_count', { client: 'rate-limit', command: 'ping' }), 0)
  // A duplicate is a client of its own, no view: it connects and answers.
  const copy = view.duplicate()
  try {
    assert.equal(rawClient(copy), copy)
    assert.equal(await copy.ping(), 'PONG')
  } finally {
    copy.disconnect()
  }
})
