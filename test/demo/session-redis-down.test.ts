import assert from 'node:assert/strict'
import { test } from 'node:test'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { buildTestApp, createCustomer } from '../helpers/gateway.ts'

test("the demo's login while Redis is down: 503 session-store-unavailable with Retry-After", async (context) => {
  const server = await startRedisServer()
  const t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_URL: server.url })
  context.after(async () => {
    await t.close()
    await server.stop()
  })
  const alice = await createCustomer(t.db, 'alice')
  await server.stop()
  const res = await t.app.inject({
    method: 'POST',
    url: '/session',
    payload: { username: alice.username, password: alice.password },
  })
  assert.equal(res.statusCode, 503, res.body)
  assert.equal(res.headers['retry-after'], '1')
  assert.equal(res.json().type, '/problems/session-store-unavailable')
})
