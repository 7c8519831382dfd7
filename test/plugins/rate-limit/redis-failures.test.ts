import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { type RedisServerProcess, startRedisServer } from '../../../src/embedded/redis-server.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit from '../../../src/plugins/rate-limit/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { keysWithoutTtl, listen, scanKeys } from '../../helpers/index.ts'

// Each failure mode against a dedicated redis-server that this test stops, pauses and restarts
// (never the shared one). Every fetch carries an abort deadline: a hung request fails the test.
let server: RedisServerProcess
let redis: RedisClient
let app: FastifyInstance
let url: string

before(async () => {
  server = await startRedisServer()
  redis = createRedisClient({ url: server.url, commandTimeoutMs: 200 })
  await connectRedis(redis)
  app = Fastify()
  await app.register(metrics, { path: '/metrics', processMetrics: false })
  await app.register(rateLimit, { redis, keyPrefix: 'rl:', retryRedisAfterMs: 200 })
  const policy = (name: string, onRedisError: 'open' | 'closed' | 'local') => ({
    name,
    algorithm: 'fixed-window' as const,
    limit: 4,
    windowMs: 60_000,
    onRedisError,
    localShare: 0.5,
  })
  app.get('/open', { config: { rateLimits: policy('f-open', 'open') } }, async () => 'ok')
  app.get('/closed', { config: { rateLimits: policy('f-closed', 'closed') } }, async () => 'ok')
  app.get('/local', { config: { rateLimits: policy('f-local', 'local') } }, async () => 'ok')
  url = await listen(app)
})

after(async () => {
  await app.close()
  redis.disconnect()
  await server.stop()
})

async function get(path: string) {
  const res = await fetch(`${url}${path}`, { signal: AbortSignal.timeout(3000) })
  const body = await res.text()
  return {
    status: res.status,
    policy: res.headers.get('ratelimit-policy'),
    limit: res.headers.get('ratelimit'),
    res,
    body,
  }
}

const ready = async () => {
  const deadline = Date.now() + 10_000
  while (redis.status !== 'ready') {
    assert.ok(Date.now() < deadline, 'client reconnected')
    await new Promise((r) => setTimeout(r, 50))
  }
  await new Promise((r) => setTimeout(r, 250))
}

test('Redis up: every policy limits through Redis', async () => {
  for (const path of ['/open', '/closed', '/local']) {
    const r = await get(path)
    assert.equal(r.status, 200)
    assert.match(r.limit!, /;r=3;/)
  }
})

test('Redis stopped: open allows without claiming a quota, closed answers 503, local limits with its share', async () => {
  await server.stop()
  for (let i = 0; i < 6; i++) {
    const r = await get('/open')
    assert.equal(r.status, 200)
    assert.equal(r.policy, '"f-open";q=4;w=60')
    assert.equal(r.limit, null, 'no remaining quota is claimed when nothing is known')
  }
  const closed = await get('/closed')
  assert.equal(closed.status, 503)
  assert.equal(closed.res.headers.get('retry-after'), '1')
  assert.equal(JSON.parse(closed.body).type, '/problems/rate-limit-unavailable')
  assert.equal(JSON.parse(closed.body).policy, 'f-closed')

  const local = [await get('/local'), await get('/local'), await get('/local')]
  assert.deepEqual(
    local.map((r) => r.status),
    [200, 200, 429],
  )
  assert.equal(local[0]!.policy, '"f-local";q=2;w=60', 'the local share is what is advertised')
  assert.match(local[0]!.limit!, /^"f-local";r=1;t=\d+$/)
  assert.equal(JSON.parse(local[2]!.body).policy, 'f-local')

  const text = await (await fetch(`${url}/metrics`)).text()
  assert.match(text, /policy="f-open",outcome="degraded_open"\} 6/)
  assert.match(text, /policy="f-closed",outcome="degraded_closed"\} 1/)
  assert.match(text, /policy="f-local",outcome="degraded_local_rejected"\} 1/)
})

test('Redis back: limiting resumes through Redis', async () => {
  server = await startRedisServer(server.port)
  await ready()
  const statuses = []
  for (let i = 0; i < 5; i++) {
    const r = await get('/open')
    statuses.push(r.status)
    if (r.status === 200) assert.match(r.limit!, new RegExp(`;r=${3 - i};`))
  }
  assert.deepEqual(statuses, [200, 200, 200, 200, 429])
  assert.equal((await get('/closed')).status, 200)
})

test('Redis stalled (CLIENT PAUSE): the command timeout decides, the request does not hang', async () => {
  const admin = new Redis(server.url)
  await admin.call('CLIENT', 'PAUSE', '1500', 'ALL')
  admin.disconnect()
  const open = await get('/open')
  assert.equal(open.status, 429, 'the over-limit cache still answers for a key known to be over')
  const closed = await get('/closed')
  assert.equal(closed.status, 503)
  const local = await get('/local')
  assert.equal(local.status, 429, 'the local limiter kept its count from the outage before')
  assert.equal(local.policy, '"f-local";q=2;w=60')
  await new Promise((r) => setTimeout(r, 1600))
  await ready()
  assert.equal((await get('/closed')).status, 200)
})

test('every key on the dedicated Redis has a TTL', async () => {
  assert.ok((await scanKeys(redis, 'rl:')).length >= 2)
  assert.deepEqual(await keysWithoutTtl(redis, 'rl:'), [])
})

test('a client with an offline queue (ioredis defaults) never makes a request wait for a dead Redis', async (t) => {
  // Nothing defined on the client: the plugin runs its scripts on any ioredis client.
  const client = new Redis(server.url)
  client.on('error', () => {})
  await connectRedis(client)
  const other = Fastify()
  await other.register(rateLimit, { redis: client, keyPrefix: 'rl:' })
  other.get(
    '/x',
    { config: { rateLimits: { name: 'queued', algorithm: 'gcra', limit: 5, windowMs: 60_000 } } },
    async () => 'ok',
  )
  const otherUrl = await listen(other)
  t.after(async () => {
    await other.close()
    client.disconnect()
    server = await startRedisServer(server.port)
  })
  assert.equal((await fetch(`${otherUrl}/x`)).headers.get('ratelimit')?.startsWith('"queued";r=4'), true)
  await server.stop()
  const res = await fetch(`${otherUrl}/x`, { signal: AbortSignal.timeout(3000) })
  assert.equal(res.status, 200)
  assert.equal(res.headers.get('ratelimit'), null)
})
