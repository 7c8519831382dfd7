import assert from 'node:assert/strict'
import { test } from 'node:test'
import { randomToken } from '../../../src/plugins/common/random-token.ts'

test('pooled tokens: the asked length and encoding, never repeated across pool refills', () => {
  const seen = new Set<string>()
  // 1,000 tokens of 16 bytes span four refills of the 4 KiB pool.
  for (let i = 0; i < 1000; i++) {
    const token = randomToken(16)
    assert.match(token, /^[A-Za-z0-9_-]{22}$/)
    seen.add(token)
  }
  assert.equal(seen.size, 1000)
  assert.match(randomToken(16, 'hex'), /^[0-9a-f]{32}$/)
  assert.match(randomToken(12), /^[A-Za-z0-9_-]{16}$/)
})
