import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import fastifyCookie from '@fastify/cookie'
import Fastify, { type FastifyInstance, type LightMyRequestResponse } from 'fastify'
import metricsPlugin from '../../../src/plugins/metrics/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, { type SessionPluginOptions } from '../../../src/plugins/session/index.ts'
import { scanKeys, TEST_SECRET, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { delta, scrape } from '../../helpers/metrics-scrape.ts'

// `request.sessionDecision` on a plain Fastify app on the real Redis: each decision the plugin can
// take about a request's session, from the request the user makes.

let redis: RedisClient
const keyPrefix = uniquePrefix('sessdecide')
const apps: FastifyInstance[] = []

before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(async () => {
  await Promise.all(apps.map((app) => app.close()))
  const keys = await scanKeys(redis, keyPrefix)
  if (keys.length) await redis.del(...keys)
  await redis.quit()
})

/** An app on `client` (the shared one by default) whose GET / says what the plugin decided. */
async function buildApp(
  options: Partial<SessionPluginOptions> = {},
  client = redis,
): Promise<FastifyInstance> {
  const app = Fastify()
  apps.push(app)
  await app.register(sessionPlugin, { redis: client, secrets: [TEST_SECRET], keyPrefix, ...options })
  app.post<{ Body: { user: string } }>('/login', async (request, reply) => {
    await reply.regenerateSession(request.body.user)
    return { ok: true }
  })
  app.post('/logout', async (_request, reply) => {
    await reply.destroySession()
    return reply.code(204).send()
  })
  app.get('/', async (request) => ({
    decision: request.sessionDecision,
    principal: request.session?.principal ?? null,
    unavailable: request.sessionUnavailable,
  }))
  await app.ready()
  return app
}

type Cookies = Record<string, string>

const sidOf = (res: LightMyRequestResponse): Cookies => {
  const cookie = res.cookies.find((c) => c.name === 'sid')
  assert.ok(cookie, `a sid cookie in ${JSON.stringify(res.headers['set-cookie'])}`)
  return { sid: cookie.value }
}

async function login(app: FastifyInstance, user: string): Promise<Cookies> {
  const res = await app.inject({ method: 'POST', url: '/login', payload: { user } })
  assert.equal(res.statusCode, 200, res.body)
  return sidOf(res)
}

async function decide(app: FastifyInstance, cookies?: Cookies) {
  const res = await app.inject({ url: '/', ...(cookies ? { cookies } : {}) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json() as { decision: string; principal: string | null; unavailable: boolean }
}

describe('request.sessionDecision', () => {
  let app: FastifyInstance
  let other: FastifyInstance
  before(async () => {
    app = await buildApp()
    // A second instance on the same Redis: it has never slid anyone's idle expiry.
    other = await buildApp()
  })

  test("'none' without a cookie", async () => {
    assert.deepEqual(await decide(app), { decision: 'none', principal: null, unavailable: false })
  })

  test("'found' within touchAfterMs of this instance's last slide, 'slid' past it", async () => {
    const cookies = await login(app, 'ana')
    // The login slid it (created with its idle expiry): this instance does not slide it again yet.
    assert.deepEqual(await decide(app, cookies), { decision: 'found', principal: 'ana', unavailable: false })
    // Another instance does not know that: its first load slides, its next ones do not.
    assert.equal((await decide(other, cookies)).decision, 'slid')
    assert.equal((await decide(other, cookies)).decision, 'found')
    const everyRequest = await buildApp({ touchAfterMs: 0 })
    assert.equal((await decide(everyRequest, cookies)).decision, 'slid')
    assert.equal((await decide(everyRequest, cookies)).decision, 'slid')
  })

  test("'forged' for a cookie no secret signed, a tampered one, a malformed one, a signed non-id", async () => {
    const cookies = await login(app, 'ben')
    const [id, signature] = cookies.sid!.split('.') as [string, string]
    const flipped = `${signature[0] === 'A' ? 'B' : 'A'}${signature.slice(1)}`
    const otherSecret = await buildApp({ secrets: ['another-secret-0123456789-abcdefghijk'] })
    for (const [what, app_, sid] of [
      ['a tampered signature', app, `${id}.${flipped}`],
      ['no signature', app, id],
      ['over 256 characters', app, `${cookies.sid}${'x'.repeat(256)}`],
      ['a secret this app does not have', otherSecret, cookies.sid!],
      // Signed with the app's secret, but not 43 base64url characters: refused before any lookup.
      ["a signed value not of an id's form", app, fastifyCookie.signerFactory([TEST_SECRET]).sign(`${id}=`)],
    ] as const) {
      assert.deepEqual(
        await decide(app_, { sid }),
        { decision: 'forged', principal: null, unavailable: false },
        what,
      )
    }
    // The genuine cookie still works.
    assert.equal((await decide(app, cookies)).decision, 'found')
  })

  test("'ended' for a genuine cookie whose session was logged out, ended everywhere or lost", async () => {
    const loggedOut = await login(app, 'cleo')
    assert.equal((await app.inject({ method: 'POST', url: '/logout', cookies: loggedOut })).statusCode, 204)
    assert.deepEqual(await decide(app, loggedOut), { decision: 'ended', principal: null, unavailable: false })

    const everywhere = await login(app, 'dan')
    assert.equal(await app.sessions.destroyAll('dan'), 1)
    assert.equal((await decide(app, everywhere)).decision, 'ended')

    const lost = await login(app, 'eve')
    await redis.del(app.sessions.sessionKey(lost.sid!.split('.')[0]!))
    assert.equal((await decide(other, lost)).decision, 'ended')
  })

  test("'expired' past the absolute lifetime: the session is deleted", async () => {
    const cookies = await login(app, 'finn')
    const key = app.sessions.sessionKey(cookies.sid!.split('.')[0]!)
    // Its lifetime ended a second ago (stamped in the hash; checked on this process's clock).
    await redis.hset(key, '_absoluteExpiresAt', String(Date.now() - 1000))
    assert.deepEqual(await decide(app, cookies), { decision: 'expired', principal: null, unavailable: false })
    assert.equal(await redis.exists(key), 0)
    // Gone now: a later request finds nothing.
    assert.equal((await decide(app, cookies)).decision, 'ended')
  })
})

describe('request.sessionDecision with saveUninitialized', () => {
  test("'anonymous' without a cookie; a refused cookie keeps its reason", async () => {
    const app = await buildApp({ saveUninitialized: true })
    assert.deepEqual(await decide(app), { decision: 'anonymous', principal: '', unavailable: false })
    const cookies = await login(app, 'gus')
    assert.equal((await decide(app, cookies)).decision, 'found')
    await app.inject({ method: 'POST', url: '/logout', cookies })
    // The request gets an anonymous session all the same; the decision says why it is not gus's.
    assert.deepEqual(await decide(app, cookies), { decision: 'ended', principal: '', unavailable: false })
  })
})

describe('request.sessionDecision with Redis unreachable', () => {
  test("'unavailable' when the presented session cannot be loaded", async () => {
    const client = createRedisClient(testRedisConnection())
    await connectRedis(client)
    const app = await buildApp({}, client)
    const cookies = await login(app, 'hana')
    client.disconnect()
    assert.deepEqual(await decide(app, cookies), {
      decision: 'unavailable',
      principal: null,
      unavailable: true,
    })
    // Without a cookie nothing is asked of Redis.
    assert.equal((await decide(app)).decision, 'none')
  })
})

describe('session_decisions_total', () => {
  test('counts every request by its decision, with the metrics plugin registered after the session plugin', async () => {
    const app = Fastify()
    apps.push(app)
    await app.register(sessionPlugin, { redis, secrets: [TEST_SECRET], keyPrefix })
    await app.register(metricsPlugin, { processMetrics: false })
    app.post('/login', async (_request, reply) => {
      await reply.regenerateSession('ivo')
      return { ok: true }
    })
    app.get('/', async (request) => ({ decision: request.sessionDecision }))
    await app.ready()
    const before = await scrape(app)
    const cookies = sidOf(await app.inject({ method: 'POST', url: '/login' }))
    await app.inject({ url: '/', cookies })
    await app.inject({ url: '/', cookies })
    await app.inject({ url: '/', cookies: { sid: `${cookies.sid}x` } })
    const moved = delta(before, await scrape(app))
    // The login and the scrape presented no cookie; two loads found the session; one was forged.
    assert.equal(moved('session_decisions_total', { decision: 'none' }), 2)
    assert.equal(moved('session_decisions_total', { decision: 'found' }), 2)
    assert.equal(moved('session_decisions_total', { decision: 'forged' }), 1)
    assert.equal(moved('session_decisions_total'), 5)
  })
})
