import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import { type RedisServerProcess, startRedisServer } from '../../../src/embedded/redis-server.ts'
import { HttpProblem } from '../../../src/plugins/common/problem.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, { SessionStore } from '../../../src/plugins/session/index.ts'
import {
  cookieHeader,
  scanKeys,
  TEST_SECRET,
  testRedisConnection,
  uniquePrefix,
} from '../../helpers/index.ts'

describe('log out everywhere', () => {
  const clients: RedisClient[] = []
  before(async () => {
    // Two clients: two gateway instances serving the same customer.
    for (let i = 0; i < 2; i++) clients.push(createRedisClient(testRedisConnection()))
    await Promise.all(clients.map(connectRedis))
  })
  after(() => Promise.all(clients.map((c) => c.quit())))

  test('logins racing log-outs-everywhere: a final log out everywhere leaves no session behind', async () => {
    const keyPrefix = uniquePrefix('sessrace')
    const options = { keyPrefix, idleTimeoutMs: 60_000, absoluteTimeoutMs: 120_000 }
    const stores = clients.map((client) => new SessionStore(client, options))
    const principal = 'racer'
    for (let round = 0; round < 20; round++) {
      await Promise.all(
        Array.from({ length: 60 }, (_, i) => {
          const store = stores[i % 2]!
          return i % 5 === 0 ? store.destroyAll(principal) : store.create(principal)
        }),
      )
    }
    await stores[0]!.destroyAll(principal)
    // Every session hash and the index are gone: nothing of the principal is left to reach.
    assert.deepEqual(await scanKeys(clients[0]!, keyPrefix), [])
  })
})

describe('a load slides the idle expiry and enforces the absolute lifetime', () => {
  let redis: RedisClient
  let store: SessionStore
  before(async () => {
    redis = createRedisClient(testRedisConnection())
    await connectRedis(redis)
    // touchAfterMs 0: every load slides the idle expiry.
    store = new SessionStore(redis, {
      keyPrefix: uniquePrefix('sessload'),
      idleTimeoutMs: 60_000,
      absoluteTimeoutMs: 3_600_000,
      touchAfterMs: 0,
    })
  })
  after(() => redis.quit())

  test('the idle expiry is moved to a full idle period and the hash is left as it was', async () => {
    const created = await store.create('loader', { theme: 'dark' })
    const key = store.sessionKey(created.id)
    await redis.pexpire(key, 5000)
    const before = await redis.hgetall(key)
    const loaded = await store.load(created.id)
    assert.equal(loaded?.principal, 'loader')
    assert.equal(loaded?.get('theme'), 'dark')
    const ttl = await redis.pttl(key)
    assert.ok(ttl > 55_000 && ttl <= 60_000, `TTL ${ttl} ms after the load`)
    assert.deepEqual(await redis.hgetall(key), before)
  })

  test('in the last idle period the key expires at the absolute end, not past it', async () => {
    const created = await store.create('loader')
    const key = store.sessionKey(created.id)
    const absolute = Date.now() + 20_000
    await redis.hset(key, '_absoluteExpiresAt', absolute)
    const loaded = await store.load(created.id)
    assert.equal(loaded?.expiresAt, absolute)
    // Same connection: the load's PEXPIREAT was handled before this read.
    assert.equal(await redis.pexpiretime(key), absolute)
  })

  test('a session past its absolute end is refused and deleted', async () => {
    const created = await store.create('loader')
    const key = store.sessionKey(created.id)
    await redis.hset(key, '_absoluteExpiresAt', Date.now() - 1)
    assert.equal(await store.load(created.id), null)
    assert.equal(await redis.exists(key), 0)
  })

  test('a missing session is null and no key is created by the touch', async () => {
    const id = 'A'.repeat(43)
    assert.equal(await store.load(id), null)
    assert.equal(await redis.exists(store.sessionKey(id)), 0)
  })

  test('touchAfterMs: a load within it of this instance’s last touch only reads', async () => {
    const options = {
      keyPrefix: uniquePrefix('sesstouch'),
      idleTimeoutMs: 60_000,
      absoluteTimeoutMs: 3_600_000,
    }
    const instance = new SessionStore(redis, { ...options, touchAfterMs: 50_000 })
    const created = await instance.create('toucher')
    const key = instance.sessionKey(created.id)
    await redis.pexpire(key, 5000)
    assert.equal((await instance.load(created.id))?.principal, 'toucher')
    assert.ok((await redis.pttl(key)) <= 5000, 'created (a touch) less than touchAfterMs ago: not slid')
    // Another instance has touched it never: its first load slides it.
    const other = new SessionStore(redis, { ...options, touchAfterMs: 50_000 })
    assert.equal((await other.load(created.id))?.principal, 'toucher')
    assert.ok((await redis.pttl(key)) > 55_000, 'slid by the other instance')
    // Past touchAfterMs, the next load of the first instance slides it again.
    const brief = new SessionStore(redis, { ...options, touchAfterMs: 20 })
    const second = await brief.create('toucher')
    await redis.pexpire(brief.sessionKey(second.id), 5000)
    await sleep(30)
    await brief.load(second.id)
    assert.ok((await redis.pttl(brief.sessionKey(second.id))) > 55_000, 'slid once touchAfterMs had passed')
  })
})

describe('Redis down', () => {
  let server: RedisServerProcess
  let redis: RedisClient
  let app: FastifyInstance
  const thrown: unknown[] = []

  before(async () => {
    server = await startRedisServer()
    redis = createRedisClient({ url: server.url })
    app = Fastify()
    await app.register(sessionPlugin, { redis, secrets: [TEST_SECRET], keyPrefix: uniquePrefix('sessdown') })
    // No error handler of its own: Fastify's default answers an HttpProblem with its status and headers.
    const capture = async (work: () => Promise<unknown>) => {
      try {
        return await work()
      } catch (err) {
        thrown.push(err)
        throw err
      }
    }
    app.post('/login', (_request, reply) => capture(() => reply.regenerateSession('user-1')))
    app.delete('/login', (_request, reply) =>
      capture(async () => {
        await reply.destroySession()
        return reply.code(204).send()
      }),
    )
    app.delete('/everywhere', () => capture(async () => ({ ended: await app.sessions.destroyAll('user-1') })))
    await app.ready()
  })
  after(async () => {
    await app.close()
    redis.disconnect()
    await server.stop()
  })

  test('login, logout and log out everywhere answer 503 with Retry-After, never a raw 500', async () => {
    const login = await app.inject({ method: 'POST', url: '/login' })
    assert.equal(login.statusCode, 200)
    const cookie = cookieHeader(login.headers['set-cookie'])

    await server.stop()
    thrown.length = 0
    const responses = [
      await app.inject({ method: 'POST', url: '/login' }),
      await app.inject({ method: 'POST', url: '/login', headers: { cookie } }),
      await app.inject({ method: 'DELETE', url: '/login', headers: { cookie } }),
      await app.inject({ method: 'DELETE', url: '/everywhere' }),
    ]
    for (const res of responses) {
      assert.equal(res.statusCode, 503, res.body)
      assert.equal(res.headers['retry-after'], '1')
    }
    assert.equal(thrown.length, responses.length)
    for (const err of thrown) {
      assert.ok(err instanceof HttpProblem, String(err))
      assert.equal(err.type, '/problems/session-store-unavailable')
    }
  })
})
