import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { PassThrough } from 'node:stream'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { type RedisServerProcess, startRedisServer } from '../../src/embedded/redis-server.ts'
import { notificationKeys, notifyCustomers } from '../../src/events/notifier.ts'
import { type SseClient, SseHub } from '../../src/events/sse-hub.ts'
import { openSse, type SseConnection } from '../helpers/events-sse.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

// Notifications when Redis loses its data (FLUSHALL here; a restart without persistence or a
// failover that dropped writes is the same to the gateway): the relay refills the stream with the
// recent events, the notifier's markers are gone with the rest, and still nothing already shown is
// shown again and nothing is lost. The Redis is one of the test's own, so that it can be flushed.

let server: RedisServerProcess
let t: TestApp
let url: string
let alice: TestCustomer
let bob: TestCustomer
const open: SseConnection[] = []

before(async () => {
  server = await startRedisServer()
  t = await buildTestApp(
    {
      REDIS_URL: server.url,
      RATE_LIMITS: 'off',
      OUTBOX_RELAY_INTERVAL: '200ms',
      // No session check during the test: the live stream outlives the flush that ends its session.
      SSE_HEARTBEAT: '1h',
    },
    { eventWorkers: 'on' },
  )
  url = await listen(t.app)
  alice = await createCustomer(t.db, 'alice', [1_000_000])
  bob = await createCustomer(t.db, 'bob', [1_000_000])
})
after(async () => {
  for (const connection of open) connection.close()
  await t.close()
  await server.stop()
})

async function until(what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 20_000
  while (!(await check())) {
    assert.ok(Date.now() < deadline, what)
    await sleep(20)
  }
}

async function transfer(cookie: string, amount: number): Promise<number> {
  const response = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { cookie, 'idempotency-key': randomUUID(), 'content-type': 'application/json' },
    body: JSON.stringify({
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount,
      currency: 'VND',
    }),
  })
  assert.equal(response.status, 201)
  return ((await response.json()) as { transferId: number }).transferId
}

/** The notifier read every entry of the events stream and acknowledged it. */
async function notifierDone(): Promise<boolean> {
  if ((await t.redis.exists(t.app.events.stream)) === 0) return false
  const groups = (await t.redis.xinfo('GROUPS', t.app.events.stream)) as unknown[][]
  for (const info of groups) {
    const fields = new Map<string, unknown>()
    for (let i = 0; i + 1 < info.length; i += 2) fields.set(String(info[i]), info[i + 1])
    if (fields.get('name') === 'notifier')
      return Number(fields.get('lag')) === 0 && Number(fields.get('pending')) === 0
  }
  return false
}

async function sse(cookie: string, lastEventId?: string): Promise<SseConnection> {
  const connection = await openSse(`${url}/notifications`, {
    cookie,
    ...(lastEventId ? { 'last-event-id': lastEventId } : {}),
  })
  assert.equal(connection.status, 200)
  open.push(connection)
  return connection
}

const transferIds = (connection: SseConnection) => connection.messages.map((m) => Number(m.data.transferId))

