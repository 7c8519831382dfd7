import assert from 'node:assert/strict'
import { once } from 'node:events'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { GatewayError, InvalidOptionError, RedisClientError } from '../../src/plugins/common/errors.ts'
import {
  createLock,
  type LockHandle,
  LockLostError,
  LockNotAcquiredError,
} from '../../src/primitives/lock.ts'
import { startTcpProxy, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

// Each race of a naive lock, replayed on a real Redis with real concurrency: expiry is simulated by
// deleting or PEXPIRE-ing the key, or a small TTL waited past; no assertion is about durations.

const clients: Redis[] = []
const connect = (url = TEST_REDIS_URL) => {
  const client = new Redis(url)
  clients.push(client)
  return client
}
let redis: Redis

before(() => {
  redis = connect()
})

after(async () => {
  await Promise.all(clients.map((client) => client.quit().catch(() => client.disconnect())))
})

test('check-then-set: of 50 concurrent acquires on 5 connections exactly one gets a handle', async () => {
  const keyPrefix = uniquePrefix('lock')
  const locks = Array.from({ length: 5 }, () => createLock(connect(), { keyPrefix }))
  const results = await Promise.all(
    Array.from({ length: 50 }, (_, i) => locks[i % locks.length]!.acquire('payout', 10_000)),
  )
  const handles = results.filter((h): h is LockHandle => h !== null)
  assert.equal(handles.length, 1)
  const holder = await locks[0]!.holder('payout')
  assert.equal(holder?.owner, handles[0]!.owner)
  assert.equal(holder?.fence, handles[0]!.fence)
  assert.match(handles[0]!.owner, /^[0-9a-f]{32}$/)
})

test('release after expiry: A, whose lock expired and went to B, cannot delete B’s lock', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  const a = await lock.acquire('report', 10_000)
  assert.ok(a)
  // A stalls past its TTL: the key expires.
  await expire(keyPrefix, 'report')
  const b = await lock.acquire('report', 10_000)
  assert.ok(b, 'B acquires once A’s lock expired')
  assert.equal(await lock.release(a), false)
  assert.equal(await lock.extend(a, 10_000), false)
  const holder = await lock.holder('report')
  assert.equal(holder?.owner, b.owner)
  assert.ok(b.fence > a.fence)
  assert.equal(await lock.release(b), true)
  assert.equal(await lock.holder('report'), null)
})

test('reading an expired holder: holder() is null once the TTL has passed, and after PEXPIRE', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  assert.ok(await lock.acquire('short', 20))
  await sleep(60)
  assert.equal(await lock.holder('short'), null)
  assert.ok(await lock.acquire('short', 20), 'the expired lock is free to take')

  const held = await lock.acquire('long', 60_000)
  assert.ok(held)
  assert.equal((await lock.holder('long'))?.owner, held.owner)
  await expire(keyPrefix, 'long')
  assert.equal(await lock.holder('long'), null)
})

test('fences strictly increase across 20 sequential holders, through releases and expiries', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  let previous = -1
  for (let i = 0; i < 20; i++) {
    const handle = await lock.acquire('ledger', 10_000)
    assert.ok(handle)
    assert.ok(Number.isSafeInteger(handle.fence))
    assert.ok(handle.fence > previous, `holder ${i}: ${handle.fence} > ${previous}`)
    previous = handle.fence
    if (i % 2 === 0) assert.equal(await lock.release(handle), true)
    else await expire(keyPrefix, 'ledger')
  }
})

test('a fence counter lost (a failover without it) still hands out a larger fence', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  const first = await lock.acquire('job', 10_000)
  assert.ok(first)
  await lock.release(first)
  await redis.del(`${keyPrefix}{job}:fence`)
  const second = await lock.acquire('job', 10_000)
  assert.ok(second)
  assert.ok(second.fence > first.fence)
})

