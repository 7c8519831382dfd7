import assert from 'node:assert/strict'
import { AsyncLocalStorage } from 'node:async_hooks'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { Redis } from 'ioredis'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'

// Round trips as the client lives them: a new one starts whenever a command is sent while none of
// the request's commands is in flight. Only the measured request's own commands and statements
// count: its tally travels in its async context, so the gateway's background work (outbox relay,
// stream consumers, scheduler) never lands in it, however the machine's load shifts its timing.
interface Tally {
  roundTrips: number
  commands: number
  inFlight: number
  postgresStatements: number
}
const measured = new AsyncLocalStorage<Tally>()
type SendCommand = (this: Redis, command: { promise: Promise<unknown> }, stream?: unknown) => unknown
const original = Redis.prototype.sendCommand as unknown as SendCommand

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let cookie: string

before(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, stream) {
    const current = measured.getStore()
    if (current) {
      current.commands++
      if (current.inFlight++ === 0) current.roundTrips++
      const settled = () => {
        current.inFlight--
      }
      command.promise.then(settled, settled)
    }
    return original.call(this, command, stream)
  }
  // The demo gateway as it ships: every limit on (high enough not to reject), cache on, no L1.
  t = await buildTestApp(
    { RATE_LIMIT_IP: '100000,100000', RATE_LIMIT_TRANSFERS: '100000/60s' },
    { rateLimits: 'on' },
  )
  // Called once a statement is done, in the context of whoever sent it.
  t.db.observe!({
    query: () => {
      const current = measured.getStore()
      if (current) current.postgresStatements++
    },
  })
  alice = await createCustomer(t.db, 'alice', [1_000_000])
  bob = await createCustomer(t.db, 'bob', [1_000_000])
  cookie = await login(t.app, alice)
})
after(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = original
  await t.close()
})

async function measure(run: () => PromiseLike<{ statusCode: number }>) {
  const tally: Tally = { roundTrips: 0, commands: 0, inFlight: 0, postgresStatements: 0 }
  // inject() returns a thenable that starts the request when its then() is called: called here,
  // inside the context (awaiting it would call then() from a microtask outside it, on Node 20).
  const response = await measured.run(tally, () => run().then((sent) => sent))
  const { roundTrips, commands, postgresStatements } = tally
  return { status: response.statusCode, roundTrips, commands, postgresStatements }
}

test('a cached balance read through the whole chain: no Redis command, no Postgres', async () => {
  const read = () => t.app.inject({ url: `/accounts/${alice.accountIds[0]}/balance`, headers: { cookie } })
  await read()
  const cached = await measure(read)
  // Nothing: the session comes from the session plugin's L1 (the first read loaded it; its idle
  // expiry was slid at login, less than touchAfterMs ago), the per-IP bucket is buffered (this
  // instance's lease admits the request) and the balance is in the cache's L1 (CACHE_L1_TTL).
  assert.deepEqual(
    {
      status: cached.status,
      roundTrips: cached.roundTrips,
      commands: cached.commands,
      postgres: cached.postgresStatements,
    },
    { status: 200, roundTrips: 0, commands: 0, postgres: 0 },
  )
})

test('a transfer: at most four Redis round trips plus one Postgres statement', async () => {
  // A balance read first takes a lease of the per-IP bucket for this instance, as steady traffic
  // keeps one: a lease unused for two sync ticks goes back, and the next request would acquire it.
  await t.app.inject({ url: `/accounts/${alice.accountIds[0]}/balance`, headers: { cookie } })
  const transfer = await measure(() =>
    t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': randomUUID() },
      payload: {
        fromAccountId: alice.accountIds[0],
        toAccountId: bob.accountIds[0],
        amount: 1,
        currency: 'VND',
      },
    }),
  )
  assert.equal(transfer.status, 201)
  // One statement on its own (autocommit): locks, checks and writes in one Postgres round trip.
  assert.equal(transfer.postgresStatements, 1)
  assert.ok(transfer.roundTrips <= 4, `${transfer.roundTrips} round trips (${transfer.commands} commands)`)
})
