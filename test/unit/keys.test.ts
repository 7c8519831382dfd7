import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { describe, test } from 'node:test'
import type { FastifyRequest } from 'fastify'
import { CACHE_KEY, CacheKeyInvalidError, cacheKey } from '../../src/plugins/cache/index.ts'
import { clientAddress, keyBy } from '../../src/plugins/rate-limit/index.ts'
import { identityTag, ipKey } from '../../src/plugins/rate-limit/keys.ts'
import { sessionHandle } from '../../src/plugins/session/store.ts'
import { hashSlot } from '../../src/redis/keys.ts'

// How the plugins turn what a request or a caller gives into Redis keys: the rate limit's client
// identities, the cache's `cacheKey`, a session's public handle and a key's Cluster slot.

/** A request carrying only what a key function reads. */
const request = (fields: { ip?: unknown; headers?: Record<string, string>; body?: unknown }) =>
  ({ headers: {}, ...fields }) as unknown as FastifyRequest

describe('clientAddress', () => {
  test('an IPv4 address is its own client', () => {
    assert.equal(clientAddress('192.0.2.7'), '192.0.2.7')
  })

  test('an IPv6 address is its /64 by default, whatever its spelling', () => {
    for (const spelling of ['2001:db8:1:2:3:4:5:6', '2001:0DB8:0001:0002::9', '2001:db8:1:2::1%eth0'])
      assert.equal(clientAddress(spelling), '2001:db8:1:2::/64', spelling)
  })

  test('other prefix lengths keep their bits, a partial group masked', () => {
    assert.equal(clientAddress('2001:db8:abcd:ef01::1', 48), '2001:db8:abcd::/48')
    assert.equal(clientAddress('2001:db8:abcd:ef01::1', 56), '2001:db8:abcd:ef00::/56')
    assert.equal(clientAddress('2001:db8:abcd:ef01::1', 4), '2000::/4')
  })

  test('128 keeps every address apart, in full form so one address has one spelling', () => {
    assert.equal(clientAddress('2001:db8::1', 128), '2001:db8:0:0:0:0:0:1')
    assert.equal(clientAddress('2001:DB8:0:0::0001', 128), '2001:db8:0:0:0:0:0:1')
  })

  test('an IPv4-mapped IPv6 address is the IPv4 address, in either form', () => {
    assert.equal(clientAddress('::ffff:192.0.2.1'), '192.0.2.1')
    assert.equal(clientAddress('::ffff:c000:201'), '192.0.2.1')
    // The dotted tail elsewhere is just another address.
    assert.equal(clientAddress('64:ff9b::192.0.2.1', 128), '64:ff9b:0:0:0:0:c000:201')
  })

  test('what does not parse is returned unchanged', () => {
    for (const text of [
      '1::2::3',
      '::ffff:300.0.0.1',
      '1:2:3:4:5:6:7',
      '1:2:3:4:5:6:7:8:9',
      '1:2:3:4::5:6:7:8',
      'g::1',
    ])
      assert.equal(clientAddress(text), text, text)
  })
})

describe('rate-limit key functions', () => {
  test('keyBy.ip prefixes its kind and groups IPv6 clients; ipKey takes another prefix length', () => {
    assert.equal(keyBy.ip(request({ ip: '192.0.2.7' })), 'ip:192.0.2.7')
    assert.equal(keyBy.ip(request({ ip: '2001:db8:1:2::7' })), 'ip:2001:db8:1:2::/64')
    assert.equal(keyBy.ip(request({ ip: undefined })), 'ip:undefined')
    assert.equal(ipKey(64), keyBy.ip)
    assert.equal(ipKey(48), ipKey(48))
    assert.equal(ipKey(48)(request({ ip: '2001:db8:1:2::7' })), 'ip:2001:db8:1::/48')
    assert.equal(ipKey(48)(request({ ip: '192.0.2.7' })), 'ip:192.0.2.7')
  })

  test('keyBy.customer keys by the principal; an anonymous request is not limited by it', () => {
    assert.equal(
      keyBy.customer(request({}), () => 'alice'),
      'customer:alice',
    )
    assert.equal(
      keyBy.customer(request({}), () => null),
      null,
    )
  })

  test('keyBy.header and keyBy.bodyField key by a non-empty string, else skip the policy', () => {
    const apiKey = keyBy.header('X-Api-Key')
    assert.equal(apiKey(request({ headers: { 'x-api-key': 'k1' } })), 'X-Api-Key:k1')
    assert.equal(apiKey(request({ headers: { 'x-api-key': '' } })), null)
    assert.equal(apiKey(request({})), null)
    const username = keyBy.bodyField('username')
    assert.equal(username(request({ body: { username: 'bob' } })), 'username:bob')
    assert.equal(username(request({ body: { username: 42 } })), null)
    assert.equal(username(request({ body: undefined })), null)
  })

  test('identityTag: 22 base64url characters of SHA-256 of the whole identity, however long', () => {
    const expected = createHash('sha256').update('ip:192.0.2.7').digest('base64url').slice(0, 22)
    assert.equal(identityTag('ip:192.0.2.7'), expected)
    assert.match(identityTag('{slot}'), /^[A-Za-z0-9_-]{22}$/)
    // Two long identities that differ only past the first 512 characters are two identities.
    const long = 'x'.repeat(600)
    assert.notEqual(identityTag(`${long}a`), identityTag(`${long}b`))
    assert.equal(
      identityTag(`${long}a`),
      createHash('sha256').update(`${long}a`).digest('base64url').slice(0, 22),
    )
    assert.notEqual(identityTag('a'), identityTag('b'))
  })
})

