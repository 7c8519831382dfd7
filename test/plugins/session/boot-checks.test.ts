import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { freePort, startRedisServer } from '../../../src/embedded/redis-server.ts'
import {
  InvalidOptionError,
  RouteNotProtectedError,
  UnknownOptionError,
} from '../../../src/plugins/common/errors.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, {
  requireSession,
  SessionFieldNameError,
  SessionNotRegisteredError,
  type SessionPluginOptions,
  SessionPrincipalError,
  SessionTooLargeError,
  SessionValueError,
} from '../../../src/plugins/session/index.ts'
import { cookieHeader, TEST_SECRET, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

let redis: RedisClient
before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(() => redis.quit())

/** A Fastify app whose log lines the test reads. */
function loggedApp() {
  const lines: Array<{ level: number; msg: string }> = []
  const stream = { write: (line: string) => void lines.push(JSON.parse(line)) }
  return { app: Fastify({ logger: { level: 'warn', stream } }), lines }
}

const base = (): SessionPluginOptions => ({
  redis,
  secrets: [TEST_SECRET],
  keyPrefix: uniquePrefix('sessboot'),
})

async function register(options: Record<string, unknown>): Promise<unknown> {
  const app = Fastify()
  try {
    await app.register(sessionPlugin, options as never)
    await app.ready()
    return undefined
  } catch (err) {
    return err
  } finally {
    await app.close()
  }
}

test("an unknown option fails registration, with @fastify/session's names mapped to this plugin's", async () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ secret: TEST_SECRET }, /unknown option `secret`\. `secrets` takes an array .*`secrets: \[secret\]`/],
    [
      { cookie: { secure: true } },
      /unknown option `cookie`\. cookie attributes are flat options here: `secure`/,
    ],
    [{ store: {} }, /unknown option `store`\. the store is always Redis: pass `redis`/],
    [
      { rolling: false },
      /unknown option `rolling`\. every request that presents the session slides its idle expiry/,
    ],
    [{ idleTimeoutMS: 60_000 }, /unknown option `idleTimeoutMS`\. Did you mean `idleTimeoutMs`\?/],
  ]
  for (const [extra, message] of cases) {
    const err = await register({ ...base(), ...extra })
    assert.ok(err instanceof UnknownOptionError, `${Object.keys(extra)[0]}: ${err}`)
    assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
    assert.match(err.message, /^session plugin: /)
    assert.match(err.message, message)
    assert.ok(
      err.validOptions.includes('secrets') && err.validOptions.includes('saveUninitialized'),
      `err.validOptions.includes('secrets') && err.validOptions.includes('saveUninitialized')`,
    )
    assert.ok(err.validOptions.includes('connectTimeoutMs'), `err.validOptions.includes('connectTimeoutMs')`)
  }
})

test('a wrong value fails registration with InvalidOptionError naming the option', async () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ secrets: TEST_SECRET }, /`secrets` must be a non-empty array of strings, got a string/],
    [{ secrets: ['short'] }, /every secret in `secrets` must be a string of at least 32 characters/],
    [{ connectTimeoutMs: -1 }, /`connectTimeoutMs` must be an integer of at least 0, got -1/],
    [{ keyPrefix: 7 }, /`keyPrefix` must be a string, got 7/],
    [{ cookieName: 7 }, /`cookieName` must be 1-32 letters/],
  ]
  for (const [extra, message] of cases) {
    const err = await register({ ...base(), ...extra })
    assert.ok(err instanceof InvalidOptionError, `${Object.keys(extra)[0]}: ${err}`)
    assert.equal(err.code, 'FRG_INVALID_OPTION')
    assert.match(err.message, message)
  }
  const notAnObject = await register(undefined as never)
  assert.ok(notAnObject instanceof InvalidOptionError, 'notAnObject instanceof InvalidOptionError')
})

test("a route's `config.session` other than 'required' or 'optional' is refused, or taken as 'required'", async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  // Declared before the plugin: its onRoute check cannot see it, so the value must not open the route.
  app.get('/early', { config: { session: 'require' as never } }, async () => 'in')
  await app.register(sessionPlugin, base())
  assert.throws(
    () => app.get('/me', { config: { session: 'require' as never } }, async () => 'in'),
    (err: InvalidOptionError) => {
      assert.ok(err instanceof InvalidOptionError, 'err instanceof InvalidOptionError')
      assert.equal(err.code, 'FRG_INVALID_OPTION')
      assert.match(
        err.message,
        /route GET \/me: `config.session` must be 'required' or 'optional', got a string \('require'\)/,
      )
      return true
    },
  )
  await app.ready()
  assert.equal((await app.inject({ url: '/early' })).statusCode, 401)
})

