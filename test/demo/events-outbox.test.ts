import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import type { Queryable } from '../../src/db/database.ts'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { CLAIM_PLAN_SETTING, CLAIM_SQL, createOutboxRelay } from '../../src/events/outbox-relay.ts'
import { executeTransfer } from '../../src/ledger/ledger.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestCustomer,
  type TestDatabase,
} from '../helpers/gateway.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

// The transactional outbox and its relay, on real Postgres and Redis: one event row per committed
// transfer (none for a refused one), relayed to the stream once, by parallel relays without
// duplicates, and again after Redis lost the stream.

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let cookie: string

before(async () => {
  t = await buildTestApp()
  alice = await createCustomer(t.db, 'alice', [1_000_000])
  bob = await createCustomer(t.db, 'bob', [1_000_000])
  cookie = await login(t.app, alice)
})
after(async () => {
  const keys = await scanKeys(t.redis, t.prefix)
  if (keys.length) await t.redis.del(...keys)
  await t.close()
})

const transfer = (amount: number) =>
  t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { cookie, 'idempotency-key': randomUUID() },
    payload: { fromAccountId: alice.accountIds[0], toAccountId: bob.accountIds[0], amount, currency: 'VND' },
  })

interface EventRow {
  id: string
  type: string
  transfer_id: string
  from_customer_id: number
  to_customer_id: number
  from_account_id: number
  to_account_id: number
  amount: string
  currency: string
  same_transaction: boolean
  has_event: boolean
}

const eventsOf = (transferId: number) =>
  t.db.query<EventRow>(
    `SELECT o.id::text, o.type, o.transfer_id::text, o.from_customer_id, o.to_customer_id, o.from_account_id,
            o.to_account_id, o.amount::text, o.currency, o.xmin::text = tr.xmin::text AS same_transaction,
            tr.has_event
     FROM outbox_events o JOIN transfers tr ON tr.id = o.transfer_id WHERE o.transfer_id = $1`,
    [transferId],
  )

test('a transfer writes exactly one outbox event, in its own transaction; a refused one writes none', async () => {
  const before = await t.db.query<{ n: string }>('SELECT count(*)::text AS n FROM outbox_events')
  const response = await transfer(700)
  assert.equal(response.statusCode, 201)
  const { transferId } = response.json() as { transferId: number }
  const rows = await eventsOf(transferId)
  assert.equal(rows.length, 1)
  assert.deepEqual(
    { ...rows[0] },
    {
      id: String(transferId),
      type: 'transfer.completed',
      transfer_id: String(transferId),
      from_customer_id: alice.customerId,
      to_customer_id: bob.customerId,
      from_account_id: alice.accountIds[0],
      to_account_id: bob.accountIds[0],
      amount: '700',
      currency: 'VND',
      same_transaction: true,
      has_event: true,
    },
  )
  const refused = await transfer(10_000_000)
  assert.equal(refused.statusCode, 422)
  const after = await t.db.query<{ n: string }>('SELECT count(*)::text AS n FROM outbox_events')
  assert.equal(Number(after[0]!.n), Number(before[0]!.n) + 1)
})

/**
 * Alice pays bob 1 VND on an app of its own (`env`, `eventWorkers`) over a new database, then
 * `check` runs with the app and the transfer's id.
 */
async function withOneTransfer(
  env: Record<string, string>,
  eventWorkers: 'on' | undefined,
  check: (app: TestApp, transferId: number) => Promise<void>,
) {
  const database = await createTestDatabase()
  const own = await buildTestApp(env, { testDatabase: database, eventWorkers })
  try {
    const a = await createCustomer(own.db, 'alice', [1000])
    const b = await createCustomer(own.db, 'bob', [1000])
    const response = await own.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie: await login(own.app, a), 'idempotency-key': randomUUID() },
      payload: { fromAccountId: a.accountIds[0], toAccountId: b.accountIds[0], amount: 1, currency: 'VND' },
    })
    assert.equal(response.statusCode, 201)
    await check(own, (response.json() as { transferId: number }).transferId)
  } finally {
    await own.redis.del(own.app.events.stream, `${own.app.events.stream}:relay-epoch`)
    await own.close()
    await database.drop()
  }
}

