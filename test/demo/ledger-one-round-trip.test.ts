import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import { executeTransfer, TRANSFER_SQL, transferParameters } from '../../src/ledger/ledger.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  ledgerInvariants,
  login,
  type TestApp,
  type TestCustomer,
  type TestDatabase,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

// A transfer is one Postgres statement on its own, whatever its outcome: t.db.queryCount counts
// every statement sent (BEGIN and COMMIT included), so a delta of 1 is one round trip.

let database: TestDatabase
let t: TestApp
let url: string
let alice: TestCustomer
let bob: TestCustomer
let aliceCookie: string

before(async () => {
  database = await createTestDatabase()
  // Generous Redis bound: the concurrency test below runs 60 requests at a time on two cores.
  t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_COMMAND_TIMEOUT_MS: '3000' }, { testDatabase: database })
  url = await listen(t.app)
  // alice: a VND account with money, an empty one and a USD one; bob: a VND and a USD account.
  alice = await createCustomer(t.db, 'alice', [1_000_000, 0, [1_000, 'USD']])
  bob = await createCustomer(t.db, 'bob', [1_000_000, [1_000, 'USD']])
  aliceCookie = await login(t.app, alice)
})
after(async () => {
  await t.close()
  await database.drop()
})

async function counted<T>(run: () => Promise<T>): Promise<{ result: T; statements: number }> {
  const before = t.db.queryCount
  const result = await run()
  return { result, statements: t.db.queryCount - before }
}

const post = (body: Record<string, unknown>, key = randomUUID()) =>
  counted(() =>
    t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie: aliceCookie, 'idempotency-key': key },
      payload: body,
    }),
  )

async function written() {
  const [row] = await t.db.query<{ balances: string; transfers: string; entries: string; events: string }>(
    `SELECT (SELECT string_agg(id || ':' || balance, ',' ORDER BY id) FROM accounts) AS balances,
            (SELECT count(*) FROM transfers)::text AS transfers,
            (SELECT count(*) FROM ledger_entries)::text AS entries,
            (SELECT count(*) FROM outbox_events)::text AS events`,
  )
  return row!
}

