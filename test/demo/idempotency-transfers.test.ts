import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { executeTransfer } from '../../src/ledger/ledger.ts'
import { requestFingerprint } from '../../src/plugins/idempotency/index.ts'
import {
  buildTestApp,
  createCustomer,
  ledgerInvariants,
  login,
  type TestApp,
  type TestCustomer,
} from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

let t: TestApp
let url: string
let alice: TestCustomer
let bob: TestCustomer
let aliceCookie: string
let bobCookie: string

before(async () => {
  // 200 simultaneous requests on a loaded 2-core machine can take longer than the default 500 ms
  // Redis timeout; a session 503 would then hide what this suite checks.
  t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_COMMAND_TIMEOUT_MS: '5000' })
  url = await listen(t.app)
  alice = await createCustomer(t.db, 'alice', [1_000_000, 0])
  bob = await createCustomer(t.db, 'bob', [1_000_000])
  aliceCookie = await login(t.app, alice)
  bobCookie = await login(t.app, bob)
})
after(() => t.close())

interface Sent {
  status: number
  body: string
  replayed: boolean
  retryAfter: string | null
}

async function transfer(cookie: string, key: string | undefined, body: object): Promise<Sent> {
  const res = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: {
      cookie,
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
    },
    body: JSON.stringify(body),
  })
  return {
    status: res.status,
    body: await res.text(),
    replayed: res.headers.get('idempotent-replayed') === 'true',
    retryAfter: res.headers.get('retry-after'),
  }
}

const balance = async (accountId: number) =>
  Number(
    (
      await t.db.query<{ balance: string }>('SELECT balance::text FROM accounts WHERE id = $1', [accountId])
    )[0]!.balance,
  )

const transfersWithKey = async (key: string) =>
  (await t.db.query('SELECT id FROM transfers WHERE idempotency_key = $1', [key])).length

test('200 simultaneous requests with one key: one transfer, one debit; retries replay the same bytes', async () => {
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 700,
    currency: 'VND',
  }
  const before = await balance(alice.accountIds[0]!)
  const responses = await Promise.all(
    Array.from({ length: 200 }, () => transfer(aliceCookie, 'storm-1', body)),
  )
  const originals = responses.filter((r) => r.status === 201 && !r.replayed)
  assert.equal(originals.length, 1, 'exactly one request ran')
  const original = originals[0]!.body
  for (const r of responses) {
    if (r.status === 409) assert.ok(Number(r.retryAfter) >= 1)
    else assert.deepEqual([r.status, r.body], [201, original])
  }
  assert.equal(await transfersWithKey('storm-1'), 1)
  assert.equal(await balance(alice.accountIds[0]!), before - 700)
  const retries = await Promise.all(
    Array.from({ length: 200 }, () => transfer(aliceCookie, '"storm-1"', body)),
  )
  for (const r of retries) assert.deepEqual([r.status, r.body, r.replayed], [201, original, true])
  assert.equal(await balance(alice.accountIds[0]!), before - 700)
  const invariants = await ledgerInvariants(t.db)
  assert.equal(invariants.totalUnchanged, true)
  assert.equal(invariants.unbalancedTransfers, 0)
})

test('the same key with another body: 422, both after completion and while the first is in flight', async () => {
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 5,
    currency: 'VND',
  }
  const first = await transfer(aliceCookie, 'reuse-1', body)
  assert.equal(first.status, 201)
  const other = await transfer(aliceCookie, 'reuse-1', { ...body, amount: 6 })
  assert.equal(other.status, 422)
  assert.equal(JSON.parse(other.body).type, '/problems/idempotency-key-mismatch')

  // In flight: a live claim for one body, as the first request holds it while it runs.
  const scope = `principal:${alice.customerId}\nPOST\n/transfers`
  const recordKey = t.app.idempotency.recordKey(scope, 'in-flight-1')
  const claim = await t.app.idempotency.claim(
    recordKey,
    requestFingerprint('POST', '/transfers', body),
    'token-of-the-running-request',
  )
  assert.equal(claim.kind, 'new')
  const mismatch = await transfer(aliceCookie, 'in-flight-1', { ...body, amount: 6 })
  assert.equal(mismatch.status, 422)
  const conflict = await transfer(aliceCookie, 'in-flight-1', {
    currency: 'VND',
    amount: 5,
    toAccountId: body.toAccountId,
    fromAccountId: body.fromAccountId,
  })
  assert.equal(conflict.status, 409)
  assert.equal(JSON.parse(conflict.body).type, '/problems/idempotency-key-in-flight')
  assert.ok(Number(conflict.retryAfter) >= 1)
  assert.equal(await transfersWithKey('in-flight-1'), 0)
})

