import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { test } from 'node:test'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { createNotifier, notificationKeys } from '../../src/events/notifier.ts'
import { createOutboxRelay } from '../../src/events/outbox-relay.ts'
import { executeTransfer } from '../../src/ledger/ledger.ts'
import { buildTestApp, createCustomer, createTestDatabase, USE_PGLITE } from '../helpers/gateway.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'
import { RUN_TYPESCRIPT } from '../helpers/tsx.ts'

// Processes die at the worst moments: a relay SIGKILLed after its XADDs and before its COMMIT, a
// notifier SIGKILLed with an event half notified and entries pending. After a restart, every
// committed transfer has exactly one notification per involved customer (checked against Postgres).

function runChild(env: Record<string, string>): Promise<NodeJS.Signals | null> {
  const child = spawn(process.execPath, [...RUN_TYPESCRIPT, 'test/helpers/events-worker-child.ts'], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'inherit', 'inherit'],
  })
  const killer = setTimeout(() => child.kill('SIGKILL'), 60_000)
  return new Promise((resolve) =>
    child.once('exit', (_code, signal) => {
      clearTimeout(killer)
      resolve(signal)
    }),
  )
}

test('relay and notifier SIGKILLed mid-work: after restart, one notification per customer per transfer', {
  skip: USE_PGLITE && 'needs a Postgres server shared with child processes',
}, async (context) => {
  const database = await createTestDatabase()
  const redis = new Redis(TEST_REDIS_URL)
  const prefix = uniquePrefix('crash')
  const stream = `${prefix}events:transfers`
  const env = { DATABASE_URL: database.url!, REDIS_URL: TEST_REDIS_URL, PREFIX: prefix }
  context.after(async () => {
    const keys = await scanKeys(redis, prefix)
    if (keys.length) await redis.del(...keys)
    await redis.quit()
    await database.drop()
  })
  const alice = await createCustomer(database.db, 'alice', [1_000_000])
  const bob = await createCustomer(database.db, 'bob', [1_000_000])
  for (let i = 0; i < 60; i++) {
    const [from, to] = i % 3 === 0 ? [bob, alice] : [alice, bob]
    await executeTransfer(database.db, {
      customerId: from.customerId,
      fromAccountId: from.accountIds[0]!,
      toAccountId: to.accountIds[0]!,
      amount: i + 1,
      currency: 'VND',
    })
  }

  // The relay dies in its third batch: two batches committed, the third on the stream but not marked.
  assert.equal(await runChild({ ...env, MODE: 'relay', CRASH_AT: '3' }), 'SIGKILL')
  const [state] = await database.db.query<{ relayed: string; left: string }>(
    `SELECT (SELECT count(*) FROM transfers t
               WHERE t.has_event AND NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = t.id))::text AS relayed,
              (SELECT count(*) FROM outbox_events)::text AS left`,
  )
  assert.deepEqual(state, { relayed: '20', left: '40' })
  assert.equal(await redis.xlen(stream), 30, 'the third batch reached the stream uncommitted')

  // The rest is relayed by a relay that survives (the third batch a second time).
  const relay = createOutboxRelay({ db: database.db, redis, stream, retention: 100_000, intervalMs: 1000 })
  assert.equal(await relay.relayPending(), 40)
  assert.equal(await redis.xlen(stream), 70)

  // The notifier reads the 70 entries in one batch (140 notifications: script calls of 100 and 40)
  // and dies right after the first call's reply: some notified, the rest not, every entry pending.
  assert.equal(await runChild({ ...env, MODE: 'notifier', CRASH_AT: '1' }), 'SIGKILL')
  const [pending] = (await redis.xpending(stream, 'notifier')) as [number]
  assert.ok(Number(pending) > 0, 'the dead notifier left entries pending')

  // A restarted notifier claims the dead one's entries after the visibility timeout and finishes.
  const notifier = createNotifier({
    db: database.db,
    refillReach: 100_000,
    redis,
    prefix,
    stream,
    consumer: 'restarted',
    retention: 100_000,
    dedupTtlMs: 3_600_000,
    visibilityTimeoutMs: 300,
    blockMs: 100,
  })
  await notifier.start()
  const deadline = Date.now() + 30_000
  for (;;) {
    const groups = (await redis.xinfo('GROUPS', stream)) as unknown[][]
    const info = new Map<string, unknown>()
    for (let i = 0; i + 1 < groups[0]!.length; i += 2) info.set(String(groups[0]![i]), groups[0]![i + 1])
    if (Number(info.get('pending')) === 0 && Number(info.get('lag')) === 0) break
    assert.ok(Date.now() < deadline, 'the restarted notifier caught up')
    await new Promise((r) => setTimeout(r, 50))
  }
  await notifier.stop()

  const transfers = await database.db.query<{ id: string; sender: number; recipient: number }>(
    `SELECT t.id::text, t.customer_id AS sender, a.customer_id AS recipient
       FROM transfers t JOIN accounts a ON a.id = t.to_account_id ORDER BY t.id`,
  )
  assert.equal(transfers.length, 60)
  const notified = async (customerId: number) => {
    const entries = (await redis.xrange(notificationKeys(prefix, customerId).stream, '-', '+')) as Array<
      [string, string[]]
    >
    return entries.map(([, f]) => ({
      event: f[f.indexOf('event') + 1],
      transferId: String((JSON.parse(f[f.indexOf('data') + 1]!) as { transferId: number }).transferId),
    }))
  }
  const byCustomer = new Map([
    [alice.customerId, await notified(alice.customerId)],
    [bob.customerId, await notified(bob.customerId)],
  ])
  for (const t of transfers) {
    const sent = byCustomer.get(t.sender)!.filter((n) => n.transferId === t.id && n.event === 'transfer.sent')
    const received = byCustomer
      .get(t.recipient)!
      .filter((n) => n.transferId === t.id && n.event === 'transfer.received')
    assert.equal(sent.length, 1, `transfer ${t.id}: one transfer.sent`)
    assert.equal(received.length, 1, `transfer ${t.id}: one transfer.received`)
  }
  assert.equal(byCustomer.get(alice.customerId)!.length + byCustomer.get(bob.customerId)!.length, 120)
})

