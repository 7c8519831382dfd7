import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type LightMyRequestResponse } from 'fastify'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, { type SessionPluginOptions } from '../../../src/plugins/session/index.ts'
import { TEST_SECRET, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

let redis: RedisClient
before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(() => redis.quit())

const apps: FastifyInstance[] = []
after(() => Promise.all(apps.map((app) => app.close())))

/** An app behind a proxy that says whether the client came over HTTPS (`x-forwarded-proto`). */
async function buildApp(options: Partial<SessionPluginOptions>): Promise<FastifyInstance> {
  const app = Fastify({ trustProxy: true })
  apps.push(app)
  await app.register(sessionPlugin, {
    redis,
    secrets: [TEST_SECRET],
    keyPrefix: uniquePrefix('sesscookie'),
    ...options,
  })
  app.post('/login', async (_request, reply) => {
    await reply.regenerateSession('alice')
    return { ok: true }
  })
  app.post('/logout', async (_request, reply) => {
    await reply.destroySession()
    return reply.code(204).send()
  })
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    principal: request.session!.principal,
  }))
  await app.ready()
  return app
}

const https = { 'x-forwarded-proto': 'https' }
const setCookie = (res: LightMyRequestResponse) => String(res.headers['set-cookie'])
const cookieNamed = (res: LightMyRequestResponse, name: string) => {
  const cookie = res.cookies.find((c) => c.name === name)
  assert.ok(cookie, `${name} in ${setCookie(res)}`)
  return cookie
}

describe('cookie attributes', () => {
  test('domain and path are sent at login and at logout', async () => {
    const app = await buildApp({ domain: 'example.com', path: '/app' })
    const login = await app.inject({ method: 'POST', url: '/login' })
    const cookie = cookieNamed(login, 'sid')
    assert.equal(cookie.domain, 'example.com')
    assert.equal(cookie.path, '/app')
    assert.equal(cookie.httpOnly, true)
    const out = await app.inject({ method: 'POST', url: '/logout', cookies: { sid: cookie.value } })
    assert.equal(out.statusCode, 204)
    assert.match(setCookie(out), /^sid=; Max-Age=0; Domain=example\.com; Path=\/app;/)
  })

  test("sameSite 'none' with secure: SameSite=None; Secure under the __Host- prefix", async () => {
    const app = await buildApp({ secure: true, sameSite: 'none' })
    const login = await app.inject({ method: 'POST', url: '/login', headers: https })
    const header = setCookie(login)
    assert.match(header, /^__Host-sid=/)
    assert.match(header, /SameSite=None/)
    assert.match(header, /Secure/)
    assert.match(header, /Path=\//)
    assert.doesNotMatch(header, /Domain=/)
    const cookie = cookieNamed(login, '__Host-sid')
    assert.equal((await app.inject({ url: '/me', cookies: { '__Host-sid': cookie.value } })).statusCode, 200)
  })

  test('partitioned with secure: the Partitioned attribute', async () => {
    const app = await buildApp({ secure: true, sameSite: 'none', partitioned: true })
    const header = setCookie(await app.inject({ method: 'POST', url: '/login', headers: https }))
    assert.match(header, /Partitioned/)
    assert.match(header, /SameSite=None/)
  })

  test('secure with a domain or another path: the __Secure- prefix (__Host- forbids both)', async () => {
    for (const options of [{ domain: 'example.com' }, { path: '/app' }]) {
      const app = await buildApp({ secure: true, ...options })
      const login = await app.inject({ method: 'POST', url: '/login', headers: https })
      assert.match(setCookie(login), /^__Secure-sid=.*Secure/, JSON.stringify(options))
      const cookie = cookieNamed(login, '__Secure-sid')
      assert.equal(
        (await app.inject({ url: '/me', cookies: { '__Secure-sid': cookie.value } })).statusCode,
        200,
      )
    }
  })
})

describe("secure: 'auto'", () => {
  test('Secure over HTTPS, not over HTTP; the name has no prefix and is read either way', async () => {
    const app = await buildApp({ secure: 'auto' })
    const overHttps = await app.inject({ method: 'POST', url: '/login', headers: https })
    const secureCookie = cookieNamed(overHttps, 'sid')
    assert.equal(secureCookie.secure, true)
    assert.match(setCookie(overHttps), /SameSite=Lax/)
    const overHttp = await app.inject({ method: 'POST', url: '/login' })
    assert.equal(cookieNamed(overHttp, 'sid').secure, undefined)
    for (const headers of [https, {}]) {
      assert.equal(
        (await app.inject({ url: '/me', headers, cookies: { sid: secureCookie.value } })).statusCode,
        200,
      )
    }
  })

  test("with sameSite 'none' and partitioned: None and Partitioned over HTTPS, Lax over HTTP", async () => {
    const app = await buildApp({ secure: 'auto', sameSite: 'none', partitioned: true })
    const overHttps = setCookie(await app.inject({ method: 'POST', url: '/login', headers: https }))
    assert.match(overHttps, /SameSite=None/)
    assert.match(overHttps, /Partitioned/)
    assert.match(overHttps, /Secure/)
    const overHttp = setCookie(await app.inject({ method: 'POST', url: '/login' }))
    assert.match(overHttp, /SameSite=Lax/)
    assert.doesNotMatch(overHttp, /Partitioned|Secure/)
  })

  test('logout clears the cookie with the attributes of the request protocol', async () => {
    const app = await buildApp({ secure: 'auto', domain: 'example.com' })
    const login = await app.inject({ method: 'POST', url: '/login', headers: https })
    const out = await app.inject({
      method: 'POST',
      url: '/logout',
      headers: https,
      cookies: { sid: cookieNamed(login, 'sid').value },
    })
    assert.match(setCookie(out), /^sid=; Max-Age=0; Domain=example\.com; Path=\/;.*Secure/)
  })
})

describe('cookie option messages', () => {
  test('each wrong cookie option fails registration with its message', async () => {
    const cases: Array<[Partial<SessionPluginOptions> | Record<string, unknown>, string]> = [
      [{ secure: 'yes' }, "session plugin: `secure` must be true, false or 'auto', got a string ('yes')"],
      [
        { sameSite: 'relaxed' },
        "session plugin: `sameSite` must be 'lax', 'strict' or 'none', got a string ('relaxed')",
      ],
      [{ sameSite: 'none' }, "session plugin: `sameSite: 'none'` requires `secure` (true or 'auto')"],
      [{ partitioned: 'yes' }, "session plugin: `partitioned` must be true or false, got a string ('yes')"],
      [{ partitioned: true }, "session plugin: `partitioned` requires `secure` (true or 'auto')"],
      [{ domain: 'exa mple.com' }, 'session plugin: `domain` must be a host name such as example.com'],
      [{ domain: '' }, 'session plugin: `domain` must be a host name such as example.com'],
      [
        { path: 'app' },
        'session plugin: `path` must start with / and hold no spaces, semicolons or control characters',
      ],
      [
        { path: '/a;b' },
        'session plugin: `path` must start with / and hold no spaces, semicolons or control characters',
      ],
      [
        { saveUninitialized: 'yes' },
        "session plugin: `saveUninitialized` must be true or false, got a string ('yes')",
      ],
    ]
    for (const [options, message] of cases) {
      const app = Fastify()
      await assert.rejects(
        async () => {
          await app.register(sessionPlugin, { redis, secrets: [TEST_SECRET], ...options } as never)
          await app.ready()
        },
        { message },
        message,
      )
      await app.close()
    }
  })
})
