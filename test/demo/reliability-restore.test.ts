import assert from 'node:assert/strict'
import { randomBytes, randomUUID } from 'node:crypto'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import { createPgDatabase, createPgliteDatabase, type Database } from '../../src/db/database.ts'
import { highWaterKey } from '../../src/db/identity.ts'
import { migrate } from '../../src/db/migrate.ts'
import { notificationKeys } from '../../src/events/notifier.ts'
import {
  buildTestApp,
  createCustomer,
  login,
  TEST_ADMIN_DATABASE_URL,
  type TestCustomer,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { scanKeys, uniquePrefix } from '../helpers/index.ts'

// A gateway whose database goes back in time while Redis keeps its data: Postgres restored from an
// older backup, or a new embedded database at each `npm start`. Transfer ids start again, and
// every Redis key made from the old ids (feeds, notification markers, the leaderboard's counted
// events) would describe other transfers: none of them may be read against the new ones.

interface Seeded {
  alice: TestCustomer
  bob: TestCustomer
  carol: TestCustomer
  charity: TestCustomer
  fund: number
}

/** The same customers, with the same ids, on every database: carol follows the charity's fund. */
async function seed(db: Database): Promise<Seeded> {
  const alice = await createCustomer(db, 'alice', [1_000_000])
  const bob = await createCustomer(db, 'bob', [1_000_000])
  const carol = await createCustomer(db, 'carol', [1_000_000])
  const charity = await createCustomer(db, 'charity', [0])
  const fund = charity.accountIds[0]!
  await db.query("UPDATE accounts SET public_name = 'Flood Relief Fund' WHERE id = $1", [fund])
  await db.query('INSERT INTO follows (customer_id, account_id) VALUES ($1, $2)', [carol.customerId, fund])
  return { alice, bob, carol, charity, fund }
}

async function until<T>(what: string, check: () => Promise<T | false>): Promise<T> {
  const deadline = Date.now() + 60_000
  for (;;) {
    const value = await check()
    if (value !== false) return value
    assert.ok(Date.now() < deadline, what)
    await sleep(50)
  }
}

/** A gateway with every event worker on, on `db`, under the key prefix `basePrefix`. */
async function gateway(db: Database, basePrefix: string, people: Seeded) {
  const t = await buildTestApp(
    { RATE_LIMITS: 'off', OUTBOX_RELAY_INTERVAL: '100ms' },
    { testDatabase: { db, drop: async () => {} }, keyPrefix: basePrefix, eventWorkers: 'on' },
  )
  const cookies = new Map<TestCustomer, string>()
  for (const customer of [people.alice, people.bob, people.carol])
    cookies.set(customer, await login(t.app, customer))
  const get = async (customer: TestCustomer, url: string) => {
    const res = await t.app.inject({ method: 'GET', url, headers: { cookie: cookies.get(customer)! } })
    assert.equal(res.statusCode, 200, res.body)
    return res.json()
  }
  return {
    t,
    async transfer(from: TestCustomer, to: TestCustomer, amount: number): Promise<number> {
      const res = await t.app.inject({
        method: 'POST',
        url: '/transfers',
        headers: { cookie: cookies.get(from)!, 'idempotency-key': randomUUID() },
        payload: {
          fromAccountId: from.accountIds[0],
          toAccountId: to.accountIds[0],
          amount,
          currency: 'VND',
        },
      })
      assert.equal(res.statusCode, 201, res.body)
      return res.json().transferId
    },
    feed: async (customer: TestCustomer) =>
      (await get(customer, '/feed')).items as Array<{
        transferId: number
        accountId: number
        amount: number
      }>,
    weekVolume: async (customer: TestCustomer) => (await get(customer, '/leaderboard/me')).volume as number,
    /** The transfer ids of a customer's notifications of this kind. */
    async notified(customer: TestCustomer, event: string): Promise<number[]> {
      const entries = (await t.redis.xrange(
        notificationKeys(t.prefix, customer.customerId).stream,
        '-',
        '+',
      )) as Array<[string, string[]]>
      return entries
        .map(([, fields]) =>
          Object.fromEntries(fields.flatMap((_, i) => (i % 2 ? [] : [[fields[i], fields[i + 1]]]))),
        )
        .filter((f) => f.event === event)
        .map((f) => (JSON.parse(f.data) as { transferId: number }).transferId)
    },
  }
}

/**
 * Before: alice pays bob 100 (a private transfer), carol gives the fund 200 (public). After the
 * database went back: alice pays bob 300 and 400, which take the ids the first two had.
 */
async function scenario(
  basePrefix: string,
  before: { db: Database; people: Seeded },
  goBack: () => Promise<{ db: Database; people: Seeded }>,
) {
  const first = await gateway(before.db, basePrefix, before.people)
  let { alice, bob, carol } = before.people
  const { fund } = before.people
  const [private1, public2] = [
    await first.transfer(alice, bob, 100),
    await first.transfer(carol, before.people.charity, 200),
  ]
  await until('the first transfers reached every consumer', async () => {
    const [feed, received, volume] = await Promise.all([
      first.feed(carol),
      first.notified(bob, 'transfer.received'),
      first.weekVolume(carol),
    ])
    return feed.length === 1 && received.length === 1 && volume === 200
  })
  assert.deepEqual(
    (await first.feed(carol)).map((item) => [item.transferId, item.accountId, item.amount]),
    [[public2, fund, 200]],
  )
  await first.t.close()

  const after = await goBack()
  const second = await gateway(after.db, basePrefix, after.people)
  ;({ alice, bob, carol } = after.people)
  try {
    const again = [await second.transfer(alice, bob, 300), await second.transfer(alice, bob, 400)]
    assert.deepEqual(again, [private1, public2], 'the ids start again')
    // The leaderboard counts the new transfers, not the figures of the old ones.
    await until("alice's week is the new database's", async () => (await second.weekVolume(alice)) === 700)
    assert.equal(await second.weekVolume(carol), 0, "carol's old gift is not on the board")
    // Both of bob's notifications arrive: no marker of an old event with the same id drops one.
    await until("bob's two notifications", async () => {
      const received = await second.notified(bob, 'transfer.received')
      return received.length === 2 ? received : false
    })
    assert.deepEqual((await second.notified(bob, 'transfer.received')).sort(), again.sort())
    // The fund's feed never shows alice's private transfer as the fund's movement.
    assert.deepEqual(await second.feed(carol), [], 'the fund moved no money in this database')
    const paid = await second.transfer(carol, after.people.charity, 50)
    const feed = await until("carol's gift in the fund's feed", async () => {
      const items = await second.feed(carol)
      return items.length > 0 ? items : false
    })
    assert.deepEqual(
      feed.map((item) => [item.transferId, item.accountId, item.amount]),
      [[paid, fund, 50]],
    )
  } finally {
    await second.t.close()
  }
}

async function deleteKeys(basePrefix: string) {
  const t = await buildTestApp({}, { keyPrefix: `${basePrefix}cleanup:` })
  const keys = await scanKeys(t.redis, basePrefix)
  for (let i = 0; i < keys.length; i += 500) await t.redis.del(...keys.slice(i, i + 500))
  await t.close()
}

test('Postgres restored from an older backup, Redis kept: no private transfer in a public feed, no notification dropped, no old figure', {
  skip: USE_PGLITE && 'needs a Postgres server (CREATE DATABASE ... TEMPLATE)',
}, async (context) => {
  const name = `gw_restore_${randomBytes(6).toString('hex')}`
  const admin = new pg.Client({ connectionString: TEST_ADMIN_DATABASE_URL })
  await admin.connect()
  const url = new URL(TEST_ADMIN_DATABASE_URL)
  url.pathname = `/${name}`
  const open = () => createPgDatabase({ connectionString: url.toString(), max: 10 })
  const basePrefix = uniquePrefix('restore')
  let db: Database | undefined
  context.after(async () => {
    await db?.close()
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    await admin.query(`DROP DATABASE IF EXISTS ${name}_backup WITH (FORCE)`)
    await admin.end()
    await deleteKeys(basePrefix)
  })
  await admin.query(`CREATE DATABASE ${name}`)
  db = open()
  await migrate(db)
  const people = await seed(db)
  await db.close()
  // The backup: the database as it is now, before any transfer.
  await admin.query(`CREATE DATABASE ${name}_backup TEMPLATE ${name}`)
  db = open()
  await scenario(basePrefix, { db, people }, async () => {
    await db!.close()
    await admin.query(`DROP DATABASE ${name} WITH (FORCE)`)
    await admin.query(`CREATE DATABASE ${name} TEMPLATE ${name}_backup`)
    db = open()
    return { db, people }
  })
  // The restored database kept its name and identity row, and the gateway gave it a new identity.
  const [row] = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
  const check = await buildTestApp({}, { keyPrefix: `${basePrefix}check:` })
  try {
    const marks = await scanKeys(check.redis, basePrefix)
    const highWaters = marks.filter((key) => key.endsWith(highWaterKey('')))
    assert.equal(highWaters.length, 2, 'one high-water mark per identity')
    assert.ok(highWaters.includes(highWaterKey(`${basePrefix}${row!.identity}:`)))
  } finally {
    await check.close()
  }
})

test('npm start on an embedded database again, Redis kept: the new database never meets the old keys', async (context) => {
  const basePrefix = uniquePrefix('restore')
  const embedded = async () => {
    const db = await createPgliteDatabase()
    await migrate(db)
    return { db, people: await seed(db) }
  }
  const databases: Database[] = []
  context.after(async () => {
    for (const db of databases) await db.close()
    await deleteKeys(basePrefix)
  })
  const before = await embedded()
  databases.push(before.db)
  await scenario(basePrefix, before, async () => {
    const after = await embedded()
    databases.push(after.db)
    return after
  })
})
