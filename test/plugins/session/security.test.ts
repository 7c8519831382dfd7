import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import fastifyCookie from '@fastify/cookie'
import Fastify, { type FastifyInstance } from 'fastify'
import { createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, { type SessionPluginOptions } from '../../../src/plugins/session/index.ts'
import {
  cookieHeader,
  scanKeys,
  TEST_SECRET,
  testRedisConnection,
  uniquePrefix,
} from '../../helpers/index.ts'

const OLD_SECRET = 'old-secret-abcdefghijklmnopqrstuvwxyz-0123'
const NEW_SECRET = 'new-secret-abcdefghijklmnopqrstuvwxyz-0123'

let redis: RedisClient
const apps: FastifyInstance[] = []
before(() => {
  redis = createRedisClient(testRedisConnection())
})
after(async () => {
  for (const app of apps) await app.close()
  // The plugin never closes a client it was given.
  await redis.quit()
})

interface SessionApp {
  app: FastifyInstance
  /** What the app's session keys start with. */
  prefix: string
}

/**
 * The session plugin on a plain app, with the routes an app's login needs: POST /session signs
 * `principal` in (a new session, the presented one destroyed), GET /session answers 200 with a
 * session, DELETE /session logs out (every session of the principal with `?everywhere=true`).
 */
async function sessionApp(options: Partial<SessionPluginOptions> = {}): Promise<SessionApp> {
  const prefix = options.keyPrefix ?? uniquePrefix('sess')
  const app = Fastify()
  apps.push(app)
  await app.register(sessionPlugin, { redis, secrets: [TEST_SECRET], keyPrefix: prefix, ...options })
  app.post('/session', async (request, reply) => {
    const { principal } = request.body as { principal: string }
    await reply.regenerateSession(principal)
    return { principal }
  })
  app.get('/session', { config: { session: 'required' } }, async (request) => ({
    principal: request.session!.principal,
  }))
  app.delete('/session', { config: { session: 'required' } }, async (request, reply) => {
    if ((request.query as { everywhere?: string }).everywhere === 'true')
      await app.sessions.destroyAll(request.session!.principal)
    await reply.destroySession()
    return reply.code(204).send(null)
  })
  await app.ready()
  return { app, prefix }
}

/** Signs `principal` in and returns the Cookie header value to send. */
async function login(app: FastifyInstance, principal: string): Promise<string> {
  const res = await app.inject({ method: 'POST', url: '/session', payload: { principal } })
  assert.equal(res.statusCode, 200, res.body)
  return cookieHeader(res.headers['set-cookie'])
}

let t: SessionApp
const alice = 'alice'
before(async () => {
  t = await sessionApp()
})

const sessionIdOf = (cookie: string) => decodeURIComponent(cookie.split('=')[1]!).split('.')[0]!
const whoami = (cookie: string) => t.app.inject({ url: '/session', headers: { cookie } })
const sessionKeyExists = async (cookie: string) =>
  (await redis.exists(t.app.sessions.sessionKey(sessionIdOf(cookie)))) === 1

describe('cookie', () => {
  test('HttpOnly, SameSite, Path=/, signed, 256-bit id', async () => {
    const res = await t.app.inject({ method: 'POST', url: '/session', payload: { principal: alice } })
    const setCookie = String(res.headers['set-cookie'])
    assert.match(setCookie, /HttpOnly/)
    assert.match(setCookie, /SameSite=Lax/)
    assert.match(setCookie, /Path=\//)
    assert.doesNotMatch(setCookie, /Secure/, 'plain HTTP in development')
    const id = sessionIdOf(cookieHeader(res.headers['set-cookie']))
    assert.equal(Buffer.from(id, 'base64url').length, 32)
  })

  test('secure: Secure and the __Host- prefix', async () => {
    const prod = await sessionApp({ secure: true })
    const res = await prod.app.inject({ method: 'POST', url: '/session', payload: { principal: 'carol' } })
    const setCookie = String(res.headers['set-cookie'])
    assert.match(setCookie, /^__Host-sid=/)
    assert.match(setCookie, /Secure/)
    assert.match(setCookie, /Path=\//)
    assert.doesNotMatch(setCookie, /Domain=/i)
  })
})

describe('fixation, logout and revocation', () => {
  test('logging in again issues a new id and kills the presented one server-side', async () => {
    const first = await login(t.app, alice)
    const res = await t.app.inject({
      method: 'POST',
      url: '/session',
      headers: { cookie: first },
      payload: { principal: alice },
    })
    assert.equal(res.statusCode, 200)
    const second = cookieHeader(res.headers['set-cookie'])
    assert.notEqual(sessionIdOf(first), sessionIdOf(second))
    assert.equal(await sessionKeyExists(first), false)
    assert.equal((await whoami(first)).statusCode, 401)
    assert.equal((await whoami(second)).statusCode, 200)
  })

  test('logout deletes the session server-side; the old cookie is refused afterwards', async () => {
    const cookie = await login(t.app, alice)
    const out = await t.app.inject({ method: 'DELETE', url: '/session', headers: { cookie } })
    assert.equal(out.statusCode, 204)
    assert.match(String(out.headers['set-cookie']), /Max-Age=0/)
    assert.equal(await sessionKeyExists(cookie), false)
    assert.equal((await whoami(cookie)).statusCode, 401)
    assert.equal(
      (await t.app.inject({ method: 'DELETE', url: '/session', headers: { cookie } })).statusCode,
      401,
    )
  })

  test('log out everywhere ends every session of the customer and empties the index', async () => {
    const cookies = [await login(t.app, alice), await login(t.app, alice), await login(t.app, alice)]
    const res = await t.app.inject({
      method: 'DELETE',
      url: '/session?everywhere=true',
      headers: { cookie: cookies[0]! },
    })
    assert.equal(res.statusCode, 204)
    for (const cookie of cookies) assert.equal((await whoami(cookie)).statusCode, 401)
    assert.equal(await redis.exists(t.app.sessions.indexKey(alice)), 0)
  })

  test('a write after logout cannot resurrect the session', async () => {
    const cookie = await login(t.app, alice)
    const id = sessionIdOf(cookie)
    await t.app.inject({ method: 'DELETE', url: '/session', headers: { cookie } })
    assert.equal(await t.app.sessions.set(id, { theme: 'dark' }), false)
    assert.equal(await redis.exists(t.app.sessions.sessionKey(id)), 0)
  })

  test('concurrent writes of different fields keep both', async () => {
    const session = await t.app.sessions.create('42')
    await Promise.all(
      Array.from({ length: 50 }, (_, i) => t.app.sessions.set(session.id, { [`field${i}`]: String(i) })),
    )
    const loaded = await t.app.sessions.load(session.id)
    assert.equal(Object.keys(loaded!.data).length, 50)
    assert.equal(loaded!.data.field49, '49')
  })

  test('the index drops ids of sessions that are gone', async () => {
    const principal = `p${randomBytes(4).toString('hex')}`
    const first = await t.app.sessions.create(principal)
    await t.app.sessions.create(principal)
    await redis.del(t.app.sessions.sessionKey(first.id))
    await t.app.sessions.pruneIndex(principal)
    assert.equal(await redis.scard(t.app.sessions.indexKey(principal)), 1)
  })
})

describe('forged and tampered cookies', () => {
  test('tampered, unsigned, foreign-signed and never-issued ids are refused without writing', async () => {
    const real = await login(t.app, alice)
    const [name, value] = real.split('=') as [string, string]
    const decoded = decodeURIComponent(value)
    const flipped = (decoded[0] === 'A' ? 'B' : 'A') + decoded.slice(1)
    const neverIssued = randomBytes(32).toString('base64url')
    const signer = fastifyCookie.signerFactory([TEST_SECRET])
    const foreign = fastifyCookie.signerFactory(['someone-elses-secret-0123456789abcdef'])
    const before = (await scanKeys(redis, t.prefix)).length
    for (const forged of [
      flipped,
      sessionIdOf(real),
      foreign.sign(sessionIdOf(real)),
      signer.sign(neverIssued),
      signer.sign('short'),
      'x'.repeat(5000),
    ]) {
      const res = await whoami(`${name}=${encodeURIComponent(forged)}`)
      assert.equal(res.statusCode, 401, forged.slice(0, 40))
    }
    assert.equal((await scanKeys(redis, t.prefix)).length, before, 'no session created for a forged id')
  })
})

describe('secret rotation', () => {
  test('the first secret signs, all verify; a retired-secret cookie is re-signed', async () => {
    const keyPrefix = uniquePrefix('rot')
    const { app: oldApp } = await sessionApp({ keyPrefix, secrets: [OLD_SECRET] })
    const { app: rotated } = await sessionApp({ keyPrefix, secrets: [NEW_SECRET, OLD_SECRET] })
    const { app: newOnly } = await sessionApp({ keyPrefix, secrets: [NEW_SECRET] })
    const oldCookie = await login(oldApp, 'dave')
    const res = await rotated.inject({ url: '/session', headers: { cookie: oldCookie } })
    assert.equal(res.statusCode, 200)
    const renewed = cookieHeader(res.headers['set-cookie'])
    assert.equal(sessionIdOf(renewed), sessionIdOf(oldCookie), 'same session, new signature')
    assert.notEqual(renewed, oldCookie)
    // Verified signatures are remembered per process: a second presentation is re-signed too,
    // and a cookie one character away from a remembered one is still refused.
    const again = await rotated.inject({ url: '/session', headers: { cookie: oldCookie } })
    assert.equal(cookieHeader(again.headers['set-cookie']), renewed)
    const flipped = oldCookie.slice(0, -1) + (oldCookie.endsWith('A') ? 'B' : 'A')
    assert.equal((await rotated.inject({ url: '/session', headers: { cookie: flipped } })).statusCode, 401)
    assert.equal((await newOnly.inject({ url: '/session', headers: { cookie: renewed } })).statusCode, 200)
    assert.equal((await newOnly.inject({ url: '/session', headers: { cookie: oldCookie } })).statusCode, 401)
  })
})

describe('expiry', () => {
  test('idle expiry slides with activity using a TTL-only touch', async () => {
    const app = await sessionApp({ idleTimeoutMs: 400, absoluteTimeoutMs: 3_600_000 })
    const cookie = await login(app.app, 'erin')
    const key = app.app.sessions.sessionKey(sessionIdOf(cookie))
    const before = await redis.hgetall(key)
    for (let i = 0; i < 4; i++) {
      await sleep(200)
      assert.equal((await app.app.inject({ url: '/session', headers: { cookie } })).statusCode, 200)
    }
    assert.deepEqual(await redis.hgetall(key), before, 'touching does not rewrite the hash')
    await sleep(600)
    assert.equal((await app.app.inject({ url: '/session', headers: { cookie } })).statusCode, 401)
    assert.equal(await redis.exists(key), 0)
  })

  test('the absolute lifetime ends a session however active it is', async () => {
    const app = await sessionApp({ idleTimeoutMs: 500, absoluteTimeoutMs: 900 })
    const cookie = await login(app.app, 'fay')
    const statuses: number[] = []
    for (let i = 0; i < 8; i++) {
      statuses.push((await app.app.inject({ url: '/session', headers: { cookie } })).statusCode)
      await sleep(200)
    }
    assert.equal(statuses[0], 200)
    assert.equal(statuses.at(-1), 401)
    assert.ok(statuses.indexOf(401) > 0 && statuses.slice(statuses.indexOf(401)).every((s) => s === 401))
  })
})

describe('plugin options', () => {
  test('bad options fail registration with a precise message', async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [
        { secrets: [] },
        'session plugin: `secrets` must be a non-empty array of strings, got an object (Array)',
      ],
      [
        { secrets: ['short'] },
        'session plugin: every secret in `secrets` must be a string of at least 32 characters',
      ],
      [
        { secrets: [TEST_SECRET], idleTimeoutMs: 0 },
        'session plugin: `idleTimeoutMs` must be an integer of at least 1, got 0',
      ],
      [
        { secrets: [TEST_SECRET], idleTimeoutMs: 1000, absoluteTimeoutMs: 10 },
        'session plugin: `absoluteTimeoutMs` must be an integer no smaller than `idleTimeoutMs`',
      ],
      [
        { secrets: [TEST_SECRET], idleTimeoutMs: 1000, touchAfterMs: 1000 },
        'session plugin: `touchAfterMs` must be an integer from 0 to below `idleTimeoutMs`',
      ],
      [
        { secrets: [TEST_SECRET], touchAfterMs: -1 },
        'session plugin: `touchAfterMs` must be an integer of at least 0, got -1',
      ],
      [
        { secrets: [TEST_SECRET], sameSite: 'loose' },
        "session plugin: `sameSite` must be 'lax', 'strict' or 'none', got a string ('loose')",
      ],
      [
        { secrets: [TEST_SECRET] },
        'session plugin: no Redis client: pass `redis` (an ioredis client) or register the redis plugin before this one',
      ],
    ]
    for (const [options, message] of cases) {
      const app = Fastify()
      await assert.rejects(
        async () => {
          await app.register(sessionPlugin, options as never)
          await app.ready()
        },
        // Every option error has a code: a wrong value, or no Redis client.
        { message, code: /^FRG_(INVALID_OPTION|REDIS_CLIENT_INVALID)$/ },
      )
      await app.close()
    }
  })
})