test('OUTBOX=off: transfers write no event', async () => {
  await withOneTransfer({ OUTBOX: 'off' }, undefined, async (off) => {
    assert.deepEqual(await off.db.query('SELECT id FROM outbox_events'), [])
    assert.deepEqual(await off.db.query('SELECT has_event FROM transfers'), [{ has_event: false }])
  })
})

/** The event a transfer of `amount` VND from `from` to `to` puts on the stream. */
const transferEvent = (
  transferId: number,
  from: TestCustomer,
  to: TestCustomer,
  amount: number,
  occurredAt: string | undefined,
) => ({
  eventId: String(transferId),
  type: 'transfer.completed',
  transferId,
  fromCustomerId: from.customerId,
  toCustomerId: to.customerId,
  fromAccountId: from.accountIds[0],
  toAccountId: to.accountIds[0],
  amount,
  currency: 'VND',
  occurredAt,
})

const streamEventIds = async (redis: Redis | TestApp['redis'], stream: string) =>
  ((await redis.xrange(stream, '-', '+')) as Array<[string, string[]]>).map(
    ([, f]) => f[f.indexOf('eventId') + 1]!,
  )

/** Every transfer that wrote an event, by id. */
const eventTransferIds = async (db: TestDatabase['db']) =>
  (
    await db.query<{ id: string }>('SELECT id::text FROM transfers WHERE has_event ORDER BY transfers.id')
  ).map((r) => Number(r.id))

/** Appends entries for these event ids, one at a time, as another relay's pass does. */
const appendEvents = async (redis: Redis, stream: string, eventIds: string[]) => {
  for (const id of eventIds)
    await redis.xadd(stream, '*', 'eventId', id, 'type', 'transfer.completed', 'data', '{}')
}

test('the relay puts each committed event on the stream once and deletes it from the backlog', async () => {
  const response = await transfer(5)
  const { transferId } = response.json() as { transferId: number }
  const stream = t.app.events.stream
  const [row] = await eventsOf(transferId)
  await t.app.events.relay.relayPending()
  await t.app.events.relay.relayPending()
  assert.deepEqual(await eventsOf(transferId), [], 'relayed, it left the backlog')
  const ids = await streamEventIds(t.redis, stream)
  assert.equal(ids.filter((id) => id === row!.id).length, 1)
  const [newest] = (await t.redis.xrevrange(stream, '+', '-', 'COUNT', 1)) as Array<[string, string[]]>
  const fields = newest![1]
  const data = fields[fields.indexOf('data') + 1]!
  assert.equal(row!.id, String(transferId))
  const expected = transferEvent(
    transferId,
    alice,
    bob,
    5,
    (response.json() as { createdAt: string }).createdAt,
  )
  // Byte for byte what JSON.stringify gives (Postgres builds it): same keys, order and formatting.
  assert.equal(data, JSON.stringify(expected))
  assert.deepEqual(fields.slice(0, 4), ['eventId', String(transferId), 'type', 'transfer.completed'])
  assert.equal((await t.db.query('SELECT id FROM outbox_events')).length, 0, 'nothing left behind')
})

