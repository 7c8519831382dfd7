import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import fastifyCsrf from '@fastify/csrf-protection'
import Fastify, { type FastifyInstance, type LightMyRequestResponse } from 'fastify'
import { type RedisServerProcess, startRedisServer } from '../../../src/embedded/redis-server.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, {
  MAX_FIELD_BYTES,
  MAX_SESSION_BYTES,
  type SessionPluginOptions,
  type SessionValue,
} from '../../../src/plugins/session/index.ts'
import { scanKeys, TEST_SECRET, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

let redis: RedisClient
/** Commands the app's client sent while `counting` was on. */
let sent: string[] = []
let counting = false

before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
  const original = redis.sendCommand.bind(redis) as (command: { name: string }, ...rest: unknown[]) => unknown
  ;(redis as unknown as { sendCommand: typeof original }).sendCommand = (command, ...rest) => {
    if (counting) sent.push(command.name)
    return original(command, ...rest)
  }
})
after(() => redis.quit())

type Cookies = Record<string, string>

/** An app with routes that read and change the session as a handler would. */
async function buildApp(options: Partial<SessionPluginOptions> = {}): Promise<FastifyInstance> {
  const app = Fastify()
  await app.register(sessionPlugin, {
    redis,
    secrets: [TEST_SECRET],
    keyPrefix: uniquePrefix('sessdata'),
    ...options,
  })
  app.post<{ Body: { user: string; data?: Record<string, SessionValue> } }>(
    '/login',
    async (request, reply) => {
      const created = await reply.regenerateSession(request.body.user, request.body.data)
      return { id: created.id }
    },
  )
  app.post('/logout', async (_request, reply) => {
    await reply.destroySession()
    return reply.code(204).send()
  })
  app.get<{ Params: { name: string } }>('/field/:name', async (request) => ({
    value: request.session?.get(request.params.name) ?? null,
  }))
  app.put<{ Params: { name: string }; Body: { value: SessionValue } }>('/field/:name', async (request) => {
    request.session!.set(request.params.name, request.body.value)
    return { ok: true }
  })
  app.delete<{ Params: { name: string } }>('/field/:name', async (request) => ({
    deleted: request.session!.delete(request.params.name),
  }))
  app.get('/data', async (request) => ({ data: request.session?.data ?? null }))
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    principal: request.session!.principal,
  }))
  app.get('/principal', async (request) => ({ principal: app.sessionPrincipal(request) }))
  await app.ready()
  return app
}

const sidOf = (res: LightMyRequestResponse): Cookies => {
  const cookie = res.cookies.find((c) => c.name === 'sid')
  assert.ok(cookie, `a sid cookie in ${JSON.stringify(res.headers['set-cookie'])}`)
  return { sid: cookie.value }
}
const idOf = (cookies: Cookies) => cookies.sid!.split('.')[0]!

async function login(app: FastifyInstance, user = 'alice', data?: Record<string, SessionValue>) {
  const res = await app.inject({ method: 'POST', url: '/login', payload: { user, data } })
  assert.equal(res.statusCode, 200, res.body)
  return sidOf(res)
}

const put = (app: FastifyInstance, cookies: Cookies, name: string, value: SessionValue) =>
  app.inject({ method: 'PUT', url: `/field/${name}`, cookies, payload: { value } })
const read = async (app: FastifyInstance, cookies: Cookies, name: string) =>
  (await app.inject({ url: `/field/${name}`, cookies })).json().value

async function countCommands(run: () => Promise<unknown>): Promise<string[]> {
  sent = []
  counting = true
  try {
    await run()
  } finally {
    counting = false
  }
  // An EVAL follows an EVALSHA only when the server lost its script cache (another suite's SCRIPT FLUSH).
  return sent.filter((name) => name !== 'eval')
}