test('a transfer that moves money: one statement writes balances, transfer row, entries and event', async () => {
  const body = {
    fromAccountId: alice.accountIds[0],
    toAccountId: bob.accountIds[0],
    amount: 250,
    currency: 'VND',
  }
  const key = randomUUID()
  const { result: response, statements } = await post(body, key)
  assert.equal(response.statusCode, 201)
  assert.equal(statements, 1)
  const sent = response.json() as { transferId: number; createdAt: string }
  const [row] = await t.db.query<{ response: unknown; entries: string; event: string; balances: string }>(
    `SELECT t.response,
       (SELECT string_agg(account_id || ':' || amount, ',' ORDER BY amount) FROM ledger_entries
        WHERE transfer_id = t.id) AS entries,
       (SELECT type || ':' || to_customer_id FROM outbox_events WHERE transfer_id = t.id) AS event,
       (SELECT string_agg(balance::text, ',' ORDER BY id) FROM accounts WHERE id IN ($2, $3)) AS balances
     FROM transfers t WHERE t.idempotency_key = $1`,
    [key, alice.accountIds[0], bob.accountIds[0]],
  )
  // The stored response is the one sent (jsonb orders keys its own way; the route's serializer
  // puts them back in the schema's order on a replay).
  assert.deepEqual(row!.response, response.json())
  assert.deepEqual(
    { ...row, response: undefined },
    {
      response: undefined,
      entries: `${alice.accountIds[0]}:-250,${bob.accountIds[0]}:250`,
      event: `transfer.completed:${bob.customerId}`,
      balances: '999750,1000250',
    },
  )
  assert.match(sent.createdAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
})

test('every refusal is one statement, writes nothing and answers the same problem as before', async () => {
  const [from, empty, usd] = alice.accountIds as [number, number, number]
  const [bobVnd, bobUsd] = bob.accountIds as [number, number]
  const cases: Array<[string, Record<string, unknown>, number, string, string]> = [
    [
      'same account',
      { fromAccountId: from, toAccountId: from, amount: 1, currency: 'VND' },
      400,
      'same-account',
      'fromAccountId and toAccountId must differ.',
    ],
    [
      "another customer's source account",
      { fromAccountId: bobVnd, toAccountId: from, amount: 1, currency: 'VND' },
      404,
      'account-not-found',
      `Account ${bobVnd} does not exist or is not yours.`,
    ],
    [
      'a missing source account',
      { fromAccountId: 999_999, toAccountId: bobVnd, amount: 1, currency: 'VND' },
      404,
      'account-not-found',
      'Account 999999 does not exist or is not yours.',
    ],
    [
      'a missing destination',
      { fromAccountId: from, toAccountId: 999_998, amount: 1, currency: 'VND' },
      404,
      'account-not-found',
      'Account 999998 does not exist or is not yours.',
    ],
    [
      'the source in another currency',
      { fromAccountId: usd, toAccountId: bobVnd, amount: 1, currency: 'VND' },
      422,
      'currency-mismatch',
      `The transfer is in VND; account ${usd} holds USD.`,
    ],
    [
      'the destination in another currency',
      { fromAccountId: from, toAccountId: bobUsd, amount: 1, currency: 'VND' },
      422,
      'currency-mismatch',
      `The transfer is in VND; account ${bobUsd} cannot receive it.`,
    ],
    [
      'insufficient funds',
      { fromAccountId: empty, toAccountId: bobVnd, amount: 1, currency: 'VND' },
      422,
      'insufficient-funds',
      `Account ${empty} does not hold 1 VND.`,
    ],
  ]
  for (const [label, body, status, slug, detail] of cases) {
    const before = await written()
    const { result: response, statements } = await post(body)
    const problem = response.json() as { type: string; detail: string }
    assert.deepEqual(
      { status: response.statusCode, type: problem.type, detail: problem.detail, statements },
      { status, type: `/problems/${slug}`, detail, statements: 1 },
      label,
    )
    assert.deepEqual(await written(), before, `${label}: nothing written`)
  }
})

test('a key Postgres already holds: replay and mismatch are one statement, before any other check', async () => {
  const input = {
    customerId: alice.customerId,
    fromAccountId: alice.accountIds[0]!,
    toAccountId: bob.accountIds[0]!,
    amount: 3,
    currency: 'VND',
  }
  const idempotency = { key: `pg-only-${randomUUID()}`, fingerprint: 'first-body' }
  const first = await counted(() => executeTransfer(t.db, input, idempotency))
  assert.equal(first.statements, 1)
  const before = await written()
  const replay = await counted(() => executeTransfer(t.db, input, idempotency))
  assert.deepEqual(replay, {
    result: { ...first.result, replayed: true, recipientCustomerId: bob.customerId },
    statements: 1,
  })
  // A reused key with a bad body (here the same account twice) is a mismatch, not a new refusal.
  const statementsBefore = t.db.queryCount
  const mismatch = await executeTransfer(
    t.db,
    { ...input, toAccountId: input.fromAccountId },
    { ...idempotency, fingerprint: 'another-body' },
  ).catch((err: { status?: number; type?: string }) => [err.status, err.type])
  assert.deepEqual(mismatch, [422, '/problems/idempotency-key-mismatch'])
  assert.equal(t.db.queryCount - statementsBefore, 1)
  assert.deepEqual(await written(), before)
})

test('two requests racing one key past the lookup: only the loser pays a second statement', {
  skip: USE_PGLITE && 'PGlite has one connection: statements never overlap',
}, async () => {
  // Disjoint accounts, so neither waits on the other's locks. A test transaction holds the second
  // transfer's source account: its statement starts (snapshot taken, no transfer with the key yet),
  // then waits on the lock while the first commits; released, it inserts and meets 23505.
  const carol = await createCustomer(t.db, 'carol', [1_000, 1_000])
  const dave = await createCustomer(t.db, 'dave', [0, 0])
  const idempotency = { key: 'race-past-lookup', fingerprint: 'same-request' }
  const input = (i: number) => ({
    customerId: carol.customerId,
    fromAccountId: carol.accountIds[i]!,
    toAccountId: dave.accountIds[i]!,
    amount: 10,
    currency: 'VND',
  })
  const holder = new pg.Client({ connectionString: database.url })
  await holder.connect()
  try {
    await holder.query('BEGIN')
    await holder.query('SELECT id FROM accounts WHERE id = $1 FOR UPDATE', [carol.accountIds[1]])
    const statementsBefore = t.db.queryCount
    const loser = executeTransfer(t.db, input(1), idempotency)
    for (;;) {
      const { rows } = await holder.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`,
      )
      if (rows[0].n > 0) break
      await sleep(10)
    }
    const winner = await executeTransfer(t.db, input(0), idempotency)
    await holder.query('COMMIT')
    const replayed = await loser
    assert.deepEqual(replayed, { ...winner, replayed: true, recipientCustomerId: dave.customerId })
    // The winner's statement, the loser's statement that met 23505, the loser's lookup.
    assert.equal(t.db.queryCount - statementsBefore, 3)
  } finally {
    await holder.end()
  }
  const [row] = await t.db.query<{ n: string; balances: string }>(
    `SELECT (SELECT count(*) FROM transfers WHERE idempotency_key = 'race-past-lookup')::text AS n,
            (SELECT string_agg(balance::text, ',' ORDER BY id) FROM accounts WHERE customer_id = $1) AS balances`,
    [carol.customerId],
  )
  assert.deepEqual({ ...row }, { n: '1', balances: '990,1000' })
})

test('the lock CTE is its own plan node (never inlined), in id order, custom or generic plan', async () => {
  const [from, to] = [alice.accountIds[0]!, bob.accountIds[0]!]
  const params = transferParameters(
    { customerId: alice.customerId, fromAccountId: from, toAccountId: to, amount: 1, currency: 'VND' },
    { key: randomUUID(), fingerprint: 'f' },
    true,
  )
  const explained = async (sql: string, values?: unknown[]) =>
    (await t.db.query<{ 'QUERY PLAN': string }>(sql, values)).map((r) => r['QUERY PLAN']).join('\n')
  // A custom plan (the values known), and the generic plan the prepared statement settles on.
  const custom = await explained(`EXPLAIN (COSTS OFF) ${TRANSFER_SQL}`, params)
  const generic = await t.db.transaction(async (tx) => {
    await tx.query('SET LOCAL plan_cache_mode = force_generic_plan')
    await tx.query(
      `PREPARE transfer_plan (integer, integer, integer, bigint, text, text, text, boolean) AS ${TRANSFER_SQL}`,
    )
    const rows = await tx.query<{ 'QUERY PLAN': string }>(
      `EXPLAIN (COSTS OFF) EXECUTE transfer_plan (${alice.customerId}, ${from}, ${to}, 1, 'VND', 'k', 'f', true)`,
    )
    await tx.query('DEALLOCATE transfer_plan')
    return rows.map((r) => r['QUERY PLAN']).join('\n')
  })
  for (const plan of [custom, generic]) {
    // LockRows over the accounts in id order (sorted, or read in order from the primary key).
    assert.match(
      plan,
      /CTE locked\n\s+->\s+LockRows\n\s+->\s+(Sort\n\s+Sort Key: accounts\.id|Index Scan using accounts_pkey on accounts)\n/,
      plan,
    )
    // The UPDATE reads locked and verdict: it writes nothing before both locks are held.
    const update = plan.slice(plan.indexOf('CTE moved'), plan.indexOf('CTE next'))
    assert.match(update, /CTE Scan on verdict/)
    assert.match(update, /CTE Scan on locked/)
  }
})

test('opposite transfers on two accounts and many senders to one merchant, concurrently over HTTP', async () => {
  // The worst case for lock order: every transfer between two accounts, in both directions; beside
  // it a hot account: eight customers paying one merchant, all queued on its row lock.
  const ann = await createCustomer(t.db, 'ann', [200_000])
  const ben = await createCustomer(t.db, 'ben', [200_000])
  const merchant = await createCustomer(t.db, 'merchant', [0])
  const payers = await Promise.all(
    Array.from({ length: 8 }, (_, i) => createCustomer(t.db, `payer${i}`, [20_000])),
  )
  const cookies = new Map<number, string>()
  for (const c of [ann, ben, ...payers]) cookies.set(c.accountIds[0]!, await login(t.app, c))
  const jobs = Array.from({ length: 600 }, (_, i) => {
    if (i % 3 === 2) {
      const payer = payers[i % payers.length]!
      // Some too large: refusals under the lock, in the same queue.
      return { from: payer.accountIds[0]!, to: merchant.accountIds[0]!, amount: i % 30 === 2 ? 50_000 : 100 }
    }
    const [a, b] = i % 2 ? [ann, ben] : [ben, ann]
    return { from: a.accountIds[0]!, to: b.accountIds[0]!, amount: 1 + (i % 500) }
  })
  const statuses = new Map<string, number>()
  let next = 0
  const worker = async () => {
    while (next < jobs.length) {
      const job = jobs[next++]!
      const res = await fetch(`${url}/transfers`, {
        method: 'POST',
        headers: {
          cookie: cookies.get(job.from)!,
          'content-type': 'application/json',
          'idempotency-key': randomUUID(),
        },
        body: JSON.stringify({
          fromAccountId: job.from,
          toAccountId: job.to,
          amount: job.amount,
          currency: 'VND',
        }),
      })
      const body = (await res.json()) as { type?: string }
      const outcome = `${res.status} ${body.type ?? ''}`.trim()
      statuses.set(outcome, (statuses.get(outcome) ?? 0) + 1)
    }
  }
  await Promise.all(Array.from({ length: 60 }, worker))
  const created = statuses.get('201') ?? 0
  assert.deepEqual(
    [...statuses.keys()].filter((s) => s !== '201' && s !== '422 /problems/insufficient-funds'),
    [],
    JSON.stringify([...statuses]),
  )
  assert.ok(created >= 560, `${created} transfers made`)
  const invariants = await ledgerInvariants(t.db)
  assert.deepEqual(
    { ...invariants, transfers: undefined, entries: undefined },
    {
      totalUnchanged: true,
      negativeBalances: 0,
      unbalancedTransfers: 0,
      accountsNotMatchingLedger: 0,
      transfers: undefined,
      entries: undefined,
    },
  )
  assert.equal(invariants.entries, invariants.transfers * 2)
  const [row] = await t.db.query<{ merchant: string; paid: string }>(
    `SELECT (SELECT balance FROM accounts WHERE id = $1)::text AS merchant,
            (SELECT coalesce(sum(amount), 0) FROM transfers WHERE to_account_id = $1)::text AS paid`,
    [merchant.accountIds[0]],
  )
  assert.equal(row!.merchant, row!.paid)
})