test("a 201 from POST /transfers wakes this instance's relay: the event is relayed long before the next poll", async () => {
  // A poll period of an hour: after the start's pass, only a wake-up can relay the transfer's event.
  await withOneTransfer(
    { EVENT_WORKERS: 'relay', OUTBOX_RELAY_INTERVAL: '1h' },
    'on',
    async (relaying, transferId) => {
      const stream = relaying.app.events.stream
      for (let waited = 0; waited < 15_000; waited += 50) {
        if ((await streamEventIds(relaying.redis, stream)).includes(String(transferId))) break
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
      assert.deepEqual(await streamEventIds(relaying.redis, stream), [String(transferId)])
      assert.deepEqual(await relaying.db.query('SELECT id FROM outbox_events'), [])
    },
  )
})

/** `n` transfers of 1 VND, with their events unless `outbox` is false (OUTBOX=off). */
async function makeTransfers(
  db: TestDatabase['db'],
  from: TestCustomer,
  to: TestCustomer,
  n: number,
  outbox = true,
) {
  for (let i = 0; i < n; i++) {
    await executeTransfer(
      db,
      {
        customerId: from.customerId,
        fromAccountId: from.accountIds[0]!,
        toAccountId: to.accountIds[0]!,
        amount: 1,
        currency: 'VND',
      },
      undefined,
      { outbox },
    )
  }
}

/** Every node of an EXPLAIN (FORMAT JSON) plan, depth first. */
function planNodes(node: Record<string, unknown>): Array<Record<string, unknown>> {
  const children = (node.Plans as Array<Record<string, unknown>> | undefined) ?? []
  return [node, ...children.flatMap(planNodes)]
}

/**
 * The scans of outbox_events in the generic plan of the relay's claim after `setup`: of CLAIM_SQL
 * alone, or `asTheRelayPlansIt` (CLAIM_PLAN_SETTING first, in the same transaction).
 */
async function claimPlanScans(
  database: TestDatabase,
  asTheRelayPlansIt: boolean,
  setup: (tx: Queryable) => Promise<void>,
) {
  const plan = await database.db
    .transaction(async (tx) => {
      await setup(tx)
      if (asTheRelayPlansIt) await tx.query(CLAIM_PLAN_SETTING)
      await tx.query("SET LOCAL plan_cache_mode = 'force_generic_plan'")
      await tx.query(`PREPARE relay_claim_plan(int) AS ${CLAIM_SQL}`)
      const [row] = await tx.query<{ 'QUERY PLAN': Array<{ Plan: Record<string, unknown> }> }>(
        'EXPLAIN (FORMAT JSON) EXECUTE relay_claim_plan(100)',
      )
      await tx.query('DEALLOCATE relay_claim_plan')
      // Rolled back: the events go.
      throw { plan: row!['QUERY PLAN'][0]!.Plan }
    })
    .catch((thrown: { plan?: Record<string, unknown> }) => {
      if (!thrown.plan) throw thrown
      return thrown.plan
    })
  return planNodes(plan)
    .filter((node) => node['Relation Name'] === 'outbox_events' && String(node['Node Type']).endsWith('Scan'))
    .map((node) => `${node['Node Type']}${node['Index Name'] ? ` using ${node['Index Name']}` : ''}`)
}

const insertEvents = async (tx: Queryable, count: number) => {
  await tx.query(
    `INSERT INTO outbox_events (id, type, transfer_id, from_customer_id, to_customer_id, from_account_id,
       to_account_id, amount, currency, occurred_at)
     SELECT g, 'transfer.completed', g, 1, 2, 1, 2, 1, 'VND', now() FROM generate_series(1, $1::integer) g`,
    [count],
  )
}

test("the relay's claim finds its rows by primary key: no scan of the backlog or of its dead rows", async (t) => {
  const database = await createTestDatabase()
  t.after(() => database.drop())
  // The subquery walks the primary key from the oldest id; the delete looks its ids up in it.
  const byPrimaryKey = ['Index Scan using outbox_events_pkey', 'Index Scan using outbox_events_pkey']
  // A backlog of 5,000 events, half of them deleted (relayed) and not yet vacuumed: CLAIM_SQL's
  // own shape finds its rows by primary key, without the setting (as `id IN (subquery)` it was a
  // hash join over a scan of the whole table, which sequential scans off would only turn into a
  // full index scan).
  const backlog = await claimPlanScans(database, false, async (tx) => {
    await insertEvents(tx, 5000)
    await tx.query('ANALYZE outbox_events')
    await tx.query('DELETE FROM outbox_events WHERE id <= 2500')
  })
  assert.deepEqual(backlog, byPrimaryKey)
  // A drained outbox that (auto)vacuum has emptied and analyzed, as it finds a queue table, planned
  // when the next events arrive. Without CLAIM_PLAN_SETTING both scans are sequential (and the
  // subquery sorts), and the relay keeps that plan while the backlog and its dead rows grow.
  await insertEvents(database.db, 5000)
  await database.db.query('DELETE FROM outbox_events')
  await database.db.query('VACUUM ANALYZE outbox_events')
  const drained = await claimPlanScans(database, true, (tx) => insertEvents(tx, 50))
  assert.deepEqual(drained, byPrimaryKey)
})

/** A new database where alice paid bob `n` times (n events in the backlog), a Redis client and a stream name of their own. */
async function withBacklog(
  n: number,
  check: (backlog: { db: TestDatabase['db']; redis: Redis; stream: string }) => Promise<void>,
) {
  const database = await createTestDatabase()
  const redis = new Redis(TEST_REDIS_URL)
  const stream = `${uniquePrefix('relay')}events:transfers`
  try {
    const a = await createCustomer(database.db, 'alice', [1_000_000])
    const b = await createCustomer(database.db, 'bob', [1_000_000])
    await makeTransfers(database.db, a, b, n)
    await check({ db: database.db, redis, stream })
  } finally {
    await redis.del(stream, `${stream}:relay-epoch`)
    redis.disconnect()
    await database.drop()
  }
}

test('four relays in parallel on one backlog: every event on the stream exactly once', async () => {
  await withBacklog(200, async ({ db, redis, stream }) => {
    const relays = Array.from({ length: 4 }, () =>
      createOutboxRelay({ db, redis, stream, retention: 10_000, batch: 7, intervalMs: 1000 }),
    )
    // Four pool connections open and warm first: a relay that waited for a new connection while
    // another relayed the whole backlog made a run with no parallelism to test.
    await Promise.all(
      relays.map(() => db.query('SELECT count(*) FROM outbox_events, transfers, pg_sleep(0.05)')),
    )
    const moved = await Promise.all(relays.map((r) => r.relayPending()))
    assert.equal(
      moved.reduce((x, y) => x + y),
      200,
    )
    assert.ok(moved.filter((n) => n > 0).length >= 2, `work was shared: ${moved}`)
    const ids = await streamEventIds(redis, stream)
    assert.equal(ids.length, 200)
    assert.equal(new Set(ids).size, 200)
    const [left] = await db.query<{ n: string }>('SELECT count(*)::text AS n FROM outbox_events')
    assert.equal(left!.n, '0')
  })
})

test('a first relay that drains more than the loss check reads back, then another pass: every event once', async () => {
  // A new stream has no epoch key. The first pass relays 200 events (the check read back only the
  // stream's first 10 batches after a restart, 70 here): a later check, of this relay or a relay
  // started after it, must not take the missing epoch key for a Redis restart and refill the rest.
  await withBacklog(200, async ({ db, redis, stream }) => {
    const options = { db, redis, stream, retention: 10_000, batch: 7, intervalMs: 1000 }
    const first = createOutboxRelay(options)
    assert.equal(await first.relayPending(), 200)
    assert.equal(await first.relayPending(), 0)
    assert.equal(await createOutboxRelay(options).relayPending(), 0)
    const ids = await streamEventIds(redis, stream)
    assert.equal(ids.length, 200)
    assert.equal(new Set(ids).size, 200)
  })
})

test('a loss check while another relay appends older events after newer committed ones refills nothing', async () => {
  await withBacklog(14, async ({ db, redis, stream }) => {
    const ids = (
      await db.query<{ id: string }>('SELECT id::text FROM outbox_events ORDER BY outbox_events.id')
    ).map((r) => r.id)
    // Relays A and C claimed the older and the newer seven. C appended its seven and committed;
    // A appended its seven after C's and has not committed (it dies here: its rows stay).
    await redis.set(`${stream}:relay-epoch`, '1')
    await appendEvents(redis, stream, ids.slice(7))
    await db.query('DELETE FROM outbox_events WHERE id = ANY ($1::bigint[])', [ids.slice(7)])
    await appendEvents(redis, stream, ids.slice(0, 7))
    // The stream's newest seven are older than the newest relayed event: not a loss.
    const relay = createOutboxRelay({ db, redis, stream, retention: 10_000, batch: 7, intervalMs: 1000 })
    assert.equal(await relay.relayPending(), 7, 'A\u2019s rows, relayed again (the one way to a duplicate)')
    const onStream = await streamEventIds(redis, stream)
    assert.deepEqual(
      ids.map((id) => onStream.filter((x) => x === id).length),
      [2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1],
      'C\u2019s committed events are not refilled',
    )
  })
})

test('an older event a slower relay appended last, then lost with the newest writes: the loss check refills it', async () => {
  await withBacklog(14, async ({ db, redis, stream }) => {
    const ids = (
      await db.query<{ id: string }>('SELECT id::text FROM outbox_events ORDER BY outbox_events.id')
    ).map((r) => r.id)
    // C appended the newer seven and committed, then A appended the older seven and committed.
    await redis.set(`${stream}:relay-epoch`, '1')
    await appendEvents(redis, stream, ids.slice(7))
    await appendEvents(redis, stream, ids.slice(0, 7))
    await db.query('DELETE FROM outbox_events')
    // A failover loses the newest write: A's last entry. The newest ids are all still there.
    const [last] = (await redis.xrevrange(stream, '+', '-', 'COUNT', 1)) as Array<[string, string[]]>
    await redis.xdel(stream, last![0])
    const relay = createOutboxRelay({ db, redis, stream, retention: 10_000, batch: 7, intervalMs: 1000 })
    assert.equal(await relay.relayPending(), 1, 'the lost event, relayed again')
    const onStream = await streamEventIds(redis, stream)
    assert.deepEqual(
      ids.map((id) => onStream.filter((x) => x === id).length),
      ids.map(() => 1),
      'every event on the stream once',
    )
  })
})

test('a batch Redis refuses stays in the backlog; one accepted goes on the stream in id order', async () => {
  await withBacklog(30, async ({ db, redis, stream }) => {
    const relay = createOutboxRelay({ db, redis, stream, retention: 10_000, intervalMs: 1000 })
    // A key of the wrong type: every XADD of the pass fails, so its transaction rolls back.
    await redis.set(stream, 'not a stream')
    await assert.rejects(relay.relayPending(), /WRONGTYPE/)
    const backlog = async () =>
      (await db.query<{ id: string }>('SELECT id::text FROM outbox_events ORDER BY outbox_events.id')).map(
        (r) => r.id,
      )
    const pending = await backlog()
    assert.equal(pending.length, 30, 'the refused batch is still in the backlog')
    await redis.del(stream)
    assert.equal(await relay.relayPending(), 30)
    assert.deepEqual(await streamEventIds(redis, stream), pending)
    assert.deepEqual(await backlog(), [])
  })
})

/**
 * A relay on a redis-server of its own, over a new database where alice paid bob 20 times, all
 * relayed. `restartEmpty` restarts that Redis without its data, running `whileDown` in between.
 */
async function relayedOnOwnRedis() {
  const database = await createTestDatabase()
  let server = await startRedisServer()
  const redis = new Redis(server.url, { maxRetriesPerRequest: 1 })
  redis.on('error', () => {})
  const stream = 'events:transfers'
  const relay = createOutboxRelay({ db: database.db, redis, stream, retention: 10_000, intervalMs: 1000 })
  const close = async () => {
    redis.disconnect()
    await server.stop()
    await database.drop()
  }
  const eventTransfers = () => eventTransferIds(database.db)
  try {
    const a = await createCustomer(database.db, 'alice', [1_000_000])
    const b = await createCustomer(database.db, 'bob', [1_000_000])
    await makeTransfers(database.db, a, b, 20)
    assert.equal(await relay.relayPending(), 20)
    return {
      db: database.db,
      redis,
      stream,
      relay,
      transfer: (n: number) => makeTransfers(database.db, a, b, n),
      async restartEmpty(whileDown: () => Promise<void> = async () => {}) {
        await server.kill()
        await whileDown()
        server = await startRedisServer(server.port)
        await new Promise<void>((resolve) =>
          redis.status === 'ready' ? resolve() : redis.once('ready', resolve),
        )
      },
      /** The stream holds every event once. */
      async assertEveryEventOnce() {
        const ids = (await streamEventIds(redis, stream)).map(Number)
        assert.deepEqual(
          ids.sort((x, y) => x - y),
          await eventTransfers(),
          'every event once',
        )
      },
      close,
    }
  } catch (err) {
    await close()
    throw err
  }
}

test('Redis restarted without its data: the relay refills the stream from the transfers', async (context) => {
  const t = await relayedOnOwnRedis()
  context.after(() => t.close())
  // Transfers keep committing while Redis is down: their events wait in the outbox.
  await t.restartEmpty(async () => {
    await t.transfer(5)
    await assert.rejects(t.relay.relayPending())
  })
  assert.equal(await t.redis.exists(t.stream), 0, 'the restarted Redis has no stream')
  await t.relay.relayPending()
  await t.assertEveryEventOnce()
})

test('Redis restarted empty and newer events appended before a loss check: the older ones are refilled too', async (context) => {
  const t = await relayedOnOwnRedis()
  context.after(() => t.close())
  assert.equal(await t.relay.relayPending(), 0, 'a check that finds nothing lost')
  await t.restartEmpty()
  // What a pass without a loss check (a commit's wake-up) leaves when it runs first: the newer
  // events on the empty stream, the older ones on no stream at all.
  await t.transfer(5)
  const newer = await t.db.query<{ id: string }>('DELETE FROM outbox_events RETURNING id::text AS id')
  assert.equal(newer.length, 5)
  await appendEvents(
    t.redis,
    t.stream,
    newer.map((r) => r.id),
  )

  assert.equal(await t.relay.relayPending(), 20, 'the twenty lost with the restart go back to the stream')
  await t.assertEveryEventOnce()
  assert.equal(await t.relay.relayPending(), 0, 'and a later check finds nothing more to refill')
})

test('Redis restarted empty, then an older batch appended first: the newer events relayed before the restart are refilled', async (context) => {
  const t = await relayedOnOwnRedis()
  context.after(() => t.close())
  await t.transfer(14)
  const backlog = await t.db.query<{ id: string }>(
    'SELECT id::text FROM outbox_events ORDER BY outbox_events.id',
  )
  const [older, newer] = [backlog.slice(0, 7).map((r) => r.id), backlog.slice(7).map((r) => r.id)]
  // Relay C appended and committed the newer seven; relay A had claimed the older seven and its
  // pass failed with the restart (rolled back: they stay in the backlog).
  await t.db.query('DELETE FROM outbox_events WHERE id = ANY ($1::bigint[])', [newer])
  await t.restartEmpty()
  // A's next pass, a commit's wake-up (no loss check), appends the older seven first.
  await t.db.query('DELETE FROM outbox_events WHERE id = ANY ($1::bigint[])', [older])
  await appendEvents(t.redis, t.stream, older)

  assert.equal(await t.relay.relayPending(), 27, 'the twenty earlier events and C\u2019s seven')
  await t.assertEveryEventOnce()
})

test('Redis loses its data again while the first check after a restart runs: a later check still refills', async (context) => {
  const t = await relayedOnOwnRedis()
  context.after(() => t.close())
  const epochKey = `${t.stream}:relay-epoch`
  assert.equal(await t.redis.exists(epochKey), 1, 'the first check, with nothing relayed, started the epoch')
  await t.redis.del(epochKey)
  // As after a restart that kept the stream: the epoch key gone, the check sees the twenty on the
  // stream (nothing to refill); Redis loses everything just before it sets the epoch key.
  let flushed = false
  const losing = new Proxy(t.redis, {
    get(target, property) {
      if (property === 'set')
        return async (...args: Parameters<typeof target.set>) => {
          if (args[0] === epochKey && !flushed) {
            flushed = true
            await target.flushall()
          }
          return target.set(...args)
        }
      const value = Reflect.get(target, property, target)
      return typeof value === 'function' ? value.bind(target) : value
    },
  })
  const relay = createOutboxRelay({
    db: t.db,
    redis: losing,
    stream: t.stream,
    retention: 10_000,
    intervalMs: 1000,
  })
  assert.equal(await relay.relayPending(), 0)
  assert.ok(flushed, 'the data loss happened inside the check')
  assert.equal(
    await t.redis.exists(epochKey),
    0,
    'the check that overlapped the loss did not mark the stream checked',
  )
  // A commit's wake-up (no loss check) relays newer events onto the empty stream first.
  await t.transfer(5)
  const newer = await t.db.query<{ id: string }>('DELETE FROM outbox_events RETURNING id::text AS id')
  await appendEvents(
    t.redis,
    t.stream,
    newer.map((r) => r.id),
  )
  assert.equal(await relay.relayPending(), 20, 'the twenty lost go back to the stream')
  await t.assertEveryEventOnce()
  assert.deepEqual(await t.redis.keys(`${epochKey}:check:*`), [], 'no canary left behind')
})

test("Redis restarted while another instance's relay had appended its batch and not yet committed: the check refills that batch too", async (context) => {
  const t = await relayedOnOwnRedis()
  context.after(() => t.close())
  await t.transfer(3)
  // The other relay claimed the three newest (its delete not committed yet) and appended them to
  // the stream; then Redis restarted empty, taking them along.
  let commitClaim!: () => void
  const claimCommitted = t.db.transaction(async (tx) => {
    await tx.query('DELETE FROM outbox_events')
    await new Promise<void>((resolve) => {
      commitClaim = resolve
    })
  })
  while (!commitClaim) await sleep(10)
  await t.redis.flushall()
  // This instance's check runs now: for Postgres those three are still in the backlog.
  let settled = false
  const checked = t.relay.relayPending().finally(() => {
    settled = true
  })
  // Its refill waits on the claimed rows (pg_stat_activity shows it) until the claim commits; a
  // check that leaves them out of its refill does not wait.
  while (!settled) {
    const [waiting] = await t.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity
       WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO outbox_events%'`,
    )
    if (waiting!.n > 0) break
    await sleep(10)
  }
  commitClaim()
  await claimCommitted
  assert.equal(
    await checked,
    23,
    'the twenty relayed earlier and the three whose claim straddled the restart',
  )
  await t.assertEveryEventOnce()
})