describe('get and set', () => {
  let app: FastifyInstance
  before(async () => {
    app = await buildApp()
  })
  after(() => app.close())

  test('JSON values set in one request are read back in the next, stored as JSON in the hash', async () => {
    const cookies = await login(app)
    const values: Record<string, SessionValue> = {
      cart: { items: [{ sku: 'a-1', qty: 2 }], total: 19.5, coupon: null },
      theme: 'dark',
      visits: 3,
      beta: true,
      nothing: null,
      tags: ['x', 'ÿ', '😀'],
      _csrf: 'secret',
    }
    for (const [name, value] of Object.entries(values)) {
      assert.equal((await put(app, cookies, name, value)).statusCode, 200)
    }
    for (const [name, value] of Object.entries(values))
      assert.deepEqual(await read(app, cookies, name), value)
    assert.deepEqual((await app.inject({ url: '/data', cookies })).json().data, values)
    const stored = await redis.hgetall(app.sessions.sessionKey(idOf(cookies)))
    assert.equal(stored.theme, '"dark"')
    assert.deepEqual(JSON.parse(stored.cart!), values.cart)
    assert.equal(stored._principal, 'alice', 'the store fields are untouched')
  })

  test('delete removes the field from Redis; a missing field reads as undefined', async () => {
    const cookies = await login(app)
    await put(app, cookies, 'theme', 'dark')
    const res = await app.inject({ method: 'DELETE', url: '/field/theme', cookies })
    assert.deepEqual(res.json(), { deleted: true })
    assert.equal(await redis.hexists(app.sessions.sessionKey(idOf(cookies)), 'theme'), 0)
    assert.equal(await read(app, cookies, 'theme'), null)
    assert.deepEqual((await app.inject({ method: 'DELETE', url: '/field/theme', cookies })).json(), {
      deleted: false,
    })
  })

  test('login data is JSON too', async () => {
    const cookies = await login(app, 'bob', { plan: 'gold', limits: { daily: 500 } })
    assert.deepEqual((await app.inject({ url: '/data', cookies })).json().data, {
      plan: 'gold',
      limits: { daily: 500 },
    })
  })

  test('a request that changes nothing sends only the load; an unchanged value is not written', async () => {
    const cookies = await login(app)
    await put(app, cookies, 'theme', 'dark')
    const key = app.sessions.sessionKey(idOf(cookies))
    const reading = await countCommands(() => app.inject({ url: '/field/theme', cookies }))
    // The idle expiry was slid at login, less than touchAfterMs ago: the load is one read (the
    // save above dropped the session from the L1).
    assert.deepEqual(reading, ['hgetall'], 'the load only')
    const same = await countCommands(() => put(app, cookies, 'theme', 'dark'))
    assert.deepEqual(same, [], 'loaded from the L1; setting the value it holds writes nothing')
    const changed = await countCommands(() => put(app, cookies, 'theme', 'light'))
    assert.deepEqual(changed, ['evalsha', 'publish'], 'one save, then its invalidation')
    assert.equal(await redis.hget(key, 'theme'), '"light"')
  })

  test('20 concurrent requests each setting its own field: all 20 are kept', async () => {
    const cookies = await login(app)
    await put(app, cookies, 'existing', 'kept')
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, i) => put(app, cookies, `field${i}`, { n: i })),
    )
    for (const res of responses) assert.equal(res.statusCode, 200)
    const stored = await redis.hgetall(app.sessions.sessionKey(idOf(cookies)))
    for (let i = 0; i < 20; i++) assert.equal(stored[`field${i}`], JSON.stringify({ n: i }))
    assert.equal(stored.existing, '"kept"')
  })

  test('concurrent deletes and sets of different fields do not undo each other', async () => {
    const cookies = await login(app)
    for (let i = 0; i < 10; i++) await put(app, cookies, `old${i}`, i)
    await Promise.all([
      ...Array.from({ length: 10 }, (_, i) =>
        app.inject({ method: 'DELETE', url: `/field/old${i}`, cookies }),
      ),
      ...Array.from({ length: 10 }, (_, i) => put(app, cookies, `new${i}`, i)),
    ])
    const stored = await redis.hgetall(app.sessions.sessionKey(idOf(cookies)))
    const names = Object.keys(stored).filter((name) => !name.startsWith('_'))
    assert.deepEqual(names.sort(), Array.from({ length: 10 }, (_, i) => `new${i}`).sort())
  })
})

