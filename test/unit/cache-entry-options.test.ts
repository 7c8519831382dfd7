import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { encodeValue, lifetimes } from '../../src/plugins/cache/entry.ts'
import {
  checkRead,
  checkSet,
  resolveReadOptions,
  resolveSetOptions,
} from '../../src/plugins/cache/entry-options.ts'
import { CacheValueNotJsonError } from '../../src/plugins/cache/errors.ts'
import type { CacheSettings } from '../../src/plugins/cache/types.ts'
import { InvalidOptionError, UnknownOptionError } from '../../src/plugins/common/errors.ts'

// A call's options over the plugin's, and what an entry's lifetimes come to: no Redis involved.

const settings: CacheSettings = {
  keyPrefix: 'cache:',
  ttlMs: 60_000,
  jitter: 0,
  staleWhileRevalidateMs: 10_000,
  earlyRefreshBeta: 0,
  negativeTtlMs: 5000,
  leaseTtlMs: 5000,
  leaseWaitMs: 2000,
  fence: true,
  softTimeoutMs: 100,
  hardTimeoutMs: 0,
  onLoadError: 'serve-stale',
  serialize: JSON.stringify,
  deserialize: JSON.parse,
}

describe('a getOrLoad call', () => {
  test('without options takes every one from the plugin', () => {
    assert.deepEqual(resolveReadOptions(settings, {}, undefined), {
      ttlMs: 60_000,
      notFoundTtlMs: 5000,
      tags: undefined,
      softTimeoutMs: 100,
      hardTimeoutMs: 0,
      onLoadError: 'serve-stale',
      admit: undefined,
    })
  })

  test("overrides each option it gives, 0 included; its ttlMs is a value's, not a not-found's", () => {
    const admit = async () => true
    const options = { ttlMs: 1000, softTimeoutMs: 0, hardTimeoutMs: 300, onLoadError: 'fail' as const, admit }
    assert.deepEqual(resolveReadOptions(settings, options, ['a']), {
      ttlMs: 1000,
      notFoundTtlMs: 5000,
      tags: ['a'],
      softTimeoutMs: 0,
      hardTimeoutMs: 300,
      onLoadError: 'fail',
      admit,
    })
  })

  test('has its tags checked, deduplicated and sorted', () => {
    assert.deepEqual(checkRead('user:1', { tags: ['user:1', 'products', 'user:1'] }), ['products', 'user:1'])
    assert.equal(checkRead('user:1', { tags: [] }), undefined)
    assert.equal(checkRead('user:1'), undefined)
  })

  test("refuses another library's option name with ours, and a wrong value", () => {
    assert.throws(
      () => checkRead('user:1', { ttl: 5 } as never),
      (err: unknown) => err instanceof UnknownOptionError && err.message.includes('`ttlMs`'),
    )
    assert.throws(() => checkRead('user:1', { hardTimeoutMs: -1 }), InvalidOptionError)
    assert.throws(() => checkRead('user:1', { onLoadError: 'retry' as never }), InvalidOptionError)
  })
})

describe('a set call', () => {
  test("gives its ttlMs to a not-found too; without one, the plugin's two lifetimes", () => {
    assert.deepEqual(resolveSetOptions(settings, { ttlMs: 1000 }, undefined), {
      ttlMs: 1000,
      notFoundTtlMs: 1000,
      tags: undefined,
    })
    assert.deepEqual(resolveSetOptions(settings, {}, ['t']), {
      ttlMs: 60_000,
      notFoundTtlMs: 5000,
      tags: ['t'],
    })
  })

  test('knows only ttlMs and tags', () => {
    assert.deepEqual(checkSet('user:1', { tags: ['b', 'a'] }), ['a', 'b'])
    assert.throws(() => checkSet('user:1', { softTimeoutMs: 5 } as never), UnknownOptionError)
  })
})

describe("an entry's lifetimes", () => {
  const entry = resolveReadOptions(settings, {}, undefined)

  test('a value is served stale for staleWhileRevalidateMs past its soft TTL; a not-found is not', () => {
    assert.deepEqual(lifetimes(settings, entry, false), [60_000, 70_000])
    assert.deepEqual(lifetimes(settings, entry, true), [5000, 5000])
  })

  test('jitter lengthens the soft TTL by at most its fraction', () => {
    const jittered = { ...settings, jitter: 0.5 }
    for (let i = 0; i < 50; i++) {
      const [soft, hard] = lifetimes(jittered, entry, false)
      assert.ok(soft >= 60_000 && soft <= 90_000, String(soft))
      assert.equal(hard, soft + 10_000)
    }
  })
})

describe("an entry's payload", () => {
  test('is what the serializer writes', () => {
    assert.equal(encodeValue(settings, 'user:1', { a: 1 }), '{"a":1}')
  })

  test('a value the serializer cannot hold, or a serializer that returns no string, is refused', () => {
    assert.throws(() => encodeValue(settings, 'user:1', { n: 1n }), CacheValueNotJsonError)
    assert.throws(() => encodeValue(settings, 'user:1', undefined), CacheValueNotJsonError)
    const numbers = { ...settings, serialize: (() => 42) as unknown as CacheSettings['serialize'] }
    assert.throws(
      () => encodeValue(numbers, 'user:1', 'x'),
      (err: unknown) => err instanceof CacheValueNotJsonError && err.message.includes('expected a string'),
    )
  })
})