test('a loss check reads the transfers since the previous check, never more than the retention, where most wrote no event', async (t) => {
  const database = await createTestDatabase()
  const redis = new Redis(TEST_REDIS_URL)
  const stream = `${uniquePrefix('search')}events:transfers`
  // The relay's statements pass through; its loss check's searches are kept to be measured.
  const searches: Array<{ sql: string; params: unknown[] }> = []
  const db = new Proxy(database.db, {
    get(target, key) {
      if (key === 'query')
        return (sql: string, params: unknown[] = [], options?: object) => {
          if (sql.includes('t.has_event AND NOT EXISTS')) searches.push({ sql, params })
          return target.query(sql, params, options)
        }
      const value = Reflect.get(target, key)
      return typeof value === 'function' ? value.bind(target) : value
    },
  })
  const relay = createOutboxRelay({ db, redis, stream, retention: 1000, intervalMs: 1000 })
  /** Transfers the newest search read: those its scan returned and those its filter dropped. */
  const rowsReadByLastSearch = async () => {
    const { sql, params } = searches.at(-1)!
    const [row] = await database.db.query<{ 'QUERY PLAN': unknown }>(
      `EXPLAIN (ANALYZE, FORMAT JSON) ${sql}`,
      params,
    )
    type PlanNode = {
      'Relation Name'?: string
      'Actual Rows'?: number
      'Rows Removed by Filter'?: number
      Plans?: PlanNode[]
    }
    const read = (node: PlanNode): number =>
      (node['Relation Name'] === 'transfers'
        ? (node['Actual Rows'] ?? 0) + (node['Rows Removed by Filter'] ?? 0)
        : 0) + (node.Plans ?? []).reduce((sum, child) => sum + read(child), 0)
    return read((row!['QUERY PLAN'] as Array<{ Plan: PlanNode }>)[0]!.Plan)
  }
  /** n transfers without an event, as instances with OUTBOX=off write them. */
  const withoutEvents = (n: number) =>
    database.db.query(
      `INSERT INTO transfers (customer_id, from_account_id, to_account_id, amount, currency, has_event)
       SELECT $1, $2, $3, 1, 'VND', false FROM generate_series(1, $4::integer)`,
      [a.customerId, a.accountIds[0], b.accountIds[0], n],
    )
  let a: TestCustomer
  let b: TestCustomer
  t.after(async () => {
    await redis.del(stream, `${stream}:relay-epoch`)
    redis.disconnect()
    await database.drop()
  })
  a = await createCustomer(database.db, 'alice', [1_000_000])
  b = await createCustomer(database.db, 'bob', [1_000_000])
  await makeTransfers(database.db, a, b, 5)
  assert.equal(await relay.relayPending(), 5, 'relayed after a check that found them all in the backlog')
  assert.equal(await relay.relayPending(), 0)

  await withoutEvents(20_000)
  assert.equal(await relay.relayPending(), 0)
  assert.equal(await rowsReadByLastSearch(), 1000, 'the newest 1,000 (the retention), not 20,000')
  await withoutEvents(50)
  assert.equal(await relay.relayPending(), 0)
  assert.equal(await rowsReadByLastSearch(), 50, 'only those since the previous check')
  assert.equal(await relay.relayPending(), 0)
  assert.equal(await rowsReadByLastSearch(), 0)

  // The check still finds what Redis lost: the events within the retention of the newest.
  await makeTransfers(database.db, a, b, 3)
  await withoutEvents(10)
  assert.equal(await relay.relayPending(), 3)
  await redis.del(stream)
  assert.equal(await relay.relayPending(), 3, 'the three newer events go back to the stream')
  assert.equal(await rowsReadByLastSearch(), 11, 'from the newest back to the newest relayed event')
  const events = await database.db.query<{ id: string }>(
    'SELECT id::text FROM transfers WHERE has_event ORDER BY transfers.id DESC LIMIT 3',
  )
  assert.deepEqual(await streamEventIds(redis, stream), events.map((e) => e.id).reverse())
})