test('extend by a non-holder fails and leaves the holder’s lock alone', async () => {
  const lock = createLock(redis, { keyPrefix: uniquePrefix('lock') })
  const holder = await lock.acquire('settle', 10_000)
  assert.ok(holder)
  const forged: LockHandle = { name: 'settle', owner: 'f'.repeat(32), fence: holder.fence, expiresAt: 0 }
  assert.equal(await lock.extend(forged, 60_000), false)
  assert.equal(await lock.release(forged), false)
  const now = await lock.holder('settle')
  assert.equal(now?.owner, holder.owner)
  assert.ok(now!.expiresInMs <= 10_000, 'the TTL was not extended to the forger’s 60 s')
  // Nobody holds a free lock's extension either.
  assert.equal(await lock.release(holder), true)
  assert.equal(await lock.extend(holder, 10_000), false)
  assert.equal(await lock.holder('settle'), null)
})

test('withLock renews past the ttl while a long fn runs; nobody else acquires meanwhile', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  const rival = createLock(connect(), { keyPrefix })
  const ttlMs = 300
  let rivalWins = 0
  let rivalTries = 0
  const result = await lock.withLock(
    'nightly',
    async (signal, handle) => {
      // Outlives three TTLs while a rival keeps trying.
      for (let i = 0; i < 12; i++) {
        await sleep(ttlMs / 3)
        const got = await rival.acquire('nightly', ttlMs)
        rivalTries++
        if (got) rivalWins++
      }
      assert.equal(signal.aborted, false)
      assert.equal((await lock.holder('nightly'))?.owner, handle.owner)
      return handle.fence
    },
    { ttlMs },
  )
  assert.equal(rivalTries, 12)
  assert.equal(rivalWins, 0)
  assert.equal(typeof result, 'number')
  assert.equal(await lock.holder('nightly'), null, 'released at the end')
})

test('withLock aborts fn’s signal when the lock is taken away, and does not release the next holder', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  let next: LockHandle | null = null
  const reason = await lock.withLock(
    'rebalance',
    async (signal) => {
      await redis.del(`${keyPrefix}{rebalance}`)
      next = await lock.acquire('rebalance', 10_000)
      if (!signal.aborted) await once(signal, 'abort')
      return signal.reason
    },
    { ttlMs: 5000, renewEveryMs: 20 },
  )
  assert.ok(reason instanceof LockLostError)
  assert.equal(reason.lockName, 'rebalance')
  assert.ok(next)
  assert.equal((await lock.holder('rebalance'))?.owner, (next as LockHandle).owner)
})

test('withLock aborts fn’s signal when Redis cannot be reached for longer than the ttl', async (t) => {
  const port = Number(new URL(TEST_REDIS_URL).port || 6379)
  const proxy = await startTcpProxy(port, new URL(TEST_REDIS_URL).hostname)
  const keyPrefix = uniquePrefix('lock')
  const client = connect(`redis://127.0.0.1:${proxy.port}`)
  client.on('error', () => {}) // the cut connection's errors, expected
  t.after(async () => {
    client.disconnect()
    await proxy.close()
  })
  const lock = createLock(client, { keyPrefix })
  const reason = await lock.withLock(
    'export',
    async (signal) => {
      proxy.cut()
      if (!signal.aborted) await once(signal, 'abort')
      return signal.reason
    },
    { ttlMs: 200 },
  )
  assert.ok(reason instanceof LockLostError)
})

test('withLock throws LockNotAcquiredError when held, and waits for a release with waitMs', async () => {
  const lock = createLock(redis, { keyPrefix: uniquePrefix('lock') })
  const held = await lock.acquire('close-day', 10_000)
  assert.ok(held)
  let ran = false
  await assert.rejects(
    lock.withLock(
      'close-day',
      async () => {
        ran = true
      },
      { ttlMs: 1000 },
    ),
    (err: unknown) => err instanceof LockNotAcquiredError && err.lockName === 'close-day',
  )
  assert.equal(ran, false)

  setTimeout(() => void lock.release(held), 50)
  const fence = await lock.withLock('close-day', async (_signal, handle) => handle.fence, {
    ttlMs: 1000,
    waitMs: 30_000,
  })
  assert.ok(fence > held.fence)
})

test('withLock releases when fn throws, and rejects with fn’s error', async () => {
  const lock = createLock(redis, { keyPrefix: uniquePrefix('lock') })
  await assert.rejects(
    lock.withLock(
      'fail',
      async () => {
        throw new Error('boom')
      },
      { ttlMs: 10_000 },
    ),
    /boom/,
  )
  assert.equal(await lock.holder('fail'), null)
})

