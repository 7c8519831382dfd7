import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import idempotency, {
  type IdempotencyPluginOptions,
  parseIdempotencyKey,
  requestFingerprint,
} from '../../../src/plugins/idempotency/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import redisPlugin, { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { answerProblems } from '../../helpers/plain-app.ts'
import { gate } from './fixtures.ts'

interface PluginApp {
  app: FastifyInstance
  runs: Map<string, number>
  gates: Map<string, ReturnType<typeof gate>>
  prefix: string
}

/** The plugin alone on a bare Fastify app; the principal is the `x-user` header. */
async function pluginApp(
  redis: RedisClient,
  options: Partial<IdempotencyPluginOptions> = {},
  prefix = uniquePrefix('idem'),
): Promise<PluginApp> {
  const app = Fastify()
  answerProblems(app)
  await app.register(metrics, { processMetrics: false })
  await app.register(redisPlugin, { redis })
  await app.register(idempotency, {
    keyPrefix: prefix,
    scope: (request) => `${request.headers['x-user'] ?? 'anonymous'} ${request.routeOptions.url}`,
    ...options,
  })
  const runs = new Map<string, number>()
  const gates = new Map<string, ReturnType<typeof gate>>()
  const count = (name: string) => {
    runs.set(name, (runs.get(name) ?? 0) + 1)
    return runs.get(name)!
  }
  app.post('/echo', { config: { idempotency: true } }, async (request, reply) => {
    const run = count('echo')
    reply.header('location', `/things/${run}`).header('x-trace', String(Math.random()))
    reply.header('set-cookie', `seen=${run}; HttpOnly`)
    return reply.code(201).send({ run, body: request.body, idempotency: request.idempotency })
  })
  app.post('/optional', { config: { idempotency: { required: false } } }, async () => ({
    run: count('optional'),
  }))
  app.post<{ Params: { code: string } }>(
    '/status/:code',
    { config: { idempotency: true } },
    async (request, reply) => {
      const run = count(`status${request.params.code}`)
      return reply.code(Number(request.params.code)).send({ run })
    },
  )
  app.post('/throw', { config: { idempotency: true } }, async () => {
    count('throw')
    throw new Error('boom')
  })
  app.post<{ Body: { size: number } }>('/big', { config: { idempotency: true } }, async (request, reply) => {
    count('big')
    return reply.type('text/plain').send('x'.repeat(request.body.size))
  })
  app.post<{ Body: { gate: string } }>('/slow', { config: { idempotency: true } }, async (request, reply) => {
    const run = count('slow')
    await gates.get(request.body.gate)?.opened
    return reply.code(201).send({ run, gate: request.body.gate })
  })
  await app.ready()
  return { app, runs, gates, prefix }
}

const post = (
  app: FastifyInstance,
  url: string,
  key: string | string[] | undefined,
  payload: object,
  user = 'u1',
) =>
  app.inject({
    method: 'POST',
    url,
    headers: { 'x-user': user, ...(key === undefined ? {} : { 'idempotency-key': key }) },
    payload,
  })

async function metricValue(app: FastifyInstance, line: string): Promise<number> {
  const text = (await app.inject({ url: '/metrics' })).body
  const found = text.split('\n').find((l) => l.startsWith(`${line} `))
  return found ? Number(found.split(' ')[1]) : 0
}

let shared: RedisClient
before(async () => {
  shared = createRedisClient(testRedisConnection())
})
after(() => shared.quit())