describe('cacheKey', () => {
  /** The documented digest: base64url SHA-256 of each part as `<UTF-8 length>:<UTF-8 bytes>`, 32 characters. */
  const digest = (...parts: string[]) => {
    const hash = createHash('sha256')
    for (const part of parts) hash.update(`${Buffer.byteLength(part)}:${part}`)
    return hash.digest('base64url').slice(0, 32)
  }

  test('safe parts stay readable, joined with dots; numbers and bigints as String() writes them', () => {
    assert.equal(cacheKey('user', 42, 'profile'), 'user:42.profile')
    assert.equal(cacheKey('user', '42', 'profile'), cacheKey('user', 42, 'profile'))
    assert.equal(cacheKey('big', 12345678901234567890n), 'big:12345678901234567890')
    assert.equal(cacheKey('a-b', 'x_y-z'), 'a-b:x_y-z')
  })

  test('other parts are hashed behind a readable prefix', () => {
    assert.equal(cacheKey('search', 'red shoes', 2), `search:red-shoes.2..${digest('red shoes', '2')}`)
    assert.equal(cacheKey('q', 'a.b'), `q:a-b..${digest('a.b')}`)
    assert.equal(cacheKey('q', ''), `q:..${digest('')}`)
  })

  test('too long for a readable id: hashed, the prefix cut, the key still valid', () => {
    const parts = Array.from({ length: 20 }, (_, i) => `part${i}`)
    const key = cacheKey('long', ...parts)
    assert.equal(key, `long:${parts.join('.').slice(0, 30)}..${digest(...parts)}`)
    assert.match(key, CACHE_KEY)
  })

  test('parts split differently never meet', () => {
    assert.notEqual(cacheKey('q', 'a:b', 'c'), cacheKey('q', 'a', 'b:c'))
    assert.notEqual(cacheKey('q', 'a b', 'c'), cacheKey('q', 'a', 'b c'))
    assert.notEqual(cacheKey('q', 'é'), cacheKey('q', 'e'))
  })

  test('refuses a bad namespace, no parts, a lone surrogate and parts of other types', () => {
    const refused: Array<[() => string, RegExp]> = [
      [() => cacheKey('User', 1), /namespace must be 1 to 32 characters.*got 'User'/],
      [() => cacheKey('', 1), /namespace must be/],
      [() => cacheKey(7 as unknown as string, 1), /got number$/],
      [() => cacheKey('user'), /needs at least one part/],
      [() => cacheKey('user', '\ud800'), /part 0 holds a lone UTF-16 surrogate/],
      [
        () => cacheKey('user', 1, Number.NaN),
        /part 1 must be a string, a finite number or a bigint, got NaN/,
      ],
      [() => cacheKey('user', null as unknown as string), /got null/],
      [() => cacheKey('user', {} as unknown as string), /got a object/],
    ]
    for (const [build, message] of refused)
      assert.throws(
        build,
        (err) => err instanceof CacheKeyInvalidError && message.test(err.message),
        String(message),
      )
  })
})

test('sessionHandle: 128 bits of SHA-256 of the id, base64url, the same for the same id', () => {
  const id = 'session-id-0123456789'
  const expected = createHash('sha256').update(id).digest().subarray(0, 16).toString('base64url')
  assert.equal(sessionHandle(id), expected)
  assert.match(sessionHandle(id), /^[A-Za-z0-9_-]{22}$/)
  assert.notEqual(sessionHandle(id), sessionHandle(`${id}x`))
})

test("hashSlot: the Redis Cluster specification's CRC16 modulo 16384", () => {
  // The specification's check value: CRC16 of "123456789" is 0x31C3.
  assert.equal(hashSlot('123456789'), 0x31c3 & 16383)
  assert.equal(hashSlot(''), 0)
  // As CLUSTER KEYSLOT answers.
  assert.equal(hashSlot('foo'), 12182)
  assert.equal(hashSlot('somekey'), 11058)
  for (const tag of ['a', 'user:42', 'ü']) {
    const slot = hashSlot(tag)
    assert.ok(Number.isInteger(slot) && slot >= 0 && slot < 16384)
  }
})
