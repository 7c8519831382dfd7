import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import {
  canonicalJson,
  FingerprintTooLargeError,
  parseIdempotencyKey,
  parseSfString,
  requestFingerprint,
  valueFingerprint,
} from '../../src/plugins/idempotency/key.ts'

// What the idempotency plugin reads from a request before it asks Redis anything: the key as sent
// (bare or an RFC 8941 string) and the fingerprint the key is bound to.

describe('parseIdempotencyKey', () => {
  test('a bare key of visible ASCII is the key as it is', () => {
    assert.equal(parseIdempotencyKey('order-42'), 'order-42')
    assert.equal(parseIdempotencyKey('a'), 'a')
    assert.equal(parseIdempotencyKey('~!#$%'), '~!#$%')
  })

  test('a quoted key is decoded, so both spellings name one key; spaces only inside the quotes', () => {
    assert.equal(parseIdempotencyKey('"order 42"'), 'order 42')
    assert.equal(parseIdempotencyKey('"order-42"'), parseIdempotencyKey('order-42'))
    assert.equal(parseIdempotencyKey('"say \\"hi\\" \\\\o/"'), 'say "hi" \\o/')
    assert.equal(parseIdempotencyKey('order 42'), null)
  })

  test('empty, too long, not a string or not well formed: no key', () => {
    for (const raw of ['', '""', '"x"y', '"x', 'x\u00e9', '"\\n"', undefined, 42, ['a']])
      assert.equal(parseIdempotencyKey(raw), null, JSON.stringify(raw))
    assert.equal(parseIdempotencyKey('k'.repeat(255))?.length, 255)
    assert.equal(parseIdempotencyKey('k'.repeat(256)), null)
    // Escapes count once: 255 characters decoded from 510 escaped ones is still a key.
    assert.equal(parseIdempotencyKey(`"${'\\"'.repeat(255)}"`), '"'.repeat(255))
    assert.equal(parseIdempotencyKey(`"${'\\"'.repeat(256)}"`), null)
  })

  test('parseSfString: the whole field one string, nothing before or after it', () => {
    assert.equal(parseSfString('""'), '')
    assert.equal(parseSfString('"a\\\\b"'), 'a\\b')
    assert.equal(parseSfString('"a";p=1'), null)
    assert.equal(parseSfString('a'), null)
    assert.equal(parseSfString('"\\'), null)
    assert.equal(parseSfString('"tab\there"'), null)
  })
})

describe('canonicalJson', () => {
  test('object keys sorted at every depth; arrays keep their order', () => {
    assert.equal(canonicalJson({ b: 1, a: { d: [3, 1], c: null } }), '{"a":{"c":null,"d":[3,1]},"b":1}')
    assert.equal(canonicalJson({ a: 1, b: 2 }), canonicalJson({ b: 2, a: 1 }))
  })

  test('as JSON.stringify writes them: undefined fields left out, undefined items null, toJSON used', () => {
    assert.equal(canonicalJson({ a: undefined, b: [undefined, 1] }), '{"b":[null,1]}')
    assert.equal(canonicalJson(new Date(0)), '"1970-01-01T00:00:00.000Z"')
    assert.equal(canonicalJson(undefined), 'null')
    assert.equal(canonicalJson('x'), '"x"')
  })

  test('values JSON would merge are kept apart: Infinity, NaN, bigints, regular expressions', () => {
    assert.equal(canonicalJson([Number.POSITIVE_INFINITY, Number.NaN, null]), '[Infinity,NaN,null]')
    assert.equal(canonicalJson({ n: 10n }), '{"n":10n}')
    assert.equal(canonicalJson(/a+/g), '"/a+/g"')
  })

  test('nesting deeper than the call stack allows is written all the same', () => {
    let deep: unknown = 0
    for (let i = 0; i < 100_000; i++) deep = [deep]
    const json = canonicalJson(deep)
    assert.equal(json.length, 200_001)
    assert.ok(json.startsWith('[[[') && json.endsWith(']]]'))
  })
})

describe('requestFingerprint', () => {
  const base = requestFingerprint('POST', '/orders/:id', { amount: 1 }, { params: { id: '1' } })

  test('the same request gives the same fingerprint, whatever the order of its fields', () => {
    assert.equal(requestFingerprint('POST', '/orders/:id', { amount: 1 }, { params: { id: '1' } }), base)
    const query = requestFingerprint('GET', '/r', null, { query: { a: '1', b: '2' } })
    assert.equal(requestFingerprint('GET', '/r', null, { query: { b: '2', a: '1' } }), query)
    assert.match(base, /^[A-Za-z0-9_-]{43}$/)
  })

  test('another method, route, target or body is another request', () => {
    const others = [
      requestFingerprint('PUT', '/orders/:id', { amount: 1 }, { params: { id: '1' } }),
      requestFingerprint('POST', '/orders/:ref', { amount: 1 }, { params: { id: '1' } }),
      requestFingerprint('POST', '/orders/:id', { amount: 1 }, { params: { id: '2' } }),
      requestFingerprint('POST', '/orders/:id', { amount: 1 }, { params: { id: '1' }, query: { x: '1' } }),
      requestFingerprint(
        'POST',
        '/orders/:id',
        { amount: 1 },
        { params: { id: '1' }, constraints: { version: '2' } },
      ),
      requestFingerprint('POST', '/orders/:id', { amount: 2 }, { params: { id: '1' } }),
    ]
    assert.equal(new Set([base, ...others]).size, others.length + 1)
  })

  test('a text or binary body is hashed as its bytes, apart from a JSON body that reads the same', () => {
    const text = requestFingerprint('POST', '/r', 'abc')
    assert.equal(requestFingerprint('POST', '/r', Buffer.from('abc')), text)
    assert.notEqual(requestFingerprint('POST', '/r', '"abc"'), text)
    assert.notEqual(requestFingerprint('POST', '/r', { toJSON: () => 'abc' }), text)
  })

  test('a large body is hashed whole: a change at its end is another request', () => {
    const items = Array.from({ length: 20_000 }, (_, i) => ({ i }))
    const large = requestFingerprint('POST', '/r', items)
    items[items.length - 1] = { i: -1 }
    assert.notEqual(requestFingerprint('POST', '/r', items), large)
  })
})

describe('valueFingerprint', () => {
  test('equal values fingerprint alike, different ones not', () => {
    assert.equal(valueFingerprint({ a: 1, b: [2] }, 1000), valueFingerprint({ b: [2], a: 1 }, 1000))
    assert.notEqual(valueFingerprint([1, 2], 1000), valueFingerprint([2, 1], 1000))
  })

  test('a value whose JSON outgrows the bound, or never ends, is a FingerprintTooLargeError', () => {
    assert.throws(() => valueFingerprint('x'.repeat(100), 50), FingerprintTooLargeError)
    const cyclic: Record<string, unknown> = {}
    cyclic.self = cyclic
    assert.throws(() => valueFingerprint(cyclic, 1_000_000), /over 1000000 characters of JSON/)
    assert.equal(typeof valueFingerprint('x'.repeat(40), 50), 'string')
  })
})
