import assert from 'node:assert/strict'
import { test } from 'node:test'
import { MemoryStore } from '../../src/plugins/rate-limit/memory.ts'
import type {
  Algorithm,
  BlockCall,
  Operation,
  PenaltyCall,
  PolicyCall,
  Quota,
} from '../../src/plugins/rate-limit/protocol.ts'

// The memory store against a clock the test moves: every algorithm's decisions, retry times,
// blocks and penalties as time passes, without waiting and without Redis.

/** A store on a clock that starts at `start` ms and moves only when the test says so. */
function storeAt(start: number, maxKeys = 100) {
  const clock = { now: start }
  const store = new MemoryStore(maxKeys, () => clock.now)
  return { store, clock }
}

const windowQuota = (limit: number, windowMs: number): Quota => ({ limit, windowMs, refillPerSecond: 0 })
const bucketQuota = (capacity: number, refillPerSecond: number): Quota => ({
  limit: capacity,
  windowMs: 0,
  refillPerSecond,
})

function ask(
  store: MemoryStore,
  algorithm: Algorithm,
  operation: Operation,
  policy: Omit<PolicyCall, 'maxDelayMs' | 'refundWindow'> & Partial<PolicyCall>,
  extra: { blocks?: BlockCall[]; penalties?: PenaltyCall[]; nonce?: string } = {},
) {
  const reply = store.answer(algorithm, {
    operation,
    nonce: extra.nonce ?? '',
    policies: [{ maxDelayMs: 0, refundWindow: 0, ...policy }],
    blocks: extra.blocks ?? [],
    penalties: extra.penalties ?? [],
  })
  const [first] = reply.policies
  return { allowed: reply.allowed, delayMs: reply.delayMs, ...first }
}

test('fixed window: the limit holds inside the window, and the next window starts afresh', (t) => {
  const { store, clock } = storeAt(1_000_000)
  t.after(() => store.close())
  const consume = () =>
    ask(store, 'fixed-window', 'consume', { key: 'k', quota: windowQuota(2, 1000), cost: 1 })
  assert.deepEqual([consume().allowed, consume().allowed], [true, true])
  clock.now += 200
  const rejected = consume()
  assert.equal(rejected.allowed, false)
  assert.equal(rejected.remaining, 0)
  assert.equal(rejected.retryMs, 800, 'until the window that began 200 ms ago ends')
  assert.equal(store.inspect('k')?.n, 2, 'a rejected request is not counted')
  clock.now += 800
  const next = consume()
  assert.equal(next.allowed, true)
  assert.equal(next.remaining, 1)
  assert.equal(next.resetMs, 1000)
})

test('fixed window: a refund inside the window gives the cost back', (t) => {
  const { store, clock } = storeAt(1_000_000)
  t.after(() => store.close())
  const policy = { key: 'k', quota: windowQuota(10, 60_000), cost: 2 }
  const consumed = ask(store, 'fixed-window', 'consume', policy)
  assert.equal(consumed.refundWindow, 60_000)
  clock.now += 1000
  ask(store, 'fixed-window', 'consume', policy)
  assert.equal(store.inspect('k')?.n, 4)
  ask(store, 'fixed-window', 'refund', { ...policy, refundWindow: consumed.refundWindow })
  assert.equal(store.inspect('k')?.n, 2)
})

test('sliding log: a rejected request may retry when its oldest counted request leaves the window', (t) => {
  const { store, clock } = storeAt(10_000)
  t.after(() => store.close())
  const consume = () =>
    ask(store, 'sliding-log', 'consume', { key: 'log', quota: windowQuota(2, 1000), cost: 1 })
  consume()
  clock.now += 300
  consume()
  clock.now += 200
  const rejected = consume()
  assert.equal(rejected.allowed, false)
  assert.equal(rejected.retryMs, 500)
  assert.equal(store.inspect('log')?.times?.length, 2, 'rejections are not logged')
  clock.now += 500
  const later = consume()
  assert.equal(later.allowed, true, 'the first request left the window')
  assert.equal(later.remaining, 0)
})

test('sliding counter: the previous window weighs by how much of it the sliding window still covers', (t) => {
  const { store, clock } = storeAt(1_000_000)
  t.after(() => store.close())
  const policy = (cost: number) => ({ key: 'sc', quota: windowQuota(10, 1000), cost })
  ask(store, 'sliding-counter', 'consume', policy(6))
  // A quarter into the next window: 6 * 0.75 = 4.5 of the previous window still counts.
  clock.now += 1250
  const admitted = ask(store, 'sliding-counter', 'consume', policy(5))
  assert.equal(admitted.allowed, true)
  assert.equal(admitted.remaining, 0, 'floor(10 - 9.5)')
  assert.equal(admitted.resetMs, 750)
  assert.equal(admitted.refundWindow, 1001, 'the window index')
  const peeked = ask(store, 'sliding-counter', 'peek', policy(1))
  assert.equal(peeked.allowed, false)
  // Free once the previous window's weight drops to (10 - 5 - 1) / 6: at 334 ms into the window.
  assert.equal(peeked.retryMs, 84)
})

