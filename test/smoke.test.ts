import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { buildTestApp, createCustomer, login, type TestApp } from './helpers.ts'

let t: TestApp
before(async () => {
  t = await buildTestApp()
})
after(() => t.close())

test('login then list accounts', async () => {
  const alice = await createCustomer(t.db, 'alice', [500])
  const cookie = await login(t.app, alice)
  const res = await t.app.inject({ url: '/accounts', headers: { cookie } })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.json(), {
    accounts: [{ accountId: alice.accountIds[0], currency: 'VND', balance: 500 }],
  })
})
