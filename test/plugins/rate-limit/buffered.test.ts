import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import rateLimit, { type RateLimitPolicy } from '../../../src/plugins/rate-limit/index.ts'
import { connectRedis } from '../../../src/redis/server.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from '../../helpers/index.ts'

// Buffered mode on the real Redis, with several instances (apps with their own clients, as
// separate processes would have): nothing admitted beyond the limit under real concurrency, Redis
// called once per lease instead of once per request, unused units given back, a crashed
// instance's share going to the others, and over-limit keys answered without Redis.

let redis: Redis
const opened: Array<{ app: FastifyInstance; client: Redis }> = []

before(async () => {
  redis = new Redis(TEST_REDIS_URL, { lazyConnect: true })
  await connectRedis(redis)
})

after(async () => {
  for (const { app, client } of opened) {
    await app.close().catch(() => {})
    client.disconnect()
  }
  redis.disconnect()
})

interface Instance {
  app: FastifyInstance
  client: Redis
  /** Commands this instance's client sent (scripts count once). */
  commands: () => number
}

async function instance(prefix: string, policy: RateLimitPolicy): Promise<Instance> {
  const client = new Redis(TEST_REDIS_URL, { lazyConnect: true, enableOfflineQueue: false })
  await connectRedis(client)
  let sent = 0
  const send = client.sendCommand.bind(client)
  client.sendCommand = ((command: never, ...rest: never[]) => {
    sent++
    return (send as (...args: unknown[]) => unknown)(command, ...rest)
  }) as typeof client.sendCommand
  const app = Fastify()
  await app.register(rateLimit, { redis: client, keyPrefix: prefix, namedPolicies: [policy] })
  app.get('/', { config: { rateLimits: policy.name } }, async () => ({ ok: true }))
  await app.ready()
  opened.push({ app, client })
  const start = sent
  return { app, client, commands: () => sent - start }
}

const fixed = (name: string, limit: number, sync: RateLimitPolicy['sync']): RateLimitPolicy => ({
  name,
  algorithm: 'fixed-window',
  limit,
  windowMs: 60_000,
  key: (request) => String(request.headers['x-key'] ?? 'anyone'),
  sync,
})

const bucket = (
  name: string,
  capacity: number,
  refillPerSecond: number,
  sync: RateLimitPolicy['sync'],
): RateLimitPolicy => ({
  name,
  algorithm: 'token-bucket',
  limit: capacity,
  refillPerSecond,
  key: (request) => String(request.headers['x-key'] ?? 'anyone'),
  sync,
})

const counterOf = async (prefix: string, name: string) => {
  const keys = (await scanKeys(redis, prefix)).filter((key) => key.endsWith(`:${name}:fixed-window`))
  assert.equal(keys.length, 1)
  return Number(await redis.get(keys[0]!))
}

test('four instances, 800 concurrent requests for a limit of 300: exactly 300 admitted, and Redis counts no more once leases are given back', async () => {
  const prefix = uniquePrefix('rlb')
  const policy = fixed('buffered', 300, { intervalMs: 50, batch: 40 })
  const instances = await Promise.all([1, 2, 3, 4].map(() => instance(prefix, policy)))
  const answers = await Promise.all(
    Array.from({ length: 800 }, (_, i) =>
      instances[i % 4]!.app.inject({ url: '/', headers: { 'x-key': 'k' } }).then((r) => r.statusCode),
    ),
  )
  const admitted = answers.filter((s) => s === 200).length
  assert.equal(answers.filter((s) => s !== 200 && s !== 429).length, 0)
  assert.ok(admitted <= 300, `admitted ${admitted} of a limit of 300`)
  // Every unit Redis counted was admitted or is held unused in a lease: the leases account for the difference.
  const held = instances.reduce((sum, { app }) => sum + unitsHeld(app, 'buffered'), 0)
  assert.equal(await counterOf(prefix, 'buffered'), admitted + held)
  assert.ok(admitted >= 300 - held, `under-admitted: ${admitted} admitted, ${held} held`)
  for (const { app } of instances) await app.close()
  assert.equal(await counterOf(prefix, 'buffered'), admitted, 'closing gives every unused unit back')
})

const unitsHeld = (app: FastifyInstance, name: string) =>
  app.rateLimiter.leases().policies[name]?.unitsHeld ?? 0

test('one lease call per batch: 1000 requests send about 10 script calls, not 1000', async () => {
  const prefix = uniquePrefix('rlb')
  const one = await instance(prefix, fixed('batched', 1_000_000, { intervalMs: 60_000, batch: 100 }))
  const before = one.commands()
  for (let i = 0; i < 1000; i++) {
    const response = await one.app.inject({ url: '/', headers: { 'x-key': 'k' } })
    assert.equal(response.statusCode, 200)
  }
  assert.equal(one.commands() - before, 10)
  assert.equal(await counterOf(prefix, 'batched'), 1000)
})

