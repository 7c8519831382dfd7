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
})
app.post('/login', async (request, reply) => {
  const created = await reply.regenerateSession(request.body.user, { plan: 'gold' })
  return { user: created.principal }
})
app.get('/me', { config: { session: 'required' } }, async (request) => ({
  user: request.session.principal,
  plan: request.session.data.plan,
}))
app.post('/logout', async (_request, reply) => {
  await reply.destroySession()
  return reply.code(204).send()
})

assert.equal((await app.inject('/me')).statusCode, 401)
const login = await app.inject({ method: 'POST', url: '/login', payload: { user: 'alice' } })
assert.equal(login.statusCode, 200)
const cookie = login.cookies.find((c) => c.name === 'sid')
assert.ok(cookie?.httpOnly, 'an HttpOnly session cookie')
const cookies = { sid: cookie.value }
const me = await app.inject({ url: '/me', cookies })
assert.equal(me.statusCode, 200)
assert.deepEqual(me.json(), { user: 'alice', plan: 'gold' })
assert.equal((await app.inject({ method: 'POST', url: '/logout', cookies })).statusCode, 204)
assert.equal((await app.inject({ url: '/me', cookies })).statusCode, 401)
await done('session', app, redis)