describe('options', () => {
  const cases: Array<[Partial<IdempotencyPluginOptions> | 'no-redis' | 'route', string]> = [
    [{ leaseMs: 50 }, 'idempotency plugin: `leaseMs` must be an integer from 100 to 60000, got 50'],
    [
      { leaseMs: 1000, retentionMs: 1000 },
      'idempotency plugin: `retentionMs` must be an integer larger than `leaseMs` (1000), got 1000',
    ],
    [
      { replayHeaders: ['content-type', 'Set-Cookie'] },
      'idempotency plugin: `replayHeaders` must not include Set-Cookie: a cookie belongs to one response',
    ],
    [
      { replayHeaders: ['bad header'] },
      'idempotency plugin: `replayHeaders` must be an array of header names, got an object (Array)',
    ],
    [
      { headerName: 'Idempotency Key' },
      "idempotency plugin: `headerName` must be a valid HTTP header name of 1-64 characters, got a string ('Idempotency Key')",
    ],
    [
      { maxResponseBytes: 0 },
      'idempotency plugin: `maxResponseBytes` must be an integer from 1 to 16777216, got 0',
    ],
    [
      { onRedisError: 'maybe' as 'closed' },
      "idempotency plugin: `onRedisError` must be 'closed' or 'open', got a string ('maybe')",
    ],
    [
      'no-redis',
      'idempotency plugin: no Redis client: pass `redis` (an ioredis client) or register the redis plugin before this one',
    ],
    [
      'route',
      "idempotency plugin: route POST /x: `config.idempotency` must be true, false or an object, got a string ('yes')",
    ],
  ]
  for (const [options, message] of cases) {
    test(message, async () => {
      const app = Fastify()
      await assert.rejects(
        async () => {
          if (options !== 'no-redis') await app.register(redisPlugin, { redis: shared })
          await app.register(idempotency, typeof options === 'object' ? options : {})
          if (options === 'route')
            app.post('/x', { config: { idempotency: 'yes' as unknown as boolean } }, async () => 1)
          await app.ready()
        },
        { message },
      )
      await app.close()
    })
  }
})

describe('the Idempotency-Key header', () => {
  test('bare or structured-field string, 1 to 255 visible ASCII characters', () => {
    const valid: Array<[string, string]> = [
      ['abc', 'abc'],
      ['"abc"', 'abc'],
      ['"a\\"b\\\\c"', 'a"b\\c'],
      ['a'.repeat(255), 'a'.repeat(255)],
      [`"${'a'.repeat(255)}"`, 'a'.repeat(255)],
      ['"a b"', 'a b'],
      ['550e8400-e29b-41d4-a716-446655440000', '550e8400-e29b-41d4-a716-446655440000'],
    ]
    for (const [raw, key] of valid) assert.equal(parseIdempotencyKey(raw), key, raw)
    const invalid = ['', '""', 'a'.repeat(256), `"${'a'.repeat(256)}"`, 'a b', '"abc', '"abc";p=1', '"a\\x"']
    for (const raw of [...invalid, 'café', '"a", "b"', '"ab"c"'])
      assert.equal(parseIdempotencyKey(raw), null, raw)
    assert.equal(parseIdempotencyKey(['a', 'b']), null)
    assert.equal(parseIdempotencyKey(undefined), null)
  })

  test('missing, malformed and oversized keys get 400 with their own types and write nothing', async () => {
    const { app, runs, prefix } = await pluginApp(shared)
    const missing = await post(app, '/echo', undefined, { a: 1 })
    assert.equal(missing.statusCode, 400)
    assert.equal(missing.json().type, '/problems/idempotency-key-missing')
    for (const key of ['a'.repeat(256), '"unterminated', 'with space', '"x";param=1', ['one', 'two']]) {
      const res = await post(app, '/echo', key, { a: 1 })
      assert.equal(res.statusCode, 400, String(key))
      assert.equal(res.json().type, '/problems/idempotency-key-invalid')
    }
    assert.equal(runs.get('echo'), undefined)
    assert.deepEqual(await scanKeys(shared, prefix), [])
    assert.equal(await metricValue(app, 'idempotency_requests_total{outcome="missing"}'), 1)
    assert.equal(await metricValue(app, 'idempotency_requests_total{outcome="invalid"}'), 5)
    const optional = await post(app, '/optional', undefined, {})
    assert.equal(optional.statusCode, 200)
    await app.close()
  })

  test('the bare and the quoted spelling are the same key; a 255-character key works', async () => {
    const { app, runs } = await pluginApp(shared)
    const first = await post(app, '/echo', 'k-1', { a: 1 })
    const quoted = await post(app, '/echo', '"k-1"', { a: 1 })
    assert.equal(first.statusCode, 201)
    assert.equal(quoted.headers['idempotent-replayed'], 'true')
    assert.equal(quoted.body, first.body)
    const long = 'k'.repeat(255)
    assert.equal((await post(app, '/echo', long, { a: 2 })).statusCode, 201)
    assert.equal((await post(app, '/echo', `"${long}"`, { a: 2 })).headers['idempotent-replayed'], 'true')
    assert.equal(runs.get('echo'), 2)
    await app.close()
  })
})