describe('saves never resurrect a session', () => {
  let app: FastifyInstance
  let release: () => void = () => {}
  let entered: () => void = () => {}
  before(async () => {
    app = Fastify()
    await app.register(sessionPlugin, { redis, secrets: [TEST_SECRET], keyPrefix: uniquePrefix('sesslate') })
    app.post('/login', async (_request, reply) => {
      await reply.regenerateSession('carol')
      return { ok: true }
    })
    app.post('/logout', async (_request, reply) => {
      await reply.destroySession()
      return reply.code(204).send()
    })
    app.post('/slow', async (request) => {
      request.session!.set('late', 'write')
      entered()
      await new Promise<void>((resolve) => {
        release = resolve
      })
      return { ok: true }
    })
    await app.ready()
  })
  after(() => app.close())

  test('a slow request that set a field finishing after logout writes nothing', async () => {
    const cookies = sidOf(await app.inject({ method: 'POST', url: '/login' }))
    const key = app.sessions.sessionKey(idOf(cookies))
    const inHandler = new Promise<void>((resolve) => {
      entered = resolve
    })
    const slow = app.inject({ method: 'POST', url: '/slow', cookies })
    await inHandler
    assert.equal((await app.inject({ method: 'POST', url: '/logout', cookies })).statusCode, 204)
    release()
    assert.equal((await slow).statusCode, 200)
    assert.equal(await redis.exists(key), 0, 'the session stays deleted')
  })

  test('a save after the absolute lifetime passed deletes the session instead of writing', async () => {
    const session = await app.sessions.create('dave')
    const key = app.sessions.sessionKey(session.id)
    // The key's own expiry never outlives the absolute lifetime; keep it so the script's own check decides.
    await redis.hset(key, '_absoluteExpiresAt', Date.now() - 1000)
    await redis.persist(key)
    assert.equal(await app.sessions.set(session.id, { theme: 'dark' }), false)
    assert.equal(await redis.exists(key), 0)
  })

  test('session.save() resolves false once the session is gone', async () => {
    const loaded = (await app.sessions.load((await app.sessions.create('erin')).id))!
    loaded.set('a', 1)
    assert.equal(await loaded.save(), true)
    assert.equal(await redis.hget(app.sessions.sessionKey(loaded.id), 'a'), '1')
    await app.sessions.destroy(loaded.id, 'erin')
    loaded.set('b', 2)
    assert.equal(await loaded.save(), false)
    assert.equal(await redis.exists(app.sessions.sessionKey(loaded.id)), 0)
  })
})

describe('touch', () => {
  let app: FastifyInstance
  before(async () => {
    app = Fastify()
    await app.register(sessionPlugin, {
      redis,
      secrets: [TEST_SECRET],
      keyPrefix: uniquePrefix('sesstouch'),
      idleTimeoutMs: 600_000,
    })
    app.post('/login', async (_request, reply) => {
      await reply.regenerateSession('frank')
      return { ok: true }
    })
    // Shortens the key's expiry as if the request had run for a long time, then touches (or not).
    app.post<{ Querystring: { touch?: string } }>('/long', async (request) => {
      await redis.pexpire(app.sessions.sessionKey(request.session!.id), 5_000)
      if (request.query.touch === 'yes') request.session!.touch()
      return { ok: true }
    })
    await app.ready()
  })
  after(() => app.close())

  test('touch() slides the idle expiry again at the end of the request; without it nothing is written', async () => {
    const cookies = sidOf(await app.inject({ method: 'POST', url: '/login' }))
    const key = app.sessions.sessionKey(idOf(cookies))
    await app.inject({ method: 'POST', url: '/long', cookies })
    assert.ok((await redis.pttl(key)) <= 5_000, 'no touch: the expiry is left alone')
    await app.inject({ method: 'POST', url: '/long?touch=yes', cookies })
    assert.ok((await redis.pttl(key)) > 500_000, 'touched: slid by the idle timeout')
  })
})

