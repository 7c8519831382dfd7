import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import idempotency, { requestFingerprint } from '../../../src/plugins/idempotency/index.ts'
import { ownerToken } from '../../../src/plugins/idempotency/store.ts'
import redisPlugin, { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { readIdempotencyRecord } from '../../helpers/idempotency-record.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { answerProblems } from '../../helpers/plain-app.ts'

const DAY_MS = 86_400_000
const JSON_TYPE = 'application/json; charset=utf-8'

let shared: RedisClient
before(() => {
  shared = createRedisClient(testRedisConnection())
})
after(() => shared.quit())

/** The plugin alone on a bare Fastify app, scoped by route so tests can name record keys. */
async function pluginApp() {
  const prefix = uniquePrefix('idem')
  const app = Fastify()
  answerProblems(app)
  await app.register(redisPlugin, { redis: shared })
  await app.register(idempotency, { keyPrefix: prefix, scope: (request) => `s ${request.routeOptions.url}` })
  let runs = 0
  app.post('/echo', { config: { idempotency: true } }, async (request, reply) => {
    runs++
    return reply.code(201).header('location', `/things/${runs}`).send({ run: runs, body: request.body })
  })
  const bytes = Buffer.from(Array.from({ length: 512 }, (_, i) => i % 256))
  app.post('/bytes', { config: { idempotency: true } }, async (_request, reply) => {
    runs++
    return reply
      .type('application/octet-stream')
      .header('etag', `"v${runs}"`)
      .header('location', '/files/1?a=b')
      .send(bytes)
  })
  app.post('/text', { config: { idempotency: true } }, async (_request, reply) => {
    runs++
    return reply.type('text/plain; charset=utf-8').send(`\n\n[1]\n${runs}`)
  })
  app.post('/empty', { config: { idempotency: true } }, async (_request, reply) => {
    runs++
    return reply.code(200).send('')
  })
  await app.ready()
  return { app, prefix, bytes, runs: () => runs }
}

const post = (app: FastifyInstance, url: string, key: string, payload: object) =>
  app.inject({ method: 'POST', url, headers: { 'idempotency-key': key }, payload })

describe('the record of a completed request', () => {
  test('binary bodies, uncommon headers, newlines and empty bodies replay byte for byte', async () => {
    const { app, prefix, bytes, runs } = await pluginApp()
    const first = await post(app, '/bytes', 'bytes-1', { a: 1 })
    assert.deepEqual(first.rawPayload, bytes)
    const replay = await post(app, '/bytes', 'bytes-1', { a: 1 })
    assert.equal(replay.headers['idempotent-replayed'], 'true')
    assert.deepEqual(replay.rawPayload, bytes)
    for (const name of ['content-type', 'etag', 'location'])
      assert.equal(replay.headers[name], first.headers[name], name)
    const [recordKey] = await scanKeys(shared, prefix)
    // A common line is kept as its index, the others as pairs.
    assert.equal(
      (await readIdempotencyRecord(shared, recordKey!))!.headers,
      '[4,["location","/files/1?a=b"],["etag","\\"v1\\""]]',
    )
    const text = await post(app, '/text', 'text-1', {})
    const textReplay = await post(app, '/text', 'text-1', {})
    assert.equal(textReplay.body, '\n\n[1]\n2')
    assert.deepEqual(textReplay.rawPayload, text.rawPayload)
    assert.equal(textReplay.headers['content-type'], 'text/plain; charset=utf-8')
    const empty = await post(app, '/empty', 'empty-1', {})
    const emptyReplay = await post(app, '/empty', 'empty-1', {})
    assert.equal(empty.statusCode, 200)
    assert.equal(emptyReplay.statusCode, 200)
    assert.equal(emptyReplay.headers['idempotent-replayed'], 'true')
    assert.equal(emptyReplay.body, '')
    assert.equal(runs(), 3)
    await app.close()
  })

  test('renewing, releasing or completing a completed record answers false and changes nothing', async () => {
    const { app, prefix } = await pluginApp()
    const store = app.idempotency
    const recordKey = store.recordKey('direct', 'late-1')
    const token = ownerToken()
    const fp = requestFingerprint('POST', '/direct', { a: 1 })
    const otherFp = requestFingerprint('POST', '/direct', { a: 2 })
    assert.deepEqual(await store.claim(recordKey, fp, token), { kind: 'new' })
    assert.equal(await store.renew(recordKey, token), true)
    const response = {
      status: 201,
      headers: [['location', '/x'] as [string, string]],
      body: Buffer.from('{}'),
    }
    assert.equal(await store.complete(recordKey, token, response), true)
    const packed = await shared.getBuffer(recordKey)
    assert.equal(await store.renew(recordKey, token), false)
    assert.equal(await store.release(recordKey, token), false)
    assert.equal(await store.complete(recordKey, token, { ...response, body: Buffer.from('other') }), false)
    assert.deepEqual(await shared.getBuffer(recordKey), packed)
    assert.deepEqual(await store.claim(recordKey, fp, ownerToken()), { kind: 'replay', response })
    assert.deepEqual(await store.claim(recordKey, otherFp, ownerToken()), { kind: 'mismatch' })
    assert.equal((await readIdempotencyRecord(shared, recordKey))!.fp, fp.slice(0, 22))
    // The record keeps part of a SHA-256 fingerprint and the status as three digits: nothing else fits.
    for (const free of ['fp-1', `${fp}x`, `${fp.slice(0, 42)}=`])
      await assert.rejects(store.claim(recordKey, free, token), TypeError)
    await assert.rejects(store.complete(recordKey, token, { ...response, status: 1000 }), TypeError)
    assert.deepEqual(await scanKeys(shared, prefix), [recordKey])
    await app.close()
  })
})

describe('records completed as a Hash', () => {
  /** A completed record in the Hash layout, as kept before completed records were packed into one String. */
  async function hashRecord(app: FastifyInstance, key: string, fields: Record<string, string | Buffer>) {
    const recordKey = app.idempotency.recordKey('s /echo', key)
    await shared.hset(recordKey, {
      state: 'done',
      fp: requestFingerprint('POST', '/echo', { a: 1 }),
      ...fields,
    })
    await shared.pexpire(recordKey, DAY_MS)
    return recordKey
  }

  test('are replayed byte for byte until they expire, and another body is still 422', async () => {
    const { app, runs } = await pluginApp()
    const body = Buffer.from('{"run":7,"body":{"a":1}}')
    await hashRecord(app, 'hash-1', {
      status: '201',
      headers: JSON.stringify([
        ['content-type', JSON_TYPE],
        ['location', '/things/7'],
      ]),
      body,
      kept: '1',
    })
    const replay = await post(app, '/echo', 'hash-1', { a: 1 })
    assert.equal(replay.statusCode, 201)
    assert.equal(replay.headers['idempotent-replayed'], 'true')
    assert.equal(replay.headers['content-type'], JSON_TYPE)
    assert.equal(replay.headers.location, '/things/7')
    assert.deepEqual(replay.rawPayload, body)
    const mismatch = await post(app, '/echo', 'hash-1', { a: 2 })
    assert.equal(mismatch.statusCode, 422)
    assert.equal(mismatch.json().type, '/problems/idempotency-key-mismatch')
    assert.equal(runs(), 0)
    await app.close()
  })

  test('a response that was not kept still answers 410 with its original status', async () => {
    const { app, runs } = await pluginApp()
    await hashRecord(app, 'hash-2', { status: '201', headers: '[]', body: '', kept: '0' })
    const replay = await post(app, '/echo', 'hash-2', { a: 1 })
    assert.equal(replay.statusCode, 410)
    assert.equal(replay.json().type, '/problems/idempotency-response-not-kept')
    assert.equal(replay.json().originalStatus, '201')
    assert.equal(runs(), 0)
    await app.close()
  })
})

test('a record naming a common header this version does not know is not replayed without it: 503, nothing runs', async () => {
  const { app, runs } = await pluginApp()
  const recordKey = app.idempotency.recordKey('s /echo', 'unknown-1')
  const fp = requestFingerprint('POST', '/echo', { a: 1 })
  const packed = Buffer.from(`${fp.slice(0, 22)}2011[999]\n{}`)
  await shared.set(recordKey, packed, 'PX', DAY_MS)
  const answer = await post(app, '/echo', 'unknown-1', { a: 1 })
  assert.equal(answer.statusCode, 503)
  assert.equal(answer.json().type, '/problems/idempotency-store-unavailable')
  assert.equal(runs(), 0)
  assert.deepEqual(await shared.getBuffer(recordKey), packed)
  await app.close()
})
