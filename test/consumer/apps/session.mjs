import assert from 'node:assert/strict'
import Fastify from 'fastify'
import session from 'fastify-redis-gateway/session'
import { done, newRedis, prefix } from './assert-helpers.mjs'

const redis = newRedis()
const app = Fastify()
await app.register(session, {
  redis,
  secrets: ['a-secret-of-at-least-32-characters!!'],
  keyPrefix: prefix('sess'),
  domain: 'example.test',
  saveUninitialized: true,
})
app.post('/login', async (request, reply) => {
  const created = await reply.regenerateSession(request.body.user, { plan: 'gold' })
  return { user: created.principal }
})
app.get('/me', { config: { session: 'required' } }, async (request) => ({
  user: request.session.principal,
  plan: request.session.data.plan,
}))
app.put('/prefs', async (request) => {
  request.session.set('prefs', request.body)
  return { ok: true }
})
app.get('/prefs', async (request) => ({
  prefs: request.session.get('prefs') ?? null,
  principal: app.sessionPrincipal(request),
}))
app.post('/logout', async (_request, reply) => {
  await reply.destroySession()
  return reply.code(204).send()
})

assert.equal((await app.inject('/me')).statusCode, 401)

// Anonymous: nothing is stored until something is set; then a cookie, and no principal.
assert.equal((await app.inject('/prefs')).headers['set-cookie'], undefined)
const anonymous = await app.inject({ method: 'PUT', url: '/prefs', payload: { lang: 'vi' } })
const anonymousCookie = anonymous.cookies.find((c) => c.name === 'sid')
assert.ok(anonymousCookie, 'an anonymous session cookie once something is set')
assert.equal(anonymousCookie.domain, 'example.test')
assert.deepEqual((await app.inject({ url: '/prefs', cookies: { sid: anonymousCookie.value } })).json(), {
  prefs: { lang: 'vi' },
  principal: null,
})

const login = await app.inject({
  method: 'POST',
  url: '/login',
  payload: { user: 'alice' },
  cookies: { sid: anonymousCookie.value },
})
assert.equal(login.statusCode, 200)
const cookie = login.cookies.find((c) => c.name === 'sid')
assert.ok(cookie?.httpOnly, 'an HttpOnly session cookie')
assert.notEqual(cookie.value, anonymousCookie.value, 'a new session id at login')
assert.equal(cookie.domain, 'example.test')
const cookies = { sid: cookie.value }
const me = await app.inject({ url: '/me', cookies })
assert.equal(me.statusCode, 200)
assert.deepEqual(me.json(), { user: 'alice', plan: 'gold' })

// JSON values set in one request are read back in the next.
const prefs = { theme: 'dark', pageSize: 50, beta: true, tags: ['a', 'b'] }
assert.equal((await app.inject({ method: 'PUT', url: '/prefs', cookies, payload: prefs })).statusCode, 200)
assert.deepEqual((await app.inject({ url: '/prefs', cookies })).json(), { prefs, principal: 'alice' })

assert.equal((await app.inject({ method: 'POST', url: '/logout', cookies })).statusCode, 204)
assert.equal((await app.inject({ url: '/me', cookies })).statusCode, 401)
await done('session', app, redis)