test('two customers using one key get two independent transfers and their own responses', async () => {
  const fromAlice = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 11,
    currency: 'VND',
  }
  const fromBob = {
    fromAccountId: bob.accountIds[0],
    toAccountId: alice.accountIds[0],
    amount: 11,
    currency: 'VND',
  }
  const [a, b] = await Promise.all([
    transfer(aliceCookie, 'same-key-everywhere', fromAlice),
    transfer(bobCookie, 'same-key-everywhere', fromBob),
  ])
  assert.deepEqual([a.status, a.replayed, b.status, b.replayed], [201, false, 201, false])
  assert.notEqual(JSON.parse(a.body).transferId, JSON.parse(b.body).transferId)
  assert.equal(JSON.parse(a.body).fromAccountId, alice.accountIds[0])
  assert.equal(JSON.parse(b.body).fromAccountId, bob.accountIds[0])
  // Bob's body under Alice's session is Alice's own key: refused as a mismatch, never Bob's response.
  const crossed = await transfer(aliceCookie, 'same-key-everywhere', fromBob)
  assert.equal(crossed.status, 422)
  assert.equal(await transfersWithKey('same-key-everywhere'), 2)
})

test('insufficient funds (422) is replayed, not run again, even once the money is there', async () => {
  const poor = await createCustomer(t.db, 'poor', [10])
  const cookie = await login(t.app, poor)
  const body = {
    fromAccountId: poor.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 500,
    currency: 'VND',
  }
  const first = await transfer(cookie, 'too-much-1', body)
  assert.equal(first.status, 422)
  assert.equal(JSON.parse(first.body).type, '/problems/insufficient-funds')
  await t.db.query('UPDATE accounts SET balance = 1000, opening_balance = 1000 WHERE id = $1', [
    poor.accountIds[0],
  ])
  const retry = await transfer(cookie, 'too-much-1', body)
  assert.deepEqual([retry.status, retry.body, retry.replayed], [422, first.body, true])
  assert.equal(await balance(poor.accountIds[0]!), 1000)
  assert.equal((await transfer(cookie, 'too-much-2', body)).status, 201)
})

test('POST /transfers without a key is refused with 400 and moves nothing', async () => {
  const before = await balance(alice.accountIds[0]!)
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 1,
    currency: 'VND',
  }
  const res = await transfer(aliceCookie, undefined, body)
  assert.equal(res.status, 400)
  assert.equal(JSON.parse(res.body).type, '/problems/idempotency-key-missing')
  assert.equal((await transfer(aliceCookie, 'x'.repeat(256), body)).status, 400)
  assert.equal(await balance(alice.accountIds[0]!), before)
})

test('two transactions racing one key past the lookup: the unique constraint lets one through', async () => {
  // Disjoint accounts, so no row lock orders them: both miss the lookup and collide on the index.
  const carol = await createCustomer(t.db, 'carol', [1000, 1000])
  const dave = await createCustomer(t.db, 'dave', [0, 0])
  const idempotency = { key: 'race-1', fingerprint: 'same-request' }
  for (let round = 0; round < 5; round++) {
    const key = { ...idempotency, key: `race-${round}` }
    const results = await Promise.allSettled(
      [0, 1].map((i) =>
        executeTransfer(
          t.db,
          {
            customerId: carol.customerId,
            fromAccountId: carol.accountIds[i]!,
            toAccountId: dave.accountIds[i]!,
            amount: 10,
            currency: 'VND',
          },
          key,
        ),
      ),
    )
    const values = results.map((r) => (r.status === 'fulfilled' ? r.value : assert.fail(String(r.reason))))
    assert.equal(values.filter((v) => v.replayed).length, 1)
    assert.equal(values[0]!.transferId, values[1]!.transferId)
    const mismatch = await executeTransfer(
      t.db,
      {
        customerId: carol.customerId,
        fromAccountId: carol.accountIds[0]!,
        toAccountId: dave.accountIds[0]!,
        amount: 10,
        currency: 'VND',
      },
      { ...key, fingerprint: 'another-request' },
    ).catch((err: Error & { status?: number }) => err.status)
    assert.equal(mismatch, 422)
  }
  const [row] = await t.db.query<{ n: string }>(
    'SELECT count(*)::text AS n FROM transfers WHERE customer_id = $1',
    [carol.customerId],
  )
  assert.equal(row!.n, '5')
  assert.equal((await ledgerInvariants(t.db)).accountsNotMatchingLedger, 0)
})

test('a transfer claim left by a crashed instance (lease expired): concurrent retries move money once', async () => {
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 33,
    currency: 'VND',
  }
  const scope = `principal:${alice.customerId}\nPOST\n/transfers`
  const recordKey = t.app.idempotency.recordKey(scope, 'crashed-transfer-1')
  await t.redis.hset(recordKey, {
    state: 'processing',
    fp: requestFingerprint('POST', '/transfers', body),
    token: 'token-of-a-dead-instance',
    leaseUntil: 1, // long past, whatever the clocks say
  })
  await t.redis.pexpire(recordKey, 60_000)
  const before = await balance(alice.accountIds[0]!)
  const retries = await Promise.all(
    Array.from({ length: 20 }, () => transfer(aliceCookie, 'crashed-transfer-1', body)),
  )
  const ran = retries.filter((r) => r.status === 201 && !r.replayed)
  assert.equal(ran.length, 1)
  for (const r of retries) assert.ok(r.status === 409 || r.body === ran[0]!.body, `${r.status} ${r.body}`)
  assert.equal(await transfersWithKey('crashed-transfer-1'), 1)
  assert.equal(await balance(alice.accountIds[0]!), before - 33)
})