describe('validation', () => {
  let app: FastifyInstance
  before(async () => {
    app = await buildApp()
  })
  after(() => app.close())

  test('reserved and malformed names are refused, by the session and by the store', async () => {
    const session = (await app.sessions.load((await app.sessions.create('gina')).id))!
    for (const name of ['_principal', '_createdAt', '_absoluteExpiresAt', '__proto__', '__future']) {
      assert.throws(() => session.set(name, 'x'), { name: 'TypeError', message: /reserved/ }, name)
      await assert.rejects(app.sessions.set(session.id, { [name]: 'x' }), { name: 'TypeError' }, name)
    }
    for (const name of ['', '-x', 'a b', 'x'.repeat(65), 'é']) {
      assert.throws(() => session.set(name, 'x'), {
        name: 'TypeError',
        message: /Invalid session field name/,
      })
    }
    assert.equal(await redis.hget(app.sessions.sessionKey(session.id), '_principal'), 'gina')
  })

  test('values JSON would not give back unchanged are refused', async () => {
    const session = (await app.sessions.load((await app.sessions.create('hank')).id))!
    class Point {
      x = 1
    }
    const cyclic: Record<string, unknown> = {}
    cyclic.self = cyclic
    const refused: unknown[] = [
      { a: undefined },
      [1, undefined],
      // biome-ignore lint/suspicious/noSparseArray: a hole is what is tested
      [1, , 3],
      () => 1,
      Symbol('s'),
      10n,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      new Date(),
      new Map(),
      new Point(),
      { [Symbol('k')]: 1 },
      { toJSON: () => 'x' },
    ]
    for (const value of refused) {
      assert.throws(() => session.set('v', value as SessionValue), { name: 'TypeError' }, String(value))
    }
    assert.throws(() => session.set('v', cyclic as SessionValue), { name: 'RangeError' })
    assert.equal(session.isModified(), false, 'nothing refused was recorded')
  })

  test('a field over MAX_FIELD_BYTES and a session over MAX_SESSION_BYTES are refused', async () => {
    const session = (await app.sessions.load((await app.sessions.create('ivy')).id))!
    session.set('fits', 'x'.repeat(MAX_FIELD_BYTES - 2))
    assert.throws(() => session.set('big', 'x'.repeat(MAX_FIELD_BYTES - 1)), { name: 'RangeError' })
    assert.throws(() => session.set('big', 'é'.repeat(MAX_FIELD_BYTES / 2)), { name: 'RangeError' })
    const chunk = 'y'.repeat(MAX_FIELD_BYTES - 100)
    session.set('a', chunk)
    session.set('b', chunk)
    session.set('c', chunk)
    assert.throws(() => session.set('d', chunk), { name: 'RangeError', message: /exceed/ })
    assert.equal(await session.save(), true)
    await assert.rejects(app.sessions.create('ivy', { a: chunk, b: chunk, c: chunk, d: chunk, e: chunk }), {
      name: 'RangeError',
    })
  })

  test('the size bound holds across concurrent requests: Redis refuses the save that crosses it', async () => {
    const { id } = await app.sessions.create('jack')
    const first = (await app.sessions.load(id))!
    const second = (await app.sessions.load(id))!
    const chunk = 'z'.repeat(MAX_FIELD_BYTES - 100)
    // Each copy alone stays under the bound; together they would not.
    for (const name of ['a', 'b', 'c']) first.set(name, chunk)
    for (const name of ['d', 'e']) second.set(name, chunk)
    assert.ok(3 * chunk.length < MAX_SESSION_BYTES && 5 * chunk.length > MAX_SESSION_BYTES)
    assert.equal(await first.save(), true)
    await assert.rejects(second.save(), { name: 'RangeError' })
    const stored = await redis.hgetall(app.sessions.sessionKey(id))
    assert.equal(stored.d, undefined, 'nothing of the refused save is written')
  })
})

describe('anonymous sessions (saveUninitialized)', () => {
  let app: FastifyInstance
  let prefix: string
  before(async () => {
    prefix = uniquePrefix('sessanon')
    app = await buildApp({ saveUninitialized: true, keyPrefix: prefix })
  })
  after(() => app.close())

  test('a request that sets nothing stores nothing and sends no cookie', async () => {
    const res = await app.inject({ url: '/field/theme' })
    assert.equal(res.statusCode, 200)
    assert.equal(res.headers['set-cookie'], undefined)
    assert.deepEqual(await scanKeys(redis, prefix), [])
  })

  test('the first set stores an anonymous session; it is read back, never counts as a principal', async () => {
    const first = await put(app, {}, 'cart', ['book'])
    assert.equal(first.statusCode, 200)
    const cookies = sidOf(first)
    const key = app.sessions.sessionKey(idOf(cookies))
    assert.equal(await redis.hget(key, '_principal'), '')
    assert.ok((await redis.pttl(key)) > 0)
    assert.deepEqual(await read(app, cookies, 'cart'), ['book'])
    assert.deepEqual((await app.inject({ url: '/principal', cookies })).json(), { principal: null })
    assert.equal((await app.inject({ url: '/me', cookies })).statusCode, 401)
    assert.equal((await scanKeys(redis, `${prefix}principal:`)).length, 0, 'in no principal index')
  })

  test('logging in replaces the anonymous session with a new id (no fixation)', async () => {
    const anonymous = sidOf(await put(app, {}, 'cart', ['pen']))
    const res = await app.inject({
      method: 'POST',
      url: '/login',
      cookies: anonymous,
      payload: { user: 'kim' },
    })
    const signedIn = sidOf(res)
    assert.notEqual(idOf(signedIn), idOf(anonymous))
    assert.equal(await redis.exists(app.sessions.sessionKey(idOf(anonymous))), 0)
    assert.deepEqual((await app.inject({ url: '/me', cookies: signedIn })).json(), { principal: 'kim' })
    assert.equal(await read(app, signedIn, 'cart'), null, 'anonymous data is not carried into the login')
    assert.deepEqual((await app.inject({ url: '/principal', cookies: anonymous })).json(), {
      principal: null,
    })
  })

  test('after logout the request has a fresh anonymous session again', async () => {
    const cookies = await login(app, 'lea')
    const out = await app.inject({ method: 'POST', url: '/logout', cookies })
    assert.equal(out.statusCode, 204)
    assert.equal(await redis.exists(app.sessions.sessionKey(idOf(cookies))), 0)
    assert.deepEqual((await app.inject({ url: '/principal', cookies })).json(), { principal: null })
  })
})

