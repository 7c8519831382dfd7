import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import { after, before, describe, test } from 'node:test'
import fc from 'fast-check'
import Fastify from 'fastify'
import idempotency from '../../../src/plugins/idempotency/index.ts'
import { parseIdempotencyKey, parseSfString } from '../../../src/plugins/idempotency/key.ts'
import { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { answerProblems } from '../../helpers/plain-app.ts'

// The string vectors of the HTTP Working Group's structured-field-tests (test/fixtures/structured-field-tests).
interface Vector {
  name: string
  raw: string[]
  header_type: string
  expected?: [string, unknown[]]
  must_fail?: boolean
  can_fail?: boolean
}

const FILES = ['string.json', 'string-generated.json']
const vectors = (file: string): Vector[] =>
  JSON.parse(readFileSync(new URL(`../../fixtures/structured-field-tests/${file}`, import.meta.url), 'utf8'))

/** A field sent on several lines reaches the parser as one value, the lines joined by ", ". */
const fieldValue = (vector: Vector) => vector.raw.join(', ')

// Where parseIdempotencyKey parts from the sf-string parser, by vector name:
/** Not an sf-string (no DQUOTE), but visible ASCII: a bare key, as the plugin also accepts. */
const BARE_KEYS = new Set(['single quoted string'])
/** A valid sf-string the plugin refuses as a key: empty, or over 255 characters decoded. */
const NOT_A_KEY = new Set(['empty string', 'long string'])

describe('RFC 8941 string vectors', () => {
  for (const file of FILES) {
    test(`${file}: parseSfString decodes every valid vector and refuses every must_fail one`, () => {
      for (const vector of vectors(file)) {
        assert.equal(vector.header_type, 'item', vector.name)
        const decoded = parseSfString(fieldValue(vector))
        if (vector.must_fail) assert.equal(decoded, null, vector.name)
        else assert.equal(decoded, vector.expected![0], vector.name)
      }
    })

    test(`${file}: parseIdempotencyKey agrees, but for bare keys and keys empty or over 255 characters`, () => {
      const all = vectors(file)
      for (const vector of all) {
        const field = fieldValue(vector)
        const key = parseIdempotencyKey(field)
        if (BARE_KEYS.has(vector.name)) assert.equal(key, field, vector.name)
        else if (NOT_A_KEY.has(vector.name)) {
          assert.ok(!vector.must_fail, vector.name)
          const length = vector.expected![0].length
          assert.ok(length === 0 || length > 255, vector.name)
          assert.equal(key, null, vector.name)
        } else if (vector.must_fail) assert.equal(key, null, vector.name)
        else assert.equal(key, vector.expected![0], vector.name)
      }
      // The exceptions named above are all string.json's; the generated file has one vector per byte.
      const names = new Set(all.map((vector) => vector.name))
      if (file === 'string.json')
        for (const name of [...BARE_KEYS, ...NOT_A_KEY]) assert.ok(names.has(name), name)
      else assert.equal(all.length, 256)
    })
  }
})

describe('parseIdempotencyKey', () => {
  /** RFC 8941 §4.1.6: a string serialised, `"` and `\` escaped. */
  const serialised = (value: string) => `"${value.replace(/[\\"]/g, (c) => `\\${c}`)}"`
  const printable = fc.string({
    unit: fc.integer({ min: 0x20, max: 0x7e }).map((code) => String.fromCharCode(code)),
    minLength: 1,
    maxLength: 255,
  })

  test('every string of 1 to 255 printable ASCII characters, serialised, is decoded to itself', () => {
    fc.assert(fc.property(printable, (value) => parseIdempotencyKey(serialised(value)) === value))
  })

  test('spaces inside the quotes; 255 characters decoded at most, escapes counted once', () => {
    assert.equal(parseIdempotencyKey('"order 42"'), 'order 42')
    assert.equal(parseIdempotencyKey('" "'), ' ')
    assert.equal(parseIdempotencyKey(serialised('"'.repeat(255))), '"'.repeat(255))
    assert.equal(parseIdempotencyKey(serialised('\\'.repeat(256))), null)
    assert.equal(parseIdempotencyKey(`"${'a'.repeat(255)}"`), 'a'.repeat(255))
    assert.equal(parseIdempotencyKey(`"${'a'.repeat(256)}"`), null)
    for (const refused of ['""', 'order 42', ' "order 42"', '"order 42" ', '"a";p=1', '"a", "b"'])
      assert.equal(parseIdempotencyKey(refused), null, refused)
  })
})

describe('a key with a space over HTTP', () => {
  let redis: RedisClient
  before(() => {
    redis = createRedisClient(testRedisConnection())
  })
  after(() => redis.quit())

  test('Idempotency-Key: "order 42" runs once (201) and its retry is a replay; "" is a 400 saying why', async (t) => {
    const app = Fastify()
    t.after(() => app.close())
    answerProblems(app)
    await app.register(idempotency, { redis, keyPrefix: uniquePrefix('idemkey') })
    let runs = 0
    app.post('/orders', { config: { idempotency: true } }, async (request, reply) =>
      reply.code(201).send({ run: ++runs, key: request.idempotency?.key }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/orders`
    const post = (key: string) =>
      fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: '{"item":"book"}',
      })

    const first = await post('"order 42"')
    assert.equal(first.status, 201)
    assert.deepEqual(await first.json(), { run: 1, key: 'order 42' })
    const retry = await post('"order 42"')
    assert.equal(retry.status, 201)
    assert.equal(retry.headers.get('idempotent-replayed'), 'true')
    assert.deepEqual(await retry.json(), { run: 1, key: 'order 42' })
    assert.equal(runs, 1)

    const empty = await post('""')
    assert.equal(empty.status, 400)
    const problem = (await empty.json()) as { type: string; code: string; detail: string }
    assert.equal(problem.type, '/problems/idempotency-key-invalid')
    assert.equal(problem.code, 'FRG_IDEMPOTENCY_KEY_INVALID')
    assert.match(problem.detail, /1 to 255 characters.*An empty string is not a key/)
    assert.equal(runs, 1)
  })
})