describe('replays', () => {
  test('status, body bytes and allowed headers are replayed; Set-Cookie and other headers never', async () => {
    const { app, runs } = await pluginApp(shared)
    const first = await post(app, '/echo', 'replay-1', { b: [1, 2], a: 'x' })
    assert.equal(first.statusCode, 201)
    assert.ok(first.headers['set-cookie'])
    assert.equal(first.headers['idempotent-replayed'], undefined)
    // Key order is not part of the payload: the fingerprint is over canonical JSON.
    const again = await post(app, '/echo', 'replay-1', { a: 'x', b: [1, 2] })
    assert.equal(again.statusCode, 201)
    assert.equal(again.rawPayload.equals(first.rawPayload), true)
    assert.equal(again.headers['idempotent-replayed'], 'true')
    assert.equal(again.headers.location, first.headers.location)
    assert.equal(again.headers['content-type'], first.headers['content-type'])
    assert.equal(again.headers['set-cookie'], undefined)
    assert.equal(again.headers['x-trace'], undefined)
    assert.equal(runs.get('echo'), 1)
    assert.equal(await metricValue(app, 'idempotency_requests_total{outcome="replayed"}'), 1)
    assert.ok((await metricValue(app, 'idempotency_stored_bytes_total')) >= first.rawPayload.length)
    await app.close()
  })

  test('keys are scoped: another principal with the same key runs and gets its own response', async () => {
    const { app, runs } = await pluginApp(shared)
    const mine = await post(app, '/echo', 'shared-key', { a: 1 }, 'u1')
    const theirs = await post(app, '/echo', 'shared-key', { a: 1 }, 'u2')
    assert.equal(theirs.statusCode, 201)
    assert.equal(theirs.headers['idempotent-replayed'], undefined)
    assert.notEqual(theirs.body, mine.body)
    assert.equal(runs.get('echo'), 2)
    await app.close()
  })

  test('a business 4xx is kept and replayed; 5xx, thrown errors and retryable 4xx release the key', async () => {
    const { app, runs } = await pluginApp(shared)
    for (const code of ['422', '404']) {
      const first = await post(app, `/status/${code}`, `biz-${code}`, {})
      const again = await post(app, `/status/${code}`, `biz-${code}`, {})
      assert.equal(again.statusCode, Number(code))
      assert.equal(again.headers['idempotent-replayed'], 'true')
      assert.equal(again.body, first.body)
      assert.equal(runs.get(`status${code}`), 1)
    }
    for (const code of ['500', '503', '429', '409']) {
      await post(app, `/status/${code}`, `retry-${code}`, {})
      const again = await post(app, `/status/${code}`, `retry-${code}`, {})
      assert.equal(again.headers['idempotent-replayed'], undefined)
      assert.equal(runs.get(`status${code}`), 2, code)
    }
    assert.equal((await post(app, '/throw', 'thrown', {})).statusCode, 500)
    assert.equal((await post(app, '/throw', 'thrown', {})).statusCode, 500)
    assert.equal(runs.get('throw'), 2)
    assert.equal(await metricValue(app, 'idempotency_responses_total{result="released"}'), 10)
    await app.close()
  })

  test('a response over the size cap is sent once, not kept, and never runs again (410 on retry)', async () => {
    const { app, runs } = await pluginApp(shared, { maxResponseBytes: 100 })
    const atCap = await post(app, '/big', 'at-cap', { size: 100 })
    assert.equal((await post(app, '/big', 'at-cap', { size: 100 })).body, atCap.body)
    const big = await post(app, '/big', 'over-cap', { size: 101 })
    assert.equal(big.statusCode, 200)
    assert.equal(big.body.length, 101)
    const retry = await post(app, '/big', 'over-cap', { size: 101 })
    assert.equal(retry.statusCode, 410)
    assert.equal(retry.json().type, '/problems/idempotency-response-not-kept')
    assert.equal(retry.headers['idempotent-replayed'], 'true')
    assert.equal(runs.get('big'), 2)
    assert.equal(await metricValue(app, 'idempotency_responses_total{result="not_kept"}'), 1)
    await app.close()
  })
})

