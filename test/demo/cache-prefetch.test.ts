import assert from 'node:assert/strict'
import { test } from 'node:test'
import { buildTestApp, createCustomer, login } from '../helpers/gateway.ts'
import { scanKeys } from '../helpers/index.ts'

// The cache's prefetch on the demo's balance route: the session and the per-IP limit turn a request
// away before its handler, so it takes no lease and sends nothing to Postgres.

test('a cold balance: neither an anonymous nor a rate-limited request takes a lease or queries Postgres', async (context) => {
  const t = await buildTestApp({ RATE_LIMIT_IP: '3,0.001' }, { rateLimits: 'on' })
  context.after(() => t.close())
  const alice = await createCustomer(t.db, 'alice', [100, 200, 300])
  const cacheKeys = async (accountId: number) =>
    (await scanKeys(t.redis, `${t.prefix}cache:`)).filter((key) => key.includes(`{account:${accountId}}`))

  const before = t.db.queryCount
  const anonymous = await t.app.inject(`/accounts/${alice.accountIds[0]}/balance`)
  assert.deepEqual(
    {
      status: anonymous.statusCode,
      keys: await cacheKeys(alice.accountIds[0]!),
      postgres: t.db.queryCount - before,
    },
    { status: 401, keys: [], postgres: 0 },
  )

  // The login takes one token of the per-IP bucket (3); use up the rest.
  const cookie = await login(t.app, alice)
  for (let spent = 0; (await t.app.rateLimiter.consume('ip', 'ip:127.0.0.1')).allowed; spent++)
    assert.ok(spent < 5)
  const queries = t.db.queryCount
  for (const accountId of [alice.accountIds[1]!, alice.accountIds[1]!]) {
    const limited = await t.app.inject({ url: `/accounts/${accountId}/balance`, headers: { cookie } })
    assert.deepEqual(
      { status: limited.statusCode, keys: await cacheKeys(accountId), postgres: t.db.queryCount - queries },
      { status: 429, keys: [], postgres: 0 },
    )
  }
})
