import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import {
  SessionFieldNameError,
  SessionTooLargeError,
  SessionValueError,
} from '../../src/plugins/session/errors.ts'
import {
  checkFieldName,
  decodeField,
  encodeField,
  fieldBytes,
  isReservedField,
  MAX_FIELD_BYTES,
} from '../../src/plugins/session/session.ts'

// What a session field may be named and hold, checked before anything is sent to Redis.

describe('field names', () => {
  test('1-64 of A-Z a-z 0-9 _ . : -, not starting with . : or -', () => {
    for (const name of ['cart', 'a', 'user.theme', 'v2:flags', '_x', 'x'.repeat(64)]) checkFieldName(name)
    for (const name of ['', '.a', ':a', '-a', 'a b', 'é', 'x'.repeat(65), 42, undefined])
      assert.throws(() => checkFieldName(name), SessionFieldNameError, String(name))
  })

  test("the store's own fields and names starting with __ are reserved", () => {
    assert.equal(isReservedField('_principal'), true)
    assert.equal(isReservedField('__idleTimeoutMs'), true)
    assert.equal(isReservedField('_theme'), false)
    assert.throws(() => checkFieldName('_createdAt'), /Session field name '_createdAt' is reserved/)
    assert.throws(() => checkFieldName('__mine'), /is reserved/)
  })
})

describe('field values', () => {
  test('JSON values round-trip through their encoding', () => {
    const values = [null, true, 0, -1.5, '', 'text', [], [1, [2, { a: 'b' }]], { nested: { list: [null] } }]
    for (const value of values) assert.deepEqual(decodeField(encodeField('f', value)), value)
    assert.deepEqual(decodeField(encodeField('f', Object.create(null))), {})
  })

  test('what JSON would not give back unchanged is refused, naming the field and what it holds', () => {
    const refused: Array<[unknown, RegExp]> = [
      [undefined, /it holds undefined/],
      [{ a: undefined }, /it holds undefined/],
      [new Array(2), /it holds undefined/],
      [() => 1, /it holds function/],
      [Symbol('s'), /it holds symbol/],
      [10n, /it holds bigint/],
      [Number.NaN, /it holds NaN/],
      [{ n: Number.POSITIVE_INFINITY }, /it holds Infinity/],
      [new Date(0), /an instance of Date/],
      [new Map(), /an instance of Map/],
      [{ [Symbol('k')]: 1 }, /a symbol key/],
    ]
    for (const [value, message] of refused)
      assert.throws(
        () => encodeField('cart', value),
        (err) =>
          err instanceof SessionValueError &&
          /^Session field 'cart'/.test(err.message) &&
          message.test(err.message),
        String(message),
      )
  })

  test('a value over MAX_FIELD_BYTES of JSON is refused, counted in UTF-8 bytes; a cycle too', () => {
    encodeField('f', 'x'.repeat(MAX_FIELD_BYTES - 2))
    assert.throws(() => encodeField('f', 'x'.repeat(MAX_FIELD_BYTES - 1)), SessionTooLargeError)
    assert.throws(() => encodeField('f', 'é'.repeat(MAX_FIELD_BYTES / 2)), SessionTooLargeError)
    assert.throws(() => encodeField('f', new Array(MAX_FIELD_BYTES + 1).fill(0)), SessionTooLargeError)
    const cyclic: Record<string, unknown> = {}
    cyclic.self = cyclic
    assert.throws(() => encodeField('f', cyclic), SessionTooLargeError)
  })

  test('a stored value that is not JSON reads back as the string it is; bytes count name and value', () => {
    assert.equal(decodeField('not json'), 'not json')
    assert.equal(fieldBytes('é', '"x"'), 2 + 3)
  })
})