describe('@fastify/csrf-protection', () => {
  let app: FastifyInstance
  before(async () => {
    app = Fastify()
    await app.register(sessionPlugin, {
      redis,
      secrets: [TEST_SECRET],
      keyPrefix: uniquePrefix('sesscsrf'),
      saveUninitialized: true,
    })
    // Its '@fastify/secure-session' mode reads and writes request.session.get/set, which ours offers.
    await app.register(fastifyCsrf, { sessionPlugin: '@fastify/secure-session' })
    app.get('/csrf', async (_request, reply) => ({ token: reply.generateCsrf() }))
    app.post('/login', async (_request, reply) => {
      await reply.regenerateSession('mia')
      return { ok: true }
    })
    // The session is known from preParsing on: the check runs in preHandler (or preValidation).
    app.post('/transfer', { preHandler: app.csrfProtection }, async () => ({ done: true }))
    await app.ready()
  })
  after(() => app.close())

  test('a token from one request validates in the next; forged, foreign or sessionless ones are refused', async () => {
    const res = await app.inject({ url: '/csrf' })
    const cookies = sidOf(res)
    const { token } = res.json()
    const post = (c: Cookies, t: string | undefined) =>
      app.inject({ method: 'POST', url: '/transfer', cookies: c, headers: t ? { 'csrf-token': t } : {} })

    assert.deepEqual((await post(cookies, token)).json(), { done: true })
    // The same session's next token validates too (the secret is kept).
    const again = (await app.inject({ url: '/csrf', cookies })).json().token
    assert.equal((await post(cookies, again)).statusCode, 200)

    const forged = `${token.slice(0, -2)}${token.endsWith('aa') ? 'bb' : 'aa'}`
    assert.equal((await post(cookies, forged)).statusCode, 403)
    assert.equal((await post(cookies, undefined)).statusCode, 403)
    assert.equal((await post({}, token)).statusCode, 403, 'no session: no secret')
    const other = sidOf(await app.inject({ url: '/csrf' }))
    assert.equal((await post(other, token)).statusCode, 403, "another session's token")

    // Login regenerates the session: the pre-login token is dead, a new one works.
    const signedIn = sidOf(await app.inject({ method: 'POST', url: '/login', cookies }))
    assert.equal((await post(signedIn, token)).statusCode, 403)
    const fresh = (await app.inject({ url: '/csrf', cookies: signedIn })).json().token
    assert.equal((await post(signedIn, fresh)).statusCode, 200)
  })
})

describe('Redis failing at the save', () => {
  let server: RedisServerProcess
  let client: RedisClient
  let app: FastifyInstance
  before(async () => {
    server = await startRedisServer()
    client = createRedisClient({ url: server.url })
    app = Fastify()
    await app.register(sessionPlugin, {
      redis: client,
      secrets: [TEST_SECRET],
      keyPrefix: uniquePrefix('sessdown'),
      saveUninitialized: true,
    })
    app.post('/login', async (_request, reply) => {
      await reply.regenerateSession('nia')
      return { ok: true }
    })
    app.post('/set-then-outage', async (request) => {
      request.session!.set('theme', 'dark')
      await server.stop()
      return { ok: true }
    })
    app.post('/set', async (request) => {
      request.session!.set('theme', 'dark')
      return { ok: true }
    })
    await app.ready()
  })
  after(async () => {
    await app.close()
    client.disconnect()
    await server.stop()
  })

  test('a save that cannot reach Redis answers 503 with Retry-After; so does an anonymous one', async () => {
    const cookies = sidOf(await app.inject({ method: 'POST', url: '/login' }))
    const res = await app.inject({ method: 'POST', url: '/set-then-outage', cookies })
    assert.equal(res.statusCode, 503, res.body)
    assert.equal(res.headers['retry-after'], '1')
    // Redis is down: the presented session cannot be loaded, so no anonymous one replaces it.
    const anonymous = await app.inject({ method: 'POST', url: '/set', cookies })
    assert.equal(anonymous.statusCode, 503, anonymous.body)
    assert.equal(anonymous.headers['set-cookie'], undefined)
  })
})
