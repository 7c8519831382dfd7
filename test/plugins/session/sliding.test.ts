import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { SessionStore } from '../../../src/plugins/session/index.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

// The process's clock is the store's `now`; Redis's passing time is stood in for by shortening the
// key's TTL by as much as the clock moved. No real waiting: the outcome is read from the key's TTL.

let redis: RedisClient
const keyPrefix = uniquePrefix('sesslide')
before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(async () => {
  const keys = await scanKeys(redis, keyPrefix)
  if (keys.length) await redis.del(...keys)
  await redis.quit()
})

test('a session whose own idle timeout is below touchAfterMs is slid while its user is active', async () => {
  let clock = 1_000_000
  // The plugin's defaults scaled down: idle 30 s, touchAfterMs 1.5 s (idle / 20).
  const store = new SessionStore(redis, {
    keyPrefix,
    idleTimeoutMs: 30_000,
    absoluteTimeoutMs: 600_000,
    touchAfterMs: 1500,
    now: () => clock,
  })
  // Its own idle timeout, 1 s, is shorter than touchAfterMs.
  const session = await store.create('alice', {}, { idleTimeoutMs: 1000 })
  const key = store.sessionKey(session.id)
  // A request every 400 ms for 4 s: each time 400 ms pass on both clocks, then the session loads.
  for (let step = 1; step <= 10; step++) {
    clock += 400
    const ttl = await redis.pttl(key)
    assert.ok(ttl > 400, `step ${step}: the session is still alive (TTL ${ttl} ms)`)
    await redis.pexpire(key, ttl - 400)
    const loaded = await store.load(session.id)
    assert.ok(loaded, `step ${step}: an active user is still logged in`)
    // Slid by its own idle timeout at least every touchAfterMs x 1 s / 30 s = 50 ms.
    const after = await redis.pttl(key)
    assert.ok(after > 600 && after <= 1000, `step ${step}: slid to its own idle timeout (TTL ${after} ms)`)
  }
})

test('a session of the plugin idle timeout is slid only every touchAfterMs, and one of a longer one too', async () => {
  let clock = 2_000_000
  const store = new SessionStore(redis, {
    keyPrefix,
    idleTimeoutMs: 30_000,
    absoluteTimeoutMs: 600_000,
    maxIdleTimeoutMs: 120_000,
    touchAfterMs: 1500,
    now: () => clock,
  })
  for (const lifetime of [undefined, { idleTimeoutMs: 120_000 }]) {
    const session = await store.create('bob', {}, lifetime)
    const key = store.sessionKey(session.id)
    await redis.pexpire(key, 5000)
    clock += 1000
    assert.ok(await store.load(session.id))
    // Within touchAfterMs of the login: not slid.
    assert.ok((await redis.pttl(key)) <= 5000)
    clock += 500
    assert.ok(await store.load(session.id))
    // touchAfterMs after the login: slid to its idle timeout.
    assert.ok((await redis.pttl(key)) > 5000)
  }
})