test("a key's next window, or its refilled bucket, is leased whole: one call, not a one-unit lease first", async () => {
  const prefix = uniquePrefix('rlb')
  const sync = { intervalMs: 60_000, batch: 100 }
  const windowed = await instance(prefix, { ...fixed('renewed', 20, sync), windowMs: 1000 })
  const refilled = await instance(uniquePrefix('rlb'), bucket('refilled', 20, 20, sync))
  for (const one of [windowed, refilled]) {
    const statuses = async (n: number) => {
      const counted: number[] = []
      for (let i = 0; i < n; i++)
        counted.push((await one.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode)
      return counted
    }
    // Drained: Redis's last word is 0 left.
    assert.equal((await statuses(22)).filter((status) => status === 200).length, 20)
    // Past the window's end (the bucket full again), the first lease is the whole limit again.
    await new Promise((resolve) => setTimeout(resolve, 1200))
    const before = one.commands()
    assert.deepEqual(await statuses(20), Array(20).fill(200))
    assert.equal(one.commands() - before, 1)
  }
})

test('a token bucket at its limit: a refused lease is held for a sync interval, then the next lease takes what refilled', async () => {
  const one = await instance(uniquePrefix('rlb'), bucket('flood', 10, 10, { intervalMs: 200, batch: 100 }))
  const consume = () => one.app.rateLimiter.consume('flood', 'k')
  for (let i = 0; i < 10; i++) assert.equal((await consume()).allowed, true)
  const refused = await consume()
  assert.equal(refused.allowed, false)
  // Redis would take the next unit in 100 ms: held for the interval instead (half the 1 s refill at most).
  assert.ok(refused.retryAfterMs >= 190, `retry after ${refused.retryAfterMs} ms`)
  const before = one.commands()
  for (let i = 0; i < 10; i++) assert.equal((await consume()).allowed, false)
  assert.equal(one.commands() - before, 0, 'refused from the over-limit cache')
  await new Promise((resolve) => setTimeout(resolve, refused.retryAfterMs + 100))
  assert.equal((await consume()).allowed, true)
})

test('an over-limit key is answered without Redis until its window moves', async () => {
  const prefix = uniquePrefix('rlb')
  const one = await instance(prefix, fixed('over', 10, { intervalMs: 60_000, batch: 4 }))
  const statuses: number[] = []
  for (let i = 0; i < 12; i++)
    statuses.push((await one.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode)
  assert.deepEqual(statuses, [...Array(10).fill(200), 429, 429])
  const before = one.commands()
  for (let i = 0; i < 50; i++) {
    const response = await one.app.inject({ url: '/', headers: { 'x-key': 'k' } })
    assert.equal(response.statusCode, 429)
    assert.ok(Number(response.headers['retry-after']) > 0)
  }
  assert.equal(one.commands() - before, 0)
})

test('a request an exact policy refuses gives its units back to the buffered lease', async () => {
  const prefix = uniquePrefix('rlb')
  const client = new Redis(TEST_REDIS_URL, { lazyConnect: true })
  await connectRedis(client)
  const app = Fastify()
  await app.register(rateLimit, {
    redis: client,
    keyPrefix: prefix,
    namedPolicies: [
      fixed('wide', 100, { intervalMs: 60_000, batch: 10 }),
      { name: 'narrow', algorithm: 'fixed-window', limit: 2, windowMs: 60_000 },
    ],
  })
  app.get('/', { config: { rateLimits: ['wide', 'narrow'] } }, async () => ({ ok: true }))
  await app.ready()
  opened.push({ app, client })
  const statuses: number[] = []
  for (let i = 0; i < 4; i++)
    statuses.push((await app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode)
  assert.deepEqual(statuses, [200, 200, 429, 429])
  // Two spent of a lease of ten: the two refused requests took nothing.
  assert.equal(app.rateLimiter.leases().policies.wide?.unitsHeld, 8)
})

test("a crashed instance drops out of the count, and its lease's units come back with the next window", async () => {
  const prefix = uniquePrefix('rlb')
  const policy: RateLimitPolicy = { ...fixed('crash', 40, { intervalMs: 20, batch: 100 }), windowMs: 8000 }
  const a = await instance(prefix, policy)
  const b = await instance(prefix, policy)
  await a.app.rateLimiter.sync()
  await b.app.rateLimiter.sync()
  assert.equal(b.app.rateLimiter.leases().instances, 2)
  assert.equal((await a.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode, 200)
  // a took half of the limit (two instances); it dies holding 19 unused units.
  assert.equal(a.app.rateLimiter.leases().policies.crash?.unitsHeld, 19)
  a.client.disconnect()
  const windowStarted = Date.now()
  // Three missed heartbeats (a second apart) after a's last one, b counts itself alone.
  const deadline = Date.now() + 10_000
  while (b.app.rateLimiter.leases().instances !== 1) {
    assert.ok(Date.now() < deadline, 'b still counts the crashed instance')
    await b.app.rateLimiter.sync()
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  let admitted = 0
  for (let i = 0; i < 40; i++)
    if ((await b.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode === 200) admitted++
  if (Date.now() - windowStarted < 7500) assert.equal(admitted, 20, "b admits what a's lease did not hold")
  // The next window: the whole limit again.
  await new Promise((resolve) => setTimeout(resolve, Math.max(0, windowStarted + 8200 - Date.now())))
  admitted = 0
  for (let i = 0; i < 50; i++)
    if ((await b.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode === 200) admitted++
  assert.equal(admitted, 40)
})

test('while Redis cannot answer, leases held keep admitting, then the policy decides by its onRedisError', async () => {
  const prefix = uniquePrefix('rlb')
  const one = await instance(prefix, {
    ...fixed('outage', 100, { intervalMs: 60_000, batch: 5 }),
    onRedisError: 'closed',
  })
  assert.equal((await one.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode, 200)
  one.client.disconnect()
  const statuses: number[] = []
  for (let i = 0; i < 6; i++)
    statuses.push((await one.app.inject({ url: '/', headers: { 'x-key': 'k' } })).statusCode)
  assert.deepEqual(statuses, [200, 200, 200, 200, 503, 503])
})

test("while Redis is down, a buffered policy's 'local' fallback admits its share among the live instances", async () => {
  const prefix = uniquePrefix('rlb')
  const policy: RateLimitPolicy = {
    ...fixed('down', 100, { intervalMs: 60_000, batch: 1 }),
    onRedisError: 'local',
  }
  const four = [
    await instance(prefix, policy),
    await instance(prefix, policy),
    await instance(prefix, policy),
    await instance(prefix, policy),
  ]
  for (const { app } of four) await app.rateLimiter.sync()
  const [one] = four
  await one!.app.rateLimiter.sync()
  assert.equal(one!.app.rateLimiter.leases().instances, 4)
  one!.client.disconnect()
  const replies = []
  for (let i = 0; i < 40; i++)
    replies.push(await one!.app.inject({ url: '/', headers: { 'x-key': 'fresh' } }))
  assert.equal(replies.filter((r) => r.statusCode === 200).length, 25, 'a quarter of the limit')
  assert.equal(replies.filter((r) => r.statusCode === 429).length, 15)
  assert.equal(replies[0]!.headers['ratelimit-policy'], '"down";q=25;w=60')
})

test('four instances share a token bucket: no more admitted than its capacity', async () => {
  const prefix = uniquePrefix('rlb')
  const policy = bucket('bucket', 200, 0.001, { intervalMs: 50, batch: 25 })
  const instances = await Promise.all([1, 2, 3, 4].map(() => instance(prefix, policy)))
  const answers = await Promise.all(
    Array.from({ length: 600 }, (_, i) =>
      instances[i % 4]!.app.inject({ url: '/' }).then((r) => r.statusCode),
    ),
  )
  const admitted = answers.filter((s) => s === 200).length
  const held = instances.reduce((sum, { app }) => sum + unitsHeld(app, 'bucket'), 0)
  assert.ok(admitted <= 200, `admitted ${admitted}`)
  assert.ok(admitted >= 200 - held - 1, `admitted ${admitted}, held ${held}`)
})

test('a policy that cannot be buffered says why', async () => {
  const client = new Redis(TEST_REDIS_URL, { lazyConnect: true })
  await connectRedis(client)
  try {
    for (const [policy, message] of [
      [
        { name: 'log', algorithm: 'sliding-log', limit: 5, windowMs: 1000, sync: true },
        /applies to fixed-window, token-bucket and gcra/,
      ],
      [
        {
          name: 'f',
          algorithm: 'fixed-window',
          limit: 5,
          windowMs: 1000,
          sync: true,
          countOnlyFailures: true,
        },
        /countOnlyFailures/,
      ],
      [{ name: 'f', algorithm: 'fixed-window', limit: 5, windowMs: 1000, sync: { batch: 0 } }, /sync\.batch/],
      [
        { name: 'f', algorithm: 'fixed-window', limit: 5, windowMs: 1000, sync: { intervalMs: 5 } },
        /at least 10 ms/,
      ],
      [{ name: 'f', algorithm: 'fixed-window', limit: 5, windowMs: 1000, sync: { every: 5 } }, /every/],
    ] as const) {
      const app = Fastify()
      await assert.rejects(
        async () => {
          await app.register(rateLimit, { redis: client, policies: [policy as unknown as RateLimitPolicy] })
          await app.ready()
        },
        (err: Error) =>
          (message.test(err.message) && err.name === 'InvalidOptionError') || /Unknown/.test(err.name),
      )
      await app.close()
    }
  } finally {
    client.disconnect()
  }
})

test('a burst on a key at its limit: the requests waiting on a refused lease are refused without a call of their own', async () => {
  const prefix = uniquePrefix('rlb')
  const one = await instance(prefix, fixed('burst', 10, { intervalMs: 60_000, batch: 10 }))
  const before = one.commands()
  const statuses = await Promise.all(
    Array.from({ length: 200 }, () =>
      one.app.inject({ url: '/', headers: { 'x-key': 'k' } }).then((r) => r.statusCode),
    ),
  )
  assert.equal(statuses.filter((s) => s === 200).length, 10)
  assert.equal(statuses.filter((s) => s === 429).length, 190)
  // One lease of ten, then one refused lease; every other request waited on one of them.
  assert.ok(one.commands() - before <= 3, `${one.commands() - before} Redis calls for 200 requests`)
})