test('Redis restarted without its data during a run: every committed transfer is notified once, before or after the restart', async (context) => {
  const server = await startRedisServer()
  let again: Awaited<ReturnType<typeof startRedisServer>> | undefined
  const t = await buildTestApp(
    { REDIS_URL: server.url, OUTBOX_RELAY_INTERVAL: '100ms' },
    { eventWorkers: 'on', eventConsumer: { visibilityTimeoutMs: 500 } },
  )
  const probe = new Redis(server.url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  probe.on('error', () => {})
  context.after(async () => {
    probe.disconnect()
    await t.close()
    await again?.stop()
    await server.stop().catch(() => {})
  })
  const alice = await createCustomer(t.db, 'alice', [1_000_000])
  const bob = await createCustomer(t.db, 'bob', [1_000_000])
  const move = async (n: number) => {
    for (let i = 0; i < n; i++)
      await executeTransfer(t.db, {
        customerId: alice.customerId,
        fromAccountId: alice.accountIds[0]!,
        toAccountId: bob.accountIds[0]!,
        amount: 1,
        currency: 'VND',
      })
  }
  const received = async () =>
    (
      (await probe.xrange(notificationKeys(t.prefix, bob.customerId).stream, '-', '+')) as Array<
        [string, string[]]
      >
    ).map(([, f]) => (JSON.parse(f[f.indexOf('data') + 1]!) as { transferId: number }).transferId)
  const until = async (check: () => Promise<boolean>, what: string) => {
    const deadline = Date.now() + 30_000
    while (!(await check().catch(() => false))) {
      assert.ok(Date.now() < deadline, what)
      await new Promise((r) => setTimeout(r, 50))
    }
  }
  await probe.connect()
  await move(10)
  await until(async () => (await received()).length === 10, 'the first ten notified')
  const before = await received()
  await server.kill()
  // Committed while Redis is down, then Redis comes back empty.
  await move(5)
  again = await startRedisServer(server.port)
  const transfers = await t.db.query<{ id: string }>('SELECT id::text FROM transfers ORDER BY transfers.id')
  // The relay refills all fifteen events; the notifier skips the ten Postgres records as notified.
  await until(async () => (await received()).length >= 5, 'the five committed during the outage notified')
  await until(async () => {
    const [row] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM notified_events')
    return row!.n === 15
  }, 'all fifteen recorded as notified')
  await until(async () => {
    const entries = (await probe.xrange(t.app.events.stream, '-', '+')) as Array<[string, string[]]>
    const groups = (await probe.xinfo('GROUPS', t.app.events.stream)) as unknown[][]
    const group = groups.find((g) => g[g.indexOf('name') + 1] === 'notifier') ?? []
    const info = new Map<string, unknown>()
    for (let i = 0; i + 1 < group.length; i += 2) info.set(String(group[i]), group[i + 1])
    return entries.length >= 15 && Number(info.get('lag')) === 0 && Number(info.get('pending')) === 0
  }, 'the refilled events went through the notifier')
  const ids = [...before, ...(await received())]
  assert.deepEqual(
    [...ids].sort((x, y) => x - y),
    transfers.map((r) => Number(r.id)),
    'each committed transfer notified exactly once, before or after the restart',
  )
})
