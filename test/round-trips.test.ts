import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { Redis } from 'ioredis'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from './helpers/index.ts'

// Round trips as the client lives them: a new one starts whenever a command is sent while none of
// the request's commands is in flight. Requests here run one at a time, so every command in the
// window belongs to the request measured.
interface Tally {
  roundTrips: number
  commands: number
}
let current: Tally | null = null
let inFlight = 0
type SendCommand = (this: Redis, command: { promise: Promise<unknown> }, stream?: unknown) => unknown
const original = Redis.prototype.sendCommand as unknown as SendCommand

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let cookie: string

before(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, stream) {
    if (current) {
      current.commands++
      if (inFlight++ === 0) current.roundTrips++
      const settled = () => {
        inFlight--
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
  alice = await createCustomer(t.db, 'alice', [1_000_000])
  bob = await createCustomer(t.db, 'bob', [1_000_000])
  cookie = await login(t.app, alice)
})
after(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = original
  await t.close()
})

async function measure(run: () => Promise<{ statusCode: number }>) {
  const tally: Tally = { roundTrips: 0, commands: 0 }
  const queries = t.db.queryCount
  current = tally
  const response = await run()
  current = null
  return { status: response.statusCode, ...tally, postgresStatements: t.db.queryCount - queries }
}

test('a cached balance read through the whole chain: one Redis round trip, no Postgres', async () => {
  const read = () => t.app.inject({ url: `/accounts/${alice.accountIds[0]}/balance`, headers: { cookie } })
  await read()
  const cached = await measure(read)
  // The session load (HGETALL: its idle expiry was slid at login, less than touchAfterMs ago), the
  // per-IP bucket and the entry's peek (GET), sent together; the hit needs nothing more.
  assert.deepEqual(
    {
      status: cached.status,
      roundTrips: cached.roundTrips,
      commands: cached.commands,
      postgres: cached.postgresStatements,
    },
    { status: 200, roundTrips: 1, commands: 3, postgres: 0 },
  )
})

test('a transfer: at most four Redis round trips plus one Postgres statement', async () => {
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