test('a refill reaches back at most the stream retention, and only to transfers that wrote an event', async (t) => {
  const database = await createTestDatabase()
  const redis = new Redis(TEST_REDIS_URL)
  const stream = `${uniquePrefix('refill')}events:transfers`
  const relay = createOutboxRelay({ db: database.db, redis, stream, retention: 10, intervalMs: 1000 })
  const eventTransfers = () => eventTransferIds(database.db)
  t.after(async () => {
    await redis.del(stream, `${stream}:relay-epoch`)
    redis.disconnect()
    await database.drop()
  })
  const a = await createCustomer(database.db, 'alice', [1_000_000])
  const b = await createCustomer(database.db, 'bob', [1_000_000])
  await makeTransfers(database.db, a, b, 30)
  assert.equal(await relay.relayPending(), 30)
  const all = await eventTransfers()
  assert.equal(all.length, 30)
  // The stream keeps about the retention (MAXLEN ~): its newest entries, each id a transfer's.
  const onStream = (await streamEventIds(redis, stream)).map(Number)
  assert.deepEqual(onStream, all.slice(all.length - onStream.length), 'an event id is its transfer id')
  // Transfers made without an event (OUTBOX=off) are never turned into one.
  await makeTransfers(database.db, a, b, 3, false)
  assert.equal(await relay.relayPending(), 0, 'nothing was lost: nothing to refill')

  await redis.del(stream)
  assert.equal(await relay.relayPending(), 10)
  const refilled = (await redis.xrange(stream, '-', '+')) as Array<[string, string[]]>
  assert.deepEqual(
    refilled.map(([, f]) => Number(f[f.indexOf('eventId') + 1])),
    all.slice(20),
  )
  // Rebuilt from the transfer, the event is the one first relayed.
  const data = JSON.parse(refilled[0]![1][refilled[0]![1].indexOf('data') + 1]!) as Record<string, unknown>
  assert.deepEqual({ ...data, occurredAt: undefined }, transferEvent(all[20]!, a, b, 1, undefined))
  assert.equal((await database.db.query('SELECT id FROM outbox_events')).length, 0)
})