test('a FLUSHALL mid-stream: the refilled events are not shown again, later ones arrive live and after a reconnect with Last-Event-ID, once each', async () => {
  let aliceCookie = await login(t.app, alice)
  const live = await sse(await login(t.app, bob))
  const made: number[] = []
  for (let i = 1; i <= 5; i++) made.push(await transfer(aliceCookie, i))
  await live.waitFor(5)

  await t.redis.flushall()
  // The relay found the stream's data gone and put the five events back; the notifier (its group
  // made again) went through them.
  await until('the relay refilled the events stream', async () => {
    const entries = (await t.redis.xrange(t.app.events.stream, '-', '+')) as Array<[string, string[]]>
    const refilled = new Set(entries.map(([, fields]) => Number(fields[fields.indexOf('eventId') + 1])))
    return made.every((id) => refilled.has(id))
  })
  await until('the notifier handled the refill', notifierDone)

  // Sessions went with the flush: both log in again. Bob's open stream stays.
  aliceCookie = await login(t.app, alice)
  for (let i = 6; i <= 8; i++) made.push(await transfer(aliceCookie, i))
  await live.waitFor(8)
  live.close()
  await live.ended

  const bobCookie = await login(t.app, bob)
  for (let i = 9; i <= 10; i++) made.push(await transfer(aliceCookie, i))
  await until('the notifier handled the transfers made while bob was away', notifierDone)
  assert.ok(live.lastEventId, 'the live stream gave a position')
  const reconnected = await sse(bobCookie, live.lastEventId!)
  // A fence: what arrives before it is everything the reconnect was going to get.
  made.push(await transfer(aliceCookie, 11))
  await reconnected.waitFor(3)
  await until('the fence arrived', async () => transferIds(reconnected).includes(made.at(-1)!))

  assert.deepEqual(transferIds(live), made.slice(0, 8), 'live: each once, nothing refilled shown again')
  assert.deepEqual(transferIds(reconnected), made.slice(8), 'the reconnect: what was missed, once')
  await until('the notifier recorded the fence', notifierDone)
  const [recorded] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM notified_events')
  assert.equal(recorded!.n, made.length, 'every event recorded as notified in Postgres')
  assert.equal(
    await t.redis.xlen(notificationKeys(t.prefix, bob.customerId).stream),
    6,
    'only new ones appended',
  )
})

test('the hub shows an event once per stream, even appended again under a new stream id', async (context) => {
  const prefix = `${t.prefix}hub:`
  const hub = new SseHub({
    redis: t.redis,
    prefix,
    heartbeatMs: 3_600_000,
    sessionAlive: async (ids) => ids.map(() => true),
  })
  const customerId = 7
  const notification = (eventId: string) => ({
    customerId,
    event: 'transfer.received' as const,
    data: {
      eventId,
      transferId: Number(eventId),
      fromAccountId: 1,
      toAccountId: 2,
      amount: 1,
      currency: 'VND',
      occurredAt: new Date().toISOString(),
    },
  })
  const keys = notificationKeys(prefix, customerId)
  const [first] = await notifyCustomers(t.redis, prefix, [notification('1')], 100, 60_000)
  const out = new PassThrough()
  let text = ''
  out.on('data', (chunk: Buffer) => {
    text += chunk.toString()
  })
  const client: SseClient = { customerId, sessionId: 's', out, buffer: [], lastId: null }
  await hub.open(client, first!)
  context.after(() => hub.stop())
  // Event 2 live; then event 1 and 2 again (their markers lost, as in a Redis data loss); then 3.
  await notifyCustomers(t.redis, prefix, [notification('2')], 100, 60_000)
  await t.redis.del(keys.marker('1', 'transfer.received'), keys.marker('2', 'transfer.received'))
  const [again1, again2] = await notifyCustomers(
    t.redis,
    prefix,
    [notification('1'), notification('2')],
    100,
    60_000,
  )
  await notifyCustomers(t.redis, prefix, [notification('3')], 100, 60_000)
  await until('the live messages arrived', async () => text.includes('"transferId":3'))
  const shown = [...text.matchAll(/"transferId":([0-9]+)/g)].map((m) => Number(m[1]))
  assert.deepEqual(shown, [2, 1, 3], 'event 1 was not shown on this stream before: once; event 2 once')
  assert.ok(!text.includes(`id: ${again2}\nevent`), 'the repeat of event 2 went without data')
  assert.ok(text.includes(`id: ${again2}\n\n`), "the repeat's position went out, for the next Last-Event-ID")
  assert.ok(text.includes(`id: ${again1}\nevent`))
  // A replay from before all of them on a new stream: each event once.
  const replayed = new PassThrough()
  let replayText = ''
  replayed.on('data', (chunk: Buffer) => {
    replayText += chunk.toString()
  })
  const second: SseClient = { customerId, sessionId: 's2', out: replayed, buffer: [], lastId: null }
  await hub.open(second, '0-1')
  assert.deepEqual(
    [...replayText.matchAll(/"transferId":([0-9]+)/g)].map((m) => Number(m[1])),
    [1, 2, 3],
  )
})
