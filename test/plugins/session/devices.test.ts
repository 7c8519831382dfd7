import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { InvalidOptionError, UnknownOptionError } from '../../../src/plugins/common/errors.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, {
  requireSession,
  type SessionHandleError,
  SessionLifetimeError,
  type SessionPluginOptions,
  SessionPrincipalError,
  SessionStore,
  sessionHandle,
} from '../../../src/plugins/session/index.ts'
import { cookieHeader, TEST_SECRET, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

const MINUTE = 60_000
const HOUR = 60 * MINUTE
const DAY = 24 * HOUR

// The plugin's defaults for a login, and what "remember me" asks for, within the maxima below.
const IDLE = 15 * MINUTE
const ABSOLUTE = 8 * HOUR
const REMEMBER = { idleTimeoutMs: 7 * DAY, absoluteTimeoutMs: 30 * DAY }

let redis: RedisClient
before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(() => redis.quit())

async function buildApp(extra: Partial<SessionPluginOptions> = {}): Promise<FastifyInstance> {
  const app = Fastify()
  await app.register(sessionPlugin, {
    redis,
    secrets: [TEST_SECRET],
    keyPrefix: uniquePrefix('sessdev'),
    idleTimeoutMs: IDLE,
    absoluteTimeoutMs: ABSOLUTE,
    maxIdleTimeoutMs: REMEMBER.idleTimeoutMs,
    maxAbsoluteTimeoutMs: REMEMBER.absoluteTimeoutMs,
    ...extra,
  })
  app.post<{ Body: { principal: string; lifetime?: Record<string, unknown> } }>(
    '/login',
    async (request, reply) => {
      const created = await reply.regenerateSession(
        request.body.principal,
        { note: 'kept' },
        request.body.lifetime as never,
      )
      return { handle: sessionHandle(created.id), data: created.data }
    },
  )
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    principal: requireSession(request).principal,
    handle: sessionHandle(requireSession(request).id),
    data: requireSession(request).data,
  }))
  app.post('/touch', { config: { session: 'required' } }, async (request) => {
    requireSession(request).set('seen', true).touch()
    return { ok: true }
  })
  app.get('/devices', { config: { session: 'required' } }, async (request) =>
    app.sessions.listSessions(requireSession(request).principal),
  )
  app.delete<{ Params: { handle: string } }>(
    '/devices/:handle',
    { config: { session: 'required' } },
    async (request) => ({
      ended: await app.sessions.destroySession(requireSession(request).principal, request.params.handle),
    }),
  )
  await app.ready()
  return app
}

const login = async (app: FastifyInstance, principal: string, lifetime?: Record<string, unknown>) => {
  const res = await app.inject({ method: 'POST', url: '/login', payload: { principal, lifetime } })
  assert.equal(res.statusCode, 200, res.body)
  return {
    cookie: cookieHeader(res.headers['set-cookie']),
    setCookie: String(res.headers['set-cookie']),
    handle: res.json<{ handle: string }>().handle,
  }
}
const idOf = (cookie: string) => decodeURIComponent(cookie.split('=')[1]!).split('.')[0]!
const maxAgeOf = (setCookie: string) => Number(/Max-Age=(\d+)/.exec(setCookie)?.[1])
const me = (app: FastifyInstance, cookie: string) => app.inject({ url: '/me', headers: { cookie } })
const devices = async (app: FastifyInstance, cookie: string) => {
  const res = await app.inject({ url: '/devices', headers: { cookie } })
  assert.equal(res.statusCode, 200, res.body)
  return res.json<
    Array<{
      handle: string
      createdAt: number
      expiresAt: number
      absoluteExpiresAt: number
      idleTimeoutMs: number
    }>
  >()
}