test('token bucket: an empty bucket refills with time; maxDelayMs turns a rejection into a wait', (t) => {
  const { store, clock } = storeAt(5_000_000)
  t.after(() => store.close())
  const quota = bucketQuota(4, 2)
  const drained = ask(store, 'token-bucket', 'consume', { key: 'b', quota, cost: 4 })
  assert.equal(drained.remaining, 0)
  assert.equal(drained.resetMs, 2000, 'full again in 4 tokens / 2 per second')
  const rejected = ask(store, 'token-bucket', 'consume', { key: 'b', quota, cost: 1 })
  assert.equal(rejected.allowed, false)
  assert.equal(rejected.retryMs, 500)
  const delayed = ask(store, 'token-bucket', 'consume', { key: 'b', quota, cost: 1, maxDelayMs: 1000 })
  assert.equal(delayed.allowed, true)
  assert.equal(delayed.delayMs, 500, 'the token is reserved: wait for it')
  clock.now += 1000
  const refilled = ask(store, 'token-bucket', 'consume', { key: 'b', quota, cost: 1 })
  assert.equal(refilled.allowed, true, 'two tokens came in, one was reserved')
  assert.equal(store.inspect('b')?.n, 0)
})

test('gcra: a burst of the limit, then one request per interval', (t) => {
  const { store, clock } = storeAt(1_000_000)
  t.after(() => store.close())
  const consume = () => ask(store, 'gcra', 'consume', { key: 'g', quota: windowQuota(2, 1000), cost: 1 })
  assert.deepEqual([consume().remaining, consume().remaining], [1, 0])
  const rejected = consume()
  assert.equal(rejected.allowed, false)
  assert.equal(rejected.retryMs, 500, 'one interval: 1000 ms / 2')
  clock.now += 500
  assert.equal(consume().allowed, true)
  assert.equal(consume().allowed, false)
})

test('blocks: going over starts the block; while it lasts nothing is counted; it ends with its time', (t) => {
  const { store, clock } = storeAt(2_000_000)
  t.after(() => store.close())
  const policy = { key: 'k', quota: windowQuota(1, 1000), cost: 1 }
  const blocks = [{ policy: 0, key: 'k:block', blockMs: 5000 }]
  ask(store, 'fixed-window', 'consume', policy, { blocks })
  const over = ask(store, 'fixed-window', 'consume', policy, { blocks })
  assert.equal(over.allowed, false)
  assert.equal(over.retryMs, 5000, 'the block, longer than the window')
  clock.now += 2000
  const blocked = ask(store, 'fixed-window', 'consume', policy, { blocks })
  assert.deepEqual([blocked.allowed, blocked.remaining, blocked.retryMs], [false, 0, 3000])
  assert.equal(store.inspect('k'), undefined, 'the window ended and the blocked request was not counted')
  clock.now += 3000
  assert.equal(ask(store, 'fixed-window', 'consume', policy, { blocks }).allowed, true)
})

test('penalties: the ban begins after `banAfter` rejections; exponential backoff doubles the window', (t) => {
  const { store } = storeAt(3_000_000)
  t.after(() => store.close())
  const banned = { key: 'ban', quota: windowQuota(1, 1000), cost: 1 }
  const ban = [
    { policy: 0, key: 'ban:rejections', banAfter: 1, exponentialBackoff: false, continueExceeding: false },
  ]
  const bans = [1, 2, 3, 4].map(() => ask(store, 'fixed-window', 'consume', banned, { penalties: ban }).ban)
  assert.deepEqual(bans, ['none', 'none', 'began', 'banned'])

  const backoff = { key: 'slow', quota: windowQuota(1, 1000), cost: 1 }
  const doubling = [
    { policy: 0, key: 'slow:rejections', banAfter: -1, exponentialBackoff: true, continueExceeding: false },
  ]
  const resets = [1, 2, 3, 4].map(
    () => ask(store, 'fixed-window', 'consume', backoff, { penalties: doubling }).resetMs,
  )
  assert.deepEqual(resets, [1000, 1000, 2000, 4000])
})

test('keys: past maxKeys the least recently used goes; another algorithm on a key is refused', (t) => {
  const { store } = storeAt(4_000_000, 2)
  t.after(() => store.close())
  const consume = (key: string) =>
    ask(store, 'fixed-window', 'consume', { key, quota: windowQuota(5, 1000), cost: 1 })
  consume('a')
  consume('b')
  consume('a')
  consume('c')
  assert.deepEqual(store.keys().sort(), ['a', 'c'])
  assert.throws(
    () => ask(store, 'token-bucket', 'consume', { key: 'a', quota: bucketQuota(5, 1), cost: 1 }),
    /WRONGTYPE/,
  )
})

test('the wire entry point answers as the scripts do', (t) => {
  const { store, clock } = storeAt(6_000_000)
  t.after(() => store.close())
  assert.deepEqual(store.run('fixed-window', ['w'], ['c', '', 3, 1000, 1, 0]), [1, 0, 2, 1000, 0, 1000])
  clock.now += 400
  assert.deepEqual(store.run('fixed-window', ['w'], ['p', '', 3, 1000, 1, 0]), [1, 0, 2, 600, 0, 600])
})
