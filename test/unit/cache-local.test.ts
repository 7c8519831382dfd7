import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { L1Cache } from '../../src/plugins/cache/l1.ts'
import { ConcurrencyLimiter } from '../../src/plugins/cache/limiter.ts'

// The cache's in-process parts: the L1 map of hot keys and the cap on concurrent loads.

describe('L1Cache', () => {
  const HOUR = 3_600_000

  test('serves what was set until it is dropped, by key or by tag', () => {
    const l1 = new L1Cache(HOUR, 10, () => true)
    l1.set('user:1', { name: 'a' }, l1.epoch, ['users', 'team:1'])
    l1.set('user:2', { name: 'b' }, l1.epoch, ['users'])
    l1.set('plain:1', 1, l1.epoch)
    assert.deepEqual(l1.get('user:1')?.value, { name: 'a' })
    l1.drop(['user:2'])
    assert.equal(l1.get('user:2'), undefined)
    l1.dropTags(['team:1'])
    assert.equal(l1.get('user:1'), undefined)
    assert.equal(l1.get('plain:1')?.value, 1)
    l1.dropTags(['users', 'no-such-tag'])
    assert.equal(l1.get('plain:1')?.value, 1)
    l1.clear()
    assert.equal(l1.get('plain:1'), undefined)
  })

  test('a value read before a drop is not stored: the drop moved the epoch on', () => {
    const l1 = new L1Cache(HOUR, 10, () => true)
    const epochAtRead = l1.epoch
    l1.drop(['user:1'])
    l1.set('user:1', 'stale', epochAtRead)
    assert.equal(l1.get('user:1'), undefined)
  })

  test('a value replaced under other tags leaves its old tags', () => {
    const l1 = new L1Cache(HOUR, 10, () => true)
    l1.set('k:1', 'old', l1.epoch, ['a'])
    l1.set('k:1', 'new', l1.epoch, ['b'])
    l1.dropTags(['a'])
    assert.equal(l1.get('k:1')?.value, 'new')
    l1.dropTags(['b'])
    assert.equal(l1.get('k:1'), undefined)
  })

  test('bounded in entries: the oldest insertion goes first', () => {
    const l1 = new L1Cache(HOUR, 2, () => true)
    l1.set('k:1', 1, l1.epoch)
    l1.set('k:2', 2, l1.epoch)
    l1.set('k:3', 3, l1.epoch)
    assert.equal(l1.get('k:1'), undefined)
    assert.equal(l1.get('k:2')?.value, 2)
    assert.equal(l1.get('k:3')?.value, 3)
  })

  test('an expired entry is not served; nothing is served while invalidations cannot arrive', () => {
    const expired = new L1Cache(0, 10, () => true)
    expired.set('k:1', 1, expired.epoch, ['t'])
    assert.equal(expired.get('k:1'), undefined)
    let coherent = true
    const l1 = new L1Cache(HOUR, 10, () => coherent)
    l1.set('k:1', 1, l1.epoch)
    coherent = false
    assert.equal(l1.get('k:1'), undefined)
    coherent = true
    assert.equal(l1.get('k:1')?.value, 1)
  })
})

describe('ConcurrencyLimiter', () => {
  test('runs at most `max` tasks at once, the others in arrival order, and passes results and errors through', async () => {
    const limiter = new ConcurrencyLimiter(2)
    let running = 0
    let most = 0
    const started: number[] = []
    const releases: Array<() => void> = []
    const task = (id: number) =>
      limiter.run(async () => {
        started.push(id)
        running++
        most = Math.max(most, running)
        await new Promise<void>((resolve) => releases.push(resolve))
        running--
        if (id === 3) throw new Error('task 3 failed')
        return id
      })
    const results = [1, 2, 3, 4, 5].map((id) => task(id).catch((err: Error) => err.message))
    // Let the first two start and the rest queue.
    await new Promise((resolve) => setImmediate(resolve))
    assert.deepEqual(started, [1, 2])
    while (releases.length > 0) {
      releases.shift()!()
      await new Promise((resolve) => setImmediate(resolve))
    }
    assert.deepEqual(await Promise.all(results), [1, 2, 'task 3 failed', 4, 5])
    assert.deepEqual(started, [1, 2, 3, 4, 5])
    assert.equal(most, 2)
    // Every slot was given back: two more run at once without waiting on anything.
    assert.deepEqual(await Promise.all([limiter.run(async () => 'a'), limiter.run(async () => 'b')]), [
      'a',
      'b',
    ])
  })
})