describe('in flight', () => {
  test('same payload: 409 with Retry-After; other payload: 422 first; neither touches the record', async () => {
    const { app, runs, gates, prefix } = await pluginApp(shared)
    gates.set('g1', gate())
    const first = post(app, '/slow', 'flight-1', { gate: 'g1' })
    while (runs.get('slow') !== 1) await new Promise((r) => setTimeout(r, 5))
    const [recordKey] = await scanKeys(shared, prefix)
    const before = await shared.hgetall(recordKey!)
    const conflict = await post(app, '/slow', 'flight-1', { gate: 'g1' })
    assert.equal(conflict.statusCode, 409)
    assert.equal(conflict.json().type, '/problems/idempotency-key-in-flight')
    assert.ok(Number(conflict.headers['retry-after']) >= 1)
    const mismatch = await post(app, '/slow', 'flight-1', { gate: 'other' })
    assert.equal(mismatch.statusCode, 422)
    assert.equal(mismatch.json().type, '/problems/idempotency-key-mismatch')
    const during = await shared.hgetall(recordKey!)
    assert.equal(during.token, before.token)
    assert.equal(during.fp, before.fp)
    gates.get('g1')!.open()
    const done = await first
    assert.equal(done.statusCode, 201)
    assert.equal((await post(app, '/slow', 'flight-1', { gate: 'g1' })).body, done.body)
    assert.equal((await post(app, '/slow', 'flight-1', { gate: 'other' })).statusCode, 422)
    assert.equal(runs.get('slow'), 1)
    assert.equal(await metricValue(app, 'idempotency_requests_total{outcome="conflict"}'), 1)
    assert.equal(await metricValue(app, 'idempotency_requests_total{outcome="mismatch"}'), 2)
    await app.close()
  })

  test('a claim left by a crashed instance is taken over once its lease expired, and runs once', async () => {
    const { app, runs } = await pluginApp(shared)
    const body = { a: 'crash' }
    const recordKey = app.idempotency.recordKey('u1 /echo', 'crashed-1')
    await shared.hset(recordKey, {
      state: 'processing',
      fp: requestFingerprint('POST', '/echo', body),
      token: 'token-of-a-dead-instance',
      leaseUntil: 1, // long past, whatever the clocks say
    })
    await shared.pexpire(recordKey, 86_400_000)
    const retries = await Promise.all(Array.from({ length: 10 }, () => post(app, '/echo', 'crashed-1', body)))
    const statuses = retries.map((r) => r.statusCode).sort()
    assert.ok(
      statuses.every((s) => s === 201 || s === 409),
      String(statuses),
    )
    assert.equal(runs.get('echo'), 1)
    assert.equal(await metricValue(app, 'idempotency_requests_total{outcome="takeover"}'), 1)
    assert.equal((await post(app, '/echo', 'crashed-1', body)).headers['idempotent-replayed'], 'true')
    await app.close()
  })

  test("a slow handler's lease is renewed: a second instance cannot take it over", async () => {
    const prefix = uniquePrefix('idem')
    const a = await pluginApp(shared, { leaseMs: 200 }, prefix)
    const b = await pluginApp(shared, { leaseMs: 200 }, prefix)
    a.gates.set('slow', gate())
    const first = post(a.app, '/slow', 'renewed-1', { gate: 'slow' })
    while (a.runs.get('slow') !== 1) await new Promise((r) => setTimeout(r, 5))
    // Five leases long: without renewal the claim would have expired four times over.
    await new Promise((r) => setTimeout(r, 1000))
    const second = await post(b.app, '/slow', 'renewed-1', { gate: 'slow' })
    assert.equal(second.statusCode, 409)
    assert.equal(b.runs.get('slow'), undefined)
    a.gates.get('slow')!.open()
    const done = await first
    const replay = await post(b.app, '/slow', 'renewed-1', { gate: 'slow' })
    assert.equal(replay.body, done.body)
    assert.equal(replay.headers['idempotent-replayed'], 'true')
    await a.app.close()
    await b.app.close()
  })

  test('only the owner completes: a handler whose claim was taken over cannot overwrite it', async () => {
    const { app, runs, gates, prefix } = await pluginApp(shared)
    gates.set('lost', gate())
    const first = post(app, '/slow', 'owner-1', { gate: 'lost' })
    while (runs.get('slow') !== 1) await new Promise((r) => setTimeout(r, 5))
    const [recordKey] = await scanKeys(shared, prefix)
    await shared.hset(recordKey!, 'token', 'new-owner')
    assert.equal(await app.idempotency.release(recordKey!, 'not-the-owner'), false)
    gates.get('lost')!.open()
    assert.equal((await first).statusCode, 201)
    const record = await shared.hgetall(recordKey!)
    assert.equal(record.state, 'processing')
    assert.equal(record.token, 'new-owner')
    assert.equal(await metricValue(app, 'idempotency_responses_total{result="lost"}'), 1)
    await app.close()
  })
})

