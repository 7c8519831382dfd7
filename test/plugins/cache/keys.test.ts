import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { cacheKey as rootCacheKey } from '../../../src/index.ts'
import cachePlugin, { CACHE_KEY, CacheKeyInvalidError, cacheKey } from '../../../src/plugins/cache/index.ts'
import { connectRedis, createRedisClient } from '../../../src/plugins/redis/index.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

// Golden values: the scheme is documented (docs/cache.md, "Keys") and keys persist in Redis across
// deploys, so a change of any of these is a change of every hashed key a user has stored.
const GOLDEN: Array<[string, Array<string | number | bigint>, string]> = [
  ['user', [42, 'profile'], 'user:42.profile'],
  ['product', ['sku_123-A'], 'product:sku_123-A'],
  ['big', [10n], 'big:10'],
  ['search', ['q=red shoes&page=2'], 'search:q-red-shoes-page-2..XyloKKufCuGbgmmkOVOwooc9QGZuAEAk'],
  ['a', ['a:b', 'c'], 'a:a-b.c..HC3hij7zwM3M40lfeQOv-W8PqRxqhiCV'],
  ['a', ['a', 'b:c'], 'a:a.b-c..gEU2tjsEm03NK8_t0pgumyhzbYP9_tpH'],
  ['a', ['a.b', 'c'], 'a:a-b.c..50BUhcJfaVpUVgI4ICmc9v7jHxKqtcvn'],
  ['a', ['a', 'b.c'], 'a:a.b-c..NbEz_VD8Eur1z_WcUnAz_C5TM_2Y60tn'],
  ['report', ['x'.repeat(100)], 'report:xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..YfAwlvH4sCmn3_7Waib0j9ZFPDGG5fC5'],
  [
    'user',
    ['alice@example.com', 'settings'],
    'user:alice-example-com.settings..NLIAdH9n0Ce6yhSJVxacEBNhozRLXqqt',
  ],
  ['tenant', ['{acme}', 'orders'], 'tenant:-acme-.orders..Pbd3iT026QcU66tGEFMZoH9NPvETB8YW'],
  ['a', [''], 'a:..unaLMx_YbOyAO-BOVqsrPUwOmO9O5PzU'],
  ['a', ['é'], 'a:-..LyPHGFZYfCpv_bZPDhHplAs12jGJRzCP'],
]

describe('cacheKey', () => {
  test('fixed parts give fixed keys (golden values), from the cache module and the package root', () => {
    for (const [namespace, parts, expected] of GOLDEN) {
      assert.equal(cacheKey(namespace, ...parts), expected)
      assert.equal(rootCacheKey(namespace, ...parts), expected)
      assert.match(expected, CACHE_KEY)
    }
  })

  test('the digest is the documented one: base64url SHA-256 of length-prefixed UTF-8 parts, 32 characters', () => {
    const digest = (encoded: string) =>
      createHash('sha256').update(encoded, 'utf8').digest('base64url').slice(0, 32)
    assert.equal(cacheKey('a', 'a:b', 'c'), `a:a-b.c..${digest('3:a:b1:c')}`)
    assert.equal(cacheKey('a', 'é'), `a:-..${digest('2:é')}`)
  })

  test('short safe parts stay readable', () => {
    assert.equal(cacheKey('account', 7), 'account:7')
    assert.equal(cacheKey('feed', 'user_1', 'page-2', 30), 'feed:user_1.page-2.30')
    assert.equal(cacheKey('n', 'x'.repeat(64)), `n:${'x'.repeat(64)}`)
    assert.equal(cacheKey('n', 42), cacheKey('n', '42'))
  })

  test('differently split parts never give the same key', () => {
    const splits: string[][] = [
      ['a:b', 'c'],
      ['a', 'b:c'],
      ['a:b:c'],
      ['a.b', 'c'],
      ['a', 'b.c'],
      ['a.b.c'],
      ['a', 'b', 'c'],
      ['ab', 'c'],
      ['a', 'bc'],
      ['abc'],
      ['a', '', 'bc'],
      ['', 'abc'],
      ['abc', ''],
      ['1:a', 'b'],
      ['1', 'ab'],
      ['a-b', 'c'],
      ['a_b', 'c'],
    ]
    const keys = splits.map((parts) => cacheKey('ns', ...parts))
    assert.equal(new Set(keys).size, splits.length, keys.join('\n'))
  })

  test('any parts give a valid key of bounded length', () => {
    const samples: string[][] = [
      ['x'.repeat(10_000)],
      Array.from({ length: 200 }, (_, i) => `part${i}`),
      ['{hash-tag}', 'with space', '\u0000\n\t', '💥', '../..', '#'],
      ['x'.repeat(64), 'y'],
    ]
    for (const parts of samples) {
      const key = cacheKey('a-namespace-of-32-characters-xyz', ...parts)
      assert.match(key, CACHE_KEY)
      assert.ok(key.length <= 97, key)
      assert.ok(key.includes('..'), key)
    }
  })

  test('refuses an invalid namespace, no parts, and parts that are not strings or numbers', () => {
    const refused: Array<() => string> = [
      () => cacheKey('User', 1),
      () => cacheKey('', 1),
      () => cacheKey('user:x', 1),
      () => cacheKey('user'),
      () => cacheKey('user', Number.NaN),
      () => cacheKey('user', Number.POSITIVE_INFINITY),
      () => cacheKey('user', null as unknown as string),
      () => cacheKey('user', { id: 1 } as unknown as string),
      () => cacheKey('user', '\uD800'),
    ]
    for (const call of refused)
      assert.throws(call, (err: CacheKeyInvalidError) => {
        assert.ok(err instanceof CacheKeyInvalidError)
        assert.equal(err.code, 'FRG_CACHE_KEY_INVALID')
        return true
      })
  })
})

describe('cacheKey with getOrLoad', () => {
  const redis = createRedisClient(testRedisConnection())
  const keyPrefix = uniquePrefix('ck')
  let app: FastifyInstance
  before(async () => {
    await connectRedis(redis)
    app = Fastify()
    await app.register(cachePlugin, { redis, keyPrefix })
    await app.ready()
  })
  after(async () => {
    await app.close()
    // One DEL per key: on a Cluster the keys live in different slots.
    await Promise.all((await scanKeys(redis, keyPrefix)).map((key) => redis.del(key)))
    redis.disconnect()
  })

  test('a long composite key is refused raw and accepted hashed; the second read is a hit', async () => {
    const parts = ['tenant/acme', 'report:2024-01', 'x'.repeat(120)]
    const raw = `report:${parts.join(':')}`
    assert.throws(() => app.cache.getOrLoad(raw, async () => 1), CacheKeyInvalidError)
    let loads = 0
    const load = async () => ({ rows: ++loads })
    const key = cacheKey('report', ...parts)
    assert.deepEqual(await app.cache.getOrLoad(key, load), { rows: 1 })
    assert.deepEqual(await app.cache.getOrLoad(cacheKey('report', ...parts), load), { rows: 1 })
    assert.equal(loads, 1)
    assert.deepEqual(await app.cache.get(key), { rows: 1 })
    assert.ok((await scanKeys(redis, keyPrefix)).some((stored) => stored.includes(`{${key}}`)))
  })

  test('a short safe key is stored readable', async () => {
    const key = cacheKey('user', 42, 'profile')
    assert.equal(await app.cache.getOrLoad(key, async () => 'ada'), 'ada')
    assert.ok((await scanKeys(redis, keyPrefix)).includes(`${keyPrefix}{user:42.profile}:v`))
  })
})