test('a required session: refused at ready() in a sibling context registered before the plugin, protected in its own context whenever declared', async (t) => {
  const sibling = Fastify()
  t.after(() => sibling.close())
  await sibling.register(async (context) => {
    context.get('/me', { config: { session: 'required' } }, async () => 'unprotected')
  })
  await sibling.register(sessionPlugin, base())
  await assert.rejects(
    async () => void (await sibling.ready()),
    (err: RouteNotProtectedError) => {
      assert.ok(err instanceof RouteNotProtectedError, 'err instanceof RouteNotProtectedError')
      assert.equal(err.code, 'FRG_ROUTE_NOT_PROTECTED')
      assert.equal(err.url, '/me')
      assert.match(err.message, /register the session plugin before the route/)
      return true
    },
  )

  const app = Fastify()
  t.after(() => app.close())
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    user: requireSession(request).principal,
  }))
  await app.register(sessionPlugin, base())
  app.post('/login', async (_request, reply) => {
    await reply.regenerateSession('ada')
    return { ok: true }
  })
  await app.register(async (child) => {
    child.get('/child/me', { config: { session: 'required' } }, async (request) => ({
      user: requireSession(request).principal,
    }))
  })
  await app.ready()
  const anonymous = await app.inject({ url: '/me' })
  assert.equal(anonymous.statusCode, 401)
  assert.equal(anonymous.json().code, 'FRG_SESSION_REQUIRED')
  assert.equal((await app.inject({ url: '/child/me' })).statusCode, 401)
  const login = await app.inject({ method: 'POST', url: '/login' })
  const cookie = cookieHeader(login.headers['set-cookie'])
  assert.deepEqual((await app.inject({ url: '/me', headers: { cookie } })).json(), { user: 'ada' })
  assert.deepEqual((await app.inject({ url: '/child/me', headers: { cookie } })).json(), { user: 'ada' })
})

test('requireSession: 401 without a signed-in session, a coded error where the plugin never ran', async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(sessionPlugin, { ...base(), saveUninitialized: true })
  app.get('/optional', async (request) => ({ user: requireSession(request).principal }))
  const bare = Fastify()
  t.after(() => bare.close())
  let thrown: unknown
  bare.get('/x', async (request) => {
    try {
      requireSession(request)
    } catch (err) {
      thrown = err
    }
    return 'done'
  })
  const anonymous = await app.inject({ url: '/optional' })
  assert.equal(anonymous.statusCode, 401, 'an anonymous session is not a signed-in one')
  assert.equal(anonymous.json().code, 'FRG_SESSION_REQUIRED')
  await bare.inject({ url: '/x' })
  assert.ok(thrown instanceof SessionNotRegisteredError, 'thrown instanceof SessionNotRegisteredError')
  assert.equal(thrown.code, 'FRG_SESSION_NOT_REGISTERED')
  assert.match(thrown.message, /no session plugin ran for GET \/x/)
})

test('every error the session API throws to its caller has a code and keeps its built-in class', async (t) => {
  const app = Fastify()
  t.after(() => app.close())
  await app.register(sessionPlugin, base())
  await app.ready()
  const created = await app.sessions.create('bo')
  const expect = (
    fn: () => unknown,
    cls: new (...args: never[]) => Error,
    builtin: typeof TypeError,
    code: string,
  ) =>
    assert.throws(fn, (err: Error & { code: string }) => {
      assert.ok(err instanceof cls && err instanceof builtin, String(err))
      assert.equal(err.name, builtin.name)
      assert.equal(err.code, code)
      return true
    })
  expect(
    () => created.set('_principal', 'x'),
    SessionFieldNameError,
    TypeError,
    'FRG_SESSION_FIELD_NAME_INVALID',
  )
  expect(
    () => created.set('bad name', 'x'),
    SessionFieldNameError,
    TypeError,
    'FRG_SESSION_FIELD_NAME_INVALID',
  )
  expect(
    () => created.set('when', new Date() as never),
    SessionValueError,
    TypeError,
    'FRG_SESSION_VALUE_NOT_JSON',
  )
  expect(
    () => created.set('big', 'x'.repeat(5000)),
    SessionTooLargeError,
    RangeError,
    'FRG_SESSION_TOO_LARGE',
  )
  await assert.rejects(app.sessions.create(''), (err: SessionPrincipalError) => {
    assert.ok(
      err instanceof SessionPrincipalError && err instanceof TypeError,
      'err instanceof SessionPrincipalError && err instanceof TypeError',
    )
    assert.equal(err.code, 'FRG_SESSION_PRINCIPAL_INVALID')
    assert.match(err.message, /1-128 characters, got one of 0/)
    return true
  })
  await app.sessions.destroy(created.id, 'bo')
})

test('an allkeys-* eviction policy is warned about once, and sessions still work', async (t) => {
  const server = await startRedisServer(undefined, 'redis-server', ['--maxmemory-policy', 'allkeys-lru'])
  t.after(() => server.stop())
  const client = new Redis(server.url)
  t.after(() => client.quit())
  const { app, lines } = loggedApp()
  t.after(() => app.close())
  await app.register(sessionPlugin, { redis: client, secrets: [TEST_SECRET] })
  app.post('/login', async (_request, reply) => {
    await reply.regenerateSession('cy')
    return { ok: true }
  })
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    user: requireSession(request).principal,
  }))
  await app.ready()
  const warnings = lines.filter((line) => /maxmemory-policy allkeys-lru/.test(line.msg))
  assert.equal(warnings.length, 1, JSON.stringify(lines))
  assert.equal(warnings[0]!.level, 40)
  assert.match(warnings[0]!.msg, /^session plugin: /)
  const cookie = cookieHeader((await app.inject({ method: 'POST', url: '/login' })).headers['set-cookie'])
  assert.deepEqual((await app.inject({ url: '/me', headers: { cookie } })).json(), { user: 'cy' })
})

test('connectTimeoutMs: 0 does not wait at boot for a Redis that is away', async (t) => {
  const port = await freePort()
  const away = new Redis({ port, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 })
  away.on('error', () => {})
  t.after(() => away.disconnect())
  const { app, lines } = loggedApp()
  t.after(() => app.close())
  await app.register(sessionPlugin, { redis: away, secrets: [TEST_SECRET], connectTimeoutMs: 0 })
  await app.ready()
  assert.deepEqual(
    lines.filter((line) => /not ready at boot/.test(line.msg)),
    [],
    'no boot wait, so no warning that it ran out',
  )
})