describe('when Redis fails', () => {
  test('a failed store is logged and counted and leaves the claim in place', async (t) => {
    const server = await startRedisServer()
    const redis = createRedisClient({ url: server.url, commandTimeoutMs: 200 })
    const admin = new Redis(server.url)
    t.after(async () => {
      redis.disconnect()
      admin.disconnect()
      await server.stop()
    })
    const { app, runs, gates, prefix } = await pluginApp(redis, { leaseMs: 10_000 })
    gates.set('store', gate())
    const first = post(app, '/slow', 'store-fails', { gate: 'store' })
    while (runs.get('slow') !== 1) await new Promise((r) => setTimeout(r, 5))
    // Writes (scripts included) now block past the client's command timeout; killing the
    // connection afterwards drops the blocked write, so the store really failed.
    const clientId = await redis.call('CLIENT', 'ID')
    await admin.call('CLIENT', 'PAUSE', '5000', 'WRITE')
    gates.get('store')!.open()
    const done = await first
    assert.equal(done.statusCode, 201)
    await admin.call('CLIENT', 'KILL', 'ID', String(clientId))
    await admin.call('CLIENT', 'UNPAUSE')
    while (redis.status !== 'ready') await new Promise((r) => setTimeout(r, 20))
    const [recordKey] = await scanKeys(admin, prefix)
    const record = await admin.hgetall(recordKey!)
    assert.equal(record.state, 'processing')
    assert.equal(await metricValue(app, 'idempotency_responses_total{result="store_failed"}'), 1)
    // The live claim answers 409 until its lease ends; it was not deleted, so no retry ran early.
    assert.equal((await post(app, '/slow', 'store-fails', { gate: 'store' })).statusCode, 409)
    assert.equal(runs.get('slow'), 1)
    await app.close()
  })

  test("Redis down: 503 by default; 'open' runs the handler, which sees the key unclaimed", async (t) => {
    const server = await startRedisServer()
    const redis = createRedisClient({ url: server.url })
    t.after(async () => {
      redis.disconnect()
      await server.stop()
    })
    const reject = await pluginApp(redis)
    const proceed = await pluginApp(redis, { onRedisError: 'open' })
    await server.stop()
    const refused = await post(reject.app, '/echo', 'down-1', {})
    assert.equal(refused.statusCode, 503)
    assert.equal(refused.json().type, '/problems/idempotency-store-unavailable')
    assert.equal(refused.headers['retry-after'], '1')
    assert.equal(reject.runs.get('echo'), undefined)
    const ran = await post(proceed.app, '/echo', 'down-1', { x: 1 })
    assert.equal(ran.statusCode, 201)
    assert.deepEqual(ran.json().idempotency, {
      outcome: 'unavailable',
      key: 'down-1',
      fingerprint: requestFingerprint('POST', '/echo', { x: 1 }),
      claimed: false,
      stored: false,
    })
    assert.equal(await metricValue(proceed.app, 'idempotency_requests_total{outcome="unavailable"}'), 1)
    await reject.app.close()
    await proceed.app.close()
  })
})
