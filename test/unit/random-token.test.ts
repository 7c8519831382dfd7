import assert from 'node:assert/strict'
import { test } from 'node:test'
import { randomToken } from '../../src/plugins/common/random-token.ts'

// Tokens cut from a pool of CSPRNG bytes: each the asked size, whatever is left in the pool.

test('a token never runs past the pool: one that does not fit is cut from a fresh one', () => {
  for (const bytes of [1, 3, 4000, 4096, 4095, 17]) {
    const token = randomToken(bytes, 'hex')
    assert.equal(token.length, bytes * 2, `${bytes} bytes`)
    assert.match(token, /^[0-9a-f]+$/)
  }
})

test('base64url tokens are the length their byte count gives, without padding', () => {
  assert.equal(randomToken(12).length, 16)
  assert.equal(randomToken(16).length, 22)
  assert.equal(randomToken(32).length, 43)
  assert.match(randomToken(32), /^[A-Za-z0-9_-]+$/)
})

test('two whole-pool tokens in a row differ', () => {
  assert.notEqual(randomToken(4096), randomToken(4096))
})
