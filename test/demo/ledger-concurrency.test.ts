import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import {
  buildTestApp,
  createCustomer,
  ledgerInvariants,
  login,
  type TestApp,
  type TestCustomer,
} from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

const TRANSFERS = 2000
const IN_FLIGHT = 100

let t: TestApp
let url: string
const customers: Array<TestCustomer & { cookie: string }> = []

before(async () => {
  // Generous Redis and pool bounds: this test is about the ledger, and a two-core machine running
  // other suites beside it can stall a session lookup past the production 500 ms.
  t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_COMMAND_TIMEOUT_MS: '3000' })
  for (const name of ['ann', 'ben', 'cat', 'dan']) {
    const customer = await createCustomer(t.db, name, [50_000, 50_000])
    customers.push({ ...customer, cookie: await login(t.app, customer) })
  }
  url = await listen(t.app)
})
after(() => t.close())

test(`${TRANSFERS} concurrent transfers in both directions keep the ledger exact`, async () => {
  const accounts = customers.flatMap((c) => c.accountIds.map((id) => ({ id, owner: c })))
  // A fixed mix: each pair of accounts gets transfers in both directions, some too large to fund.
  const jobs = Array.from({ length: TRANSFERS }, (_, i) => {
    const from = accounts[i % accounts.length]!
    const to = accounts[(i * 7 + 3) % accounts.length]!
    const other = to.id === from.id ? accounts[(i + 1) % accounts.length]! : to
    return { from, toId: other.id, amount: i % 50 === 0 ? 60_000 : 1 + ((i * 37) % 900) }
  })
  const statuses = new Map<number, number>()
  const types = new Map<string, number>()
  let next = 0
  const worker = async () => {
    while (next < jobs.length) {
      const job = jobs[next++]!
      const res = await fetch(`${url}/transfers`, {
        method: 'POST',
        headers: {
          cookie: job.from.owner.cookie,
          'content-type': 'application/json',
          'idempotency-key': randomUUID(),
        },
        body: JSON.stringify({
          fromAccountId: job.from.id,
          toAccountId: job.toId,
          amount: job.amount,
          currency: 'VND',
        }),
      })
      const body = (await res.json()) as { type?: string }
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
      if (body.type) types.set(body.type, (types.get(body.type) ?? 0) + 1)
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker))

  const created = statuses.get(201) ?? 0
  assert.deepEqual(
    [...statuses.keys()].filter((s) => s !== 201 && s !== 422),
    [],
    `only 201 and 422: ${JSON.stringify([...statuses])} ${JSON.stringify([...types])}`,
  )
  assert.deepEqual(
    [...types.keys()].filter((k) => k !== '/problems/insufficient-funds'),
    [],
  )
  assert.ok(created > TRANSFERS * 0.9, `most transfers succeed (${created})`)
  const invariants = await ledgerInvariants(t.db)
  assert.deepEqual(invariants, {
    totalUnchanged: true,
    negativeBalances: 0,
    unbalancedTransfers: 0,
    accountsNotMatchingLedger: 0,
    transfers: created,
    entries: created * 2,
  })
})
