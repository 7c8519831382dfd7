import assert from 'node:assert/strict'
import { test } from 'node:test'
import fc from 'fast-check'
import { isWellFormedId } from '../../src/plugins/session/checks.ts'

// A presented id is checked on every request by a loop over a table, not a regex: the two must
// agree on every string, the near misses above all (one character off, one too many or too few).

const ID_FORM = /^[A-Za-z0-9_-]{43}$/
const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'

test('a session id is well formed exactly when it is 43 base64url characters', () => {
  const near = fc
    .tuple(
      fc.string({ unit: fc.constantFrom(...BASE64URL), minLength: 42, maxLength: 44 }),
      fc.nat(43),
      fc.string({ unit: 'binary', minLength: 0, maxLength: 1 }),
    )
    .map(([id, at, other]) => id.slice(0, at) + other + id.slice(at + other.length))
  fc.assert(
    fc.property(fc.oneof(near, fc.string({ unit: 'binary', maxLength: 50 })), (id) => {
      assert.equal(isWellFormedId(id), ID_FORM.test(id), JSON.stringify(id))
    }),
    { numRuns: 5000 },
  )
  assert.equal(isWellFormedId('a'.repeat(43)), true)
  assert.equal(isWellFormedId(`${'a'.repeat(42)}=`), false)
  assert.equal(isWellFormedId(`${'a'.repeat(42)}\u0141`), false)
})