describe('listing and ending one session', () => {
  let app: FastifyInstance
  before(async () => {
    app = await buildApp()
  })
  after(() => app.close())

  test("a principal's two logins are listed by handle, another principal's are not", async () => {
    const phone = await login(app, 'alice')
    const laptop = await login(app, 'alice')
    const other = await login(app, 'bob')
    const listed = await devices(app, phone.cookie)
    assert.deepEqual(listed.map((s) => s.handle).sort(), [phone.handle, laptop.handle].sort())
    assert.ok(!listed.some((s) => s.handle === other.handle))
    for (const session of listed) {
      // A handle is not the id the cookie carries, and holds no part of it.
      assert.match(session.handle, /^[A-Za-z0-9_-]{22}$/)
      assert.ok(![idOf(phone.cookie), idOf(laptop.cookie)].some((id) => id.includes(session.handle)))
      assert.equal(session.idleTimeoutMs, IDLE)
      assert.equal(session.absoluteExpiresAt - session.createdAt, ABSOLUTE)
      assert.ok(session.expiresAt <= session.createdAt + IDLE + 1000 && session.expiresAt > session.createdAt)
    }
    // Newest first.
    assert.ok(listed[0]!.createdAt >= listed[1]!.createdAt)
    const bobs = await devices(app, other.cookie)
    assert.deepEqual(
      bobs.map((s) => s.handle),
      [other.handle],
    )
  })

  test('ending one session by its handle: its cookie gets 401, the other still works', async () => {
    const phone = await login(app, 'carol')
    const laptop = await login(app, 'carol')
    const res = await app.inject({
      method: 'DELETE',
      url: `/devices/${phone.handle}`,
      headers: { cookie: laptop.cookie },
    })
    assert.deepEqual(res.json(), { ended: true })
    assert.equal((await me(app, phone.cookie)).statusCode, 401)
    const still = await me(app, laptop.cookie)
    assert.equal(still.statusCode, 200)
    assert.equal(still.json().principal, 'carol')
    assert.deepEqual(
      (await devices(app, laptop.cookie)).map((s) => s.handle),
      [laptop.handle],
    )
    // Gone from the index too, and ending it again ends nothing.
    assert.deepEqual(await redis.smembers(app.sessions.indexKey('carol')), [idOf(laptop.cookie)])
    assert.equal(await app.sessions.destroySession('carol', phone.handle), false)
  })

  test("another principal's handle is refused and that session lives on", async () => {
    const mallory = await login(app, 'mallory')
    const dave = await login(app, 'dave')
    const res = await app.inject({
      method: 'DELETE',
      url: `/devices/${dave.handle}`,
      headers: { cookie: mallory.cookie },
    })
    assert.deepEqual(res.json(), { ended: false })
    assert.equal((await me(app, dave.cookie)).statusCode, 200)
    // Not even the raw id works as a handle.
    assert.equal(await app.sessions.destroySession('dave', idOf(dave.cookie).slice(0, 22)), false)
    assert.equal((await me(app, dave.cookie)).statusCode, 200)
  })

  test('the listing drops ended sessions from the index', async () => {
    const a = await login(app, 'erin')
    const b = await login(app, 'erin')
    // As if it had expired: its key is gone, its id is still in the index.
    await redis.del(app.sessions.sessionKey(idOf(b.cookie)))
    assert.equal((await redis.smembers(app.sessions.indexKey('erin'))).length, 2)
    assert.deepEqual(
      (await devices(app, a.cookie)).map((s) => s.handle),
      [a.handle],
    )
    assert.deepEqual(await redis.smembers(app.sessions.indexKey('erin')), [idOf(a.cookie)])
  })

  test('misuse is refused with coded errors', async () => {
    await assert.rejects(
      app.sessions.destroySession('alice', 'not-a-handle'),
      (err: SessionHandleError) => err instanceof TypeError && err.code === 'FRG_SESSION_HANDLE_INVALID',
    )
    await assert.rejects(
      app.sessions.destroySession('alice', 42 as unknown as string),
      (err: SessionHandleError) => err.code === 'FRG_SESSION_HANDLE_INVALID',
    )
    await assert.rejects(app.sessions.listSessions(''), SessionPrincipalError)
    await assert.rejects(app.sessions.destroySession('x'.repeat(129), 'A'.repeat(22)), SessionPrincipalError)
    assert.equal(SessionStore.isWellFormedHandle(sessionHandle('x')), true)
    assert.equal(SessionStore.isWellFormedHandle('../etc'), false)
  })
})