test('options are checked', async () => {
  const lock = createLock(redis)
  await assert.rejects(lock.acquire('', 1000), TypeError)
  await assert.rejects(lock.acquire('x', 0), TypeError)
  await assert.rejects(
    lock.withLock('x', async () => 1, { ttlMs: 100, renewEveryMs: 100 }),
    {
      code: 'FRG_INVALID_OPTION',
      message: /renewEveryMs/,
    },
  )
  assert.throws(() => createLock({} as Redis), RedisClientError)
})

test('withLock without waitMs: LockNotAcquiredError carries the time the holder has left, and a code', async () => {
  const lock = createLock(redis, { keyPrefix: uniquePrefix('lock') })
  const held = await lock.acquire('payroll', 60_000)
  assert.ok(held, 'held')
  const err = await lock
    .withLock('payroll', async () => 'ran', { ttlMs: 1000 })
    .then(
      () => assert.fail('acquired a held lock'),
      (caught: unknown) => caught,
    )
  assert.ok(
    err instanceof LockNotAcquiredError && err instanceof GatewayError,
    'err instanceof LockNotAcquiredError && err instanceof GatewayError',
  )
  assert.equal(err.code, 'FRG_LOCK_NOT_ACQUIRED')
  const holder = await lock.holder('payroll')
  assert.ok(holder, 'holder')
  // The holder's PTTL at the attempt: positive, at most its TTL, and not less than what it has now.
  assert.ok(err.retryAfterMs > 0 && err.retryAfterMs <= 60_000, String(err.retryAfterMs))
  assert.ok(err.retryAfterMs >= holder.expiresInMs, `${err.retryAfterMs} >= ${holder.expiresInMs}`)
  assert.match(err.message, /lock 'payroll' is held by another owner for \d+ ms more/)
  await lock.release(held)
})

test('LockLostError has a code', async () => {
  const keyPrefix = uniquePrefix('lock')
  const lock = createLock(redis, { keyPrefix })
  const reason = await lock.withLock(
    'lost',
    async (signal) => {
      await redis.del(`${keyPrefix}{lost}`)
      if (!signal.aborted) await once(signal, 'abort')
      return signal.reason as unknown
    },
    { ttlMs: 300, renewEveryMs: 20 },
  )
  assert.ok(
    reason instanceof LockLostError && reason instanceof GatewayError,
    'reason instanceof LockLostError && reason instanceof GatewayError',
  )
  assert.equal(reason.code, 'FRG_LOCK_LOST')
})

test('lock options are strict: an unknown key or a wrong value is refused', async () => {
  const lock = createLock(redis, { keyPrefix: uniquePrefix('lock') })
  assert.throws(() => createLock(redis, { keyprefix: 'x:' } as never), {
    code: 'FRG_UNKNOWN_OPTION',
    message: /lock: unknown option `keyprefix`\. Did you mean `keyPrefix`\?/,
  })
  assert.throws(() => createLock(redis, { keyPrefix: 7 } as never), InvalidOptionError)
  await assert.rejects(
    lock.withLock('x', async () => 1, { ttlMs: 1000, wait: 500 } as never),
    {
      code: 'FRG_UNKNOWN_OPTION',
      message:
        /withLock: unknown option `wait`\. Did you mean `waitMs`\? Valid options: ttlMs, renewEveryMs, waitMs\./,
    },
  )
  await assert.rejects(
    lock.withLock('x', async () => 1, { ttlMs: 1000, waitMs: -1 }),
    InvalidOptionError,
  )
  await assert.rejects(
    lock.withLock('x', async () => 1, undefined as never),
    InvalidOptionError,
  )
  await assert.rejects(lock.acquire('', 1000), { code: 'FRG_INVALID_ARGUMENT', name: 'TypeError' })
  assert.equal(await lock.holder('x'), null, 'nothing was taken')
})

/** Simulates the holder's TTL running out: the lock key expires now (PEXPIRE 1, then gone). */
async function expire(keyPrefix: string, name: string) {
  const key = `${keyPrefix}{${name}}`
  await redis.pexpire(key, 1)
  while ((await redis.exists(key)) === 1) await sleep(2)
}
