import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import idempotency, {
  type IdempotencyContext,
  type IdempotencyPluginOptions,
  idempotencyKeyMismatch,
  requestFingerprint,
} from '../../../src/plugins/idempotency/index.ts'
import { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import {
  deleteKeys,
  scanKeys,
  TEST_REDIS_URL,
  testRedisConnection,
  uniquePrefix,
} from '../../helpers/index.ts'
import { answerProblems } from '../../helpers/plain-app.ts'
import { gate } from './fixtures.ts'

// `request.idempotency`, the plugin's decision, for each outcome: read by an onResponse hook (once
// everything is settled) and by a route's own onSend hook (where a rate limit's refund reads it).

interface DecisionApp {
  app: FastifyInstance
  prefix: string
  /** Per `x-probe` header: the decision as onResponse saw it, and its outcome as the route's onSend saw it. */
  seen: Map<string, { decision: IdempotencyContext | null; outcomeAtSend: string | undefined }>
  runs: () => number
  slow: ReturnType<typeof gate>
  started: ReturnType<typeof gate>
}

async function decisionApp(redis: RedisClient, options: Partial<IdempotencyPluginOptions> = {}) {
  const prefix = uniquePrefix('idemdec')
  const app = Fastify()
  answerProblems(app)
  await app.register(idempotency, { redis, keyPrefix: prefix, maxResponseBytes: 100, ...options })
  const seen: DecisionApp['seen'] = new Map()
  const atSend = new Map<string, string | undefined>()
  app.addHook('onResponse', async (request) => {
    const probe = String(request.headers['x-probe'])
    const decision = request.idempotency && { ...request.idempotency }
    seen.set(probe, { decision, outcomeAtSend: atSend.get(probe) })
  })
  let runs = 0
  const slow = gate()
  const started = gate()
  // A guard of the route's own, as a database row holding the key would be: it answers a key it
  // knows with a replay of its own, or with the plugin's mismatch problem for another body.
  const rows = new Map<string, { fingerprint: string; body: object }>()
  const route = {
    config: { idempotency: true },
    onSend: async (request: { headers: Record<string, unknown>; idempotency: IdempotencyContext | null }) => {
      atSend.set(String(request.headers['x-probe']), request.idempotency?.outcome)
    },
  }
  app.post<{ Body: { item: string } }>('/orders', route, async (request, reply) => {
    runs++
    if (request.body.item === 'slow') {
      started.open()
      await slow.opened
    }
    if (request.body.item === 'big') return reply.type('text/plain').send('x'.repeat(200))
    const { key, fingerprint } = request.idempotency!
    const row = rows.get(key)
    if (row && row.fingerprint !== fingerprint) throw idempotencyKeyMismatch()
    if (row) return reply.code(201).header('idempotent-replayed', 'true').send(row.body)
    const body = { order: runs, item: request.body.item }
    rows.set(key, { fingerprint, body })
    return reply.code(201).send(body)
  })
  await app.ready()
  return { app, prefix, seen, runs: () => runs, slow, started } satisfies DecisionApp
}

let probes = 0
async function post(t: DecisionApp, key: string | undefined, item: string) {
  const probe = String(++probes)
  const response = await t.app.inject({
    method: 'POST',
    url: '/orders',
    headers: { 'x-probe': probe, ...(key === undefined ? {} : { 'idempotency-key': key }) },
    payload: { item },
  })
  return { response, ...t.seen.get(probe)! }
}

const fingerprintOf = (item: string) => requestFingerprint('POST', '/orders', { item })

let redis: RedisClient
let t: DecisionApp
before(async () => {
  redis = createRedisClient(testRedisConnection())
  t = await decisionApp(redis)
})
after(async () => {
  await t.app.close()
  await redis.quit()
})

test('claimed, then replayed: the key, the fingerprint, and whether the response is kept', async () => {
  const first = await post(t, 'k1', 'book')
  assert.equal(first.response.statusCode, 201)
  assert.deepEqual(first.decision, {
    outcome: 'claimed',
    key: 'k1',
    fingerprint: fingerprintOf('book'),
    claimed: true,
    stored: true,
  })
  assert.equal(first.outcomeAtSend, 'claimed')
  const again = await post(t, '"k1"', 'book')
  assert.equal(again.response.headers['idempotent-replayed'], 'true')
  assert.deepEqual(again.decision, {
    outcome: 'replayed',
    key: 'k1',
    fingerprint: fingerprintOf('book'),
    claimed: false,
    stored: true,
  })
  assert.equal(again.outcomeAtSend, 'replayed')
})

test('a response over maxResponseBytes: claimed but not stored, and its replay is the 410', async () => {
  const first = await post(t, 'big-1', 'big')
  assert.equal(first.response.statusCode, 200)
  assert.deepEqual([first.decision?.outcome, first.decision?.stored], ['claimed', false])
  const again = await post(t, 'big-1', 'big')
  assert.equal(again.response.statusCode, 410)
  assert.deepEqual([again.decision?.outcome, again.decision?.stored], ['replayed', false])
})

test('mismatched: the key reused with another body', async () => {
  await post(t, 'k2', 'book')
  const other = await post(t, 'k2', 'pen')
  assert.equal(other.response.statusCode, 422)
  assert.deepEqual(other.decision, {
    outcome: 'mismatched',
    key: 'k2',
    fingerprint: fingerprintOf('pen'),
    claimed: false,
    stored: false,
  })
})

test('conflicted: the same request still running elsewhere', async () => {
  const running = post(t, 'k3', 'slow')
  await t.started.opened
  const second = await post(t, 'k3', 'slow')
  assert.equal(second.response.statusCode, 409)
  assert.deepEqual([second.decision?.outcome, second.decision?.claimed], ['conflicted', false])
  t.slow.open()
  assert.equal((await running).decision?.outcome, 'claimed')
})

test("the route's own guard: its replay and its mismatch are recorded before the route's onSend hooks", async () => {
  const runs = t.runs()
  await post(t, 'k4', 'book')
  // Redis lost the record; the guard still holds the key.
  await deleteKeys(redis, t.prefix)
  const replay = await post(t, 'k4', 'book')
  assert.equal(replay.response.headers['idempotent-replayed'], 'true')
  assert.deepEqual(replay.decision, {
    outcome: 'replayed',
    key: 'k4',
    fingerprint: fingerprintOf('book'),
    claimed: true,
    stored: true,
  })
  assert.equal(replay.outcomeAtSend, 'replayed')
  await deleteKeys(redis, t.prefix)
  const mismatch = await post(t, 'k4', 'pen')
  assert.equal(mismatch.response.statusCode, 422)
  assert.deepEqual(
    [mismatch.decision?.outcome, mismatch.decision?.claimed, mismatch.decision?.stored],
    ['mismatched', true, false],
  )
  assert.equal(mismatch.outcomeAtSend, 'mismatched')
  assert.deepEqual(await scanKeys(redis, t.prefix), [], "the guard's mismatch released the claim")
  assert.equal(t.runs(), runs + 3)
})

test('no decision without a valid key', async () => {
  for (const key of [undefined, '""']) {
    const refused = await post(t, key, 'book')
    assert.equal(refused.response.statusCode, 400)
    assert.equal(refused.decision, null)
  }
})

test("unavailable: the handler runs unclaimed ('open'), or 503 ('closed')", async (context) => {
  const down = new Redis(TEST_REDIS_URL, { enableOfflineQueue: false, maxRetriesPerRequest: 0 })
  const open = await decisionApp(down, { onRedisError: 'open' })
  const closed = await decisionApp(down, { onRedisError: 'closed' })
  context.after(async () => {
    await open.app.close()
    await closed.app.close()
  })
  down.disconnect()
  const ran = await post(open, 'k5', 'book')
  assert.equal(ran.response.statusCode, 201)
  assert.deepEqual(ran.decision, {
    outcome: 'unavailable',
    key: 'k5',
    fingerprint: fingerprintOf('book'),
    claimed: false,
    stored: false,
  })
  const refused = await post(closed, 'k5', 'book')
  assert.equal(refused.response.statusCode, 503)
  assert.deepEqual([refused.decision?.outcome, refused.decision?.claimed], ['unavailable', false])
})