describe('remember me: a lifetime of its own, set at login', () => {
  let app: FastifyInstance
  before(async () => {
    app = await buildApp()
  })
  after(() => app.close())

  test('the session lives longer in Redis and in the cookie; the default one does not', async () => {
    const plain = await login(app, 'frank')
    const remembered = await login(app, 'frank', REMEMBER)
    assert.equal(maxAgeOf(plain.setCookie), ABSOLUTE / 1000)
    assert.equal(maxAgeOf(remembered.setCookie), REMEMBER.absoluteTimeoutMs / 1000)
    const plainTtl = await redis.pttl(app.sessions.sessionKey(idOf(plain.cookie)))
    const rememberedTtl = await redis.pttl(app.sessions.sessionKey(idOf(remembered.cookie)))
    assert.ok(plainTtl > 0 && plainTtl <= IDLE, `plain PTTL ${plainTtl}`)
    assert.ok(
      rememberedTtl > IDLE && rememberedTtl <= REMEMBER.idleTimeoutMs,
      `remembered PTTL ${rememberedTtl}`,
    )
    const listed = await devices(app, plain.cookie)
    const entry = listed.find((s) => s.handle === remembered.handle)!
    assert.equal(entry.idleTimeoutMs, REMEMBER.idleTimeoutMs)
    assert.equal(entry.absoluteExpiresAt - entry.createdAt, REMEMBER.absoluteTimeoutMs)
    assert.ok(entry.expiresAt - entry.createdAt > IDLE)
    // The store's own field is not application data.
    assert.deepEqual((await me(app, remembered.cookie)).json().data, { note: 'kept' })
  })

  test('requests and saves slide it by its own idle timeout, also on an instance that never saw it', async (t) => {
    const remembered = await login(app, 'grace', REMEMBER)
    const key = app.sessions.sessionKey(idOf(remembered.cookie))
    await redis.pexpire(key, 60_000)
    // Another instance (its first load of this session slides by the plugin default, then by the session's).
    const other = await buildApp({ keyPrefix: app.sessions.options.keyPrefix, touchAfterMs: 0 })
    t.after(() => other.close())
    assert.equal((await me(other, remembered.cookie)).statusCode, 200)
    // The same connection answers in order: this PTTL follows the load's commands.
    const afterLoad = await other.sessions.redis.pttl(key)
    assert.ok(afterLoad > IDLE, `PTTL after a load ${afterLoad}`)
    await redis.pexpire(key, 60_000)
    assert.equal(
      (await other.inject({ method: 'POST', url: '/touch', headers: { cookie: remembered.cookie } }))
        .statusCode,
      200,
    )
    const afterSave = await redis.pttl(key)
    assert.ok(afterSave > IDLE, `PTTL after a save with touch ${afterSave}`)
  })

  test('a shorter lifetime is allowed; past the maxima, or inconsistent, is refused and the presented session kept', async () => {
    const short = await login(app, 'heidi', { idleTimeoutMs: 2 * MINUTE, absoluteTimeoutMs: HOUR })
    assert.equal(maxAgeOf(short.setCookie), HOUR / 1000)
    assert.ok((await redis.pttl(app.sessions.sessionKey(idOf(short.cookie)))) <= 2 * MINUTE)
    for (const lifetime of [
      { idleTimeoutMs: REMEMBER.idleTimeoutMs + 1 },
      { absoluteTimeoutMs: REMEMBER.absoluteTimeoutMs + 1 },
      { idleTimeoutMs: 2 * HOUR, absoluteTimeoutMs: HOUR },
      { idleTimeoutMs: 0 },
      { idleTimeoutMs: 1.5 },
      { absoluteTimeoutMs: '3600000' },
      { rememberMe: true },
    ]) {
      await assert.rejects(
        app.sessions.create('heidi', {}, lifetime as never),
        (err: SessionLifetimeError) =>
          err instanceof SessionLifetimeError &&
          err instanceof RangeError &&
          err.code === 'FRG_SESSION_LIFETIME_INVALID',
        JSON.stringify(lifetime),
      )
      const res = await app.inject({
        method: 'POST',
        url: '/login',
        payload: { principal: 'heidi', lifetime },
        headers: { cookie: short.cookie },
      })
      assert.equal(res.statusCode, 500, JSON.stringify(lifetime))
      // Refused before the presented session was touched.
      assert.equal((await me(app, short.cookie)).statusCode, 200)
    }
  })

  test('without maxima, a login may not ask for more than the defaults', async (t) => {
    const plainApp = await buildApp({ maxIdleTimeoutMs: undefined, maxAbsoluteTimeoutMs: undefined })
    t.after(() => plainApp.close())
    await assert.rejects(plainApp.sessions.create('ivan', {}, REMEMBER), SessionLifetimeError)
    const session = await plainApp.sessions.create('ivan', {}, { absoluteTimeoutMs: ABSOLUTE })
    assert.equal(session.absoluteExpiresAt - session.createdAt, ABSOLUTE)
  })
})

describe('plugin options', () => {
  const register = async (options: Record<string, unknown>) => {
    const app = Fastify()
    try {
      await app.register(sessionPlugin, { redis, secrets: [TEST_SECRET], ...options } as SessionPluginOptions)
    } finally {
      await app.close()
    }
  }

  test('maxima below the defaults, or not integers, are refused', async () => {
    for (const options of [
      { idleTimeoutMs: IDLE, maxIdleTimeoutMs: IDLE - 1 },
      { absoluteTimeoutMs: ABSOLUTE, maxAbsoluteTimeoutMs: ABSOLUTE - 1 },
      { maxIdleTimeoutMs: 10 * DAY, maxAbsoluteTimeoutMs: 9 * DAY },
      { maxIdleTimeoutMs: '1d' },
      { maxAbsoluteTimeoutMs: DAY + 0.5 },
    ]) {
      await assert.rejects(
        register(options),
        (err: InvalidOptionError) =>
          err instanceof InvalidOptionError &&
          err.code === 'FRG_INVALID_OPTION' &&
          /maxIdleTimeoutMs|maxAbsoluteTimeoutMs/.test(err.message),
        JSON.stringify(options),
      )
    }
  })

  test('a misspelt maximum is an unknown option', async () => {
    await assert.rejects(
      register({ maxIdleTimeout: DAY }),
      (err: UnknownOptionError) => err instanceof UnknownOptionError && /maxIdleTimeoutMs/.test(err.message),
    )
  })
})
