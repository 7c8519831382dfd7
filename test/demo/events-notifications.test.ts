import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { request } from 'node:http'
import { PassThrough } from 'node:stream'
import { after, before, test } from 'node:test'
import { notificationKeys, notifyCustomers } from '../../src/events/notifier.ts'
import { SseHub } from '../../src/events/sse-hub.ts'
import { openSse, type SseConnection } from '../helpers/events-sse.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestCustomer,
  type TestDatabase,
} from '../helpers/gateway.ts'
import { listen, scanKeys, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

// Live notifications end to end over real HTTP: two gateway instances on one Redis and one
// database, A running the outbox relay and B the consumers (EVENT_WORKERS); a transfer on A reaches
// the SSE stream on B through B's notifier.

let database: TestDatabase
let a: TestApp
let b: TestApp
let urlA: string
let urlB: string
let alice: TestCustomer
let bob: TestCustomer
let aliceCookieA: string
let bobCookieB: string
const prefix = uniquePrefix('ev')
const open: SseConnection[] = []

before(async () => {
  database = await createTestDatabase()
  const env = {
    SSE_MAX_STREAMS: '3',
    SSE_HEARTBEAT: '200ms',
    OUTBOX_RELAY_INTERVAL: '200ms',
    NOTIFICATIONS_DEDUP: '2h',
    NOTIFICATIONS_TTL: '3h',
  }
  const deps = { testDatabase: database, keyPrefix: prefix, eventWorkers: 'on' as const }
  a = await buildTestApp({ ...env, EVENT_WORKERS: 'relay' }, deps)
  b = await buildTestApp({ ...env, EVENT_WORKERS: 'notifier,campaigns' }, deps)
  urlA = await listen(a.app)
  urlB = await listen(b.app)
  alice = await createCustomer(database.db, 'alice', [1_000_000])
  bob = await createCustomer(database.db, 'bob', [1_000_000])
  aliceCookieA = await login(a.app, alice)
  bobCookieB = await login(b.app, bob)
})
after(async () => {
  for (const c of open) c.close()
  await a.close()
  await b.close()
  await database.drop()
  // The apps' clients closed with them: the keys go through a client of the suite's own.
  const { Redis } = await import('ioredis')
  const redis = new Redis(TEST_REDIS_URL)
  try {
    const keys = await scanKeys(redis, prefix)
    if (keys.length > 0) await redis.del(...keys)
  } finally {
    await redis.quit()
  }
})

async function transferOnA(amount: number): Promise<number> {
  const response = await fetch(`${urlA}/transfers`, {
    method: 'POST',
    headers: { cookie: aliceCookieA, 'idempotency-key': randomUUID(), 'content-type': 'application/json' },
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

/** The group read every entry and acknowledged it (XINFO GROUPS: lag and pending 0). */
async function groupDone(stream: string, group: string): Promise<boolean> {
  const groups = (await a.redis.xinfo('GROUPS', stream)) as unknown[][]
  for (const info of groups) {
    const fields = new Map<string, unknown>()
    for (let i = 0; i + 1 < info.length; i += 2) fields.set(String(info[i]), info[i + 1])
    if (fields.get('name') === group)
      return Number(fields.get('lag')) === 0 && Number(fields.get('pending')) === 0
  }
  return false
}

/** One `transfer.received` notification, as the notifier appends and publishes it; its stream id. */
async function notify(customerId: number, transferId: number): Promise<string> {
  const [id] = await notifyCustomers(
    b.redis,
    b.prefix,
    [
      {
        customerId,
        event: 'transfer.received',
        data: {
          eventId: `drop-${transferId}`,
          transferId,
          fromAccountId: 1,
          toAccountId: 2,
          amount: 1,
          currency: 'VND',
          occurredAt: new Date().toISOString(),
        },
      },
    ],
    1000,
    60_000,
  )
  return id!
}

/** The client id of instance B's Pub/Sub connection (CLIENT LIST, by its name). */
async function subscriberOfB(admin: import('ioredis').Redis): Promise<string> {
  const subscriber = String(await admin.call('CLIENT', 'LIST', 'TYPE', 'pubsub'))
    .split('\n')
    .find((line) => line.includes(` name=${a.prefix}sse-subscriber `))
  const id = /^id=([0-9]+) /.exec(subscriber ?? '')?.[1]
  assert.ok(id, "instance B's subscriber connection is listed")
  return id
}

async function sse(url: string, cookie: string, lastEventId?: string) {
  const connection = await openSse(`${url}/notifications`, {
    cookie,
    ...(lastEventId ? { 'last-event-id': lastEventId } : {}),
  })
  open.push(connection)
  return connection
}

test("bob's stream on instance B gets transfer.received for alice's transfer on instance A", async () => {
  const bobStream = await sse(urlB, bobCookieB)
  const aliceStream = await sse(urlA, aliceCookieA)
  assert.equal(bobStream.status, 200)
  assert.match(bobStream.contentType, /^text\/event-stream/)
  const transferId = await transferOnA(1234)
  const [received] = await bobStream.waitFor(1)
  assert.equal(received!.event, 'transfer.received')
  assert.equal(received!.data.transferId, transferId)
  assert.equal(received!.data.amount, 1234)
  assert.equal(received!.data.toAccountId, bob.accountIds[0])
  const [sent] = await aliceStream.waitFor(1)
  assert.equal(sent!.event, 'transfer.sent')
  assert.equal(sent!.data.transferId, transferId)
  // The SSE id is the notification's id on bob's stream in Redis.
  const entries = (await b.redis.xrange(
    notificationKeys(a.prefix, bob.customerId).stream,
    '-',
    '+',
  )) as Array<[string, string[]]>
  assert.ok(entries.some(([id]) => id === received!.id))
  // The notifier remembers the event per customer for NOTIFICATIONS_DEDUP (2 h here), then forgets it.
  const keys = notificationKeys(a.prefix, bob.customerId)
  const ttl = await b.redis.pttl(keys.marker(String(received!.data.eventId), 'transfer.received'))
  assert.ok(ttl > 3_600_000 && ttl <= 7_200_000, `marker TTL ${ttl} ms`)
  // Bob's stream lives NOTIFICATIONS_TTL (3 h here) after his latest notification.
  const streamTtl = await b.redis.pttl(keys.stream)
  assert.ok(streamTtl > 7_200_000 && streamTtl <= 10_800_000, `notification stream TTL ${streamTtl} ms`)
  bobStream.close()
  aliceStream.close()
})

test('reconnecting with Last-Event-ID delivers exactly the missed notifications, in order, then live ones', async () => {
  const first = await sse(urlB, bobCookieB)
  const before = await transferOnA(1)
  const [seen] = await first.waitFor(1)
  assert.equal(seen!.data.transferId, before)
  first.close()
  await first.ended

  const missed = [await transferOnA(2), await transferOnA(3), await transferOnA(4)]
  const key = notificationKeys(a.prefix, bob.customerId).stream
  const deadline = Date.now() + 15_000
  let stored: Array<[string, string[]]>
  for (;;) {
    stored = (await b.redis.xrange(key, `(${seen!.id}`, '+')) as Array<[string, string[]]>
    if (stored.length >= 3) break
    assert.ok(Date.now() < deadline, 'the missed notifications reached the stream')
    await new Promise((r) => setTimeout(r, 20))
  }

  // Exactly the stream's entries after Last-Event-ID, in stream order. Two instances relay and notify
  // in parallel, so transfers milliseconds apart may sit on the stream in either order.
  const again = await sse(urlA, bobCookieB, seen!.id)
  const replayed = await again.waitFor(3)
  assert.deepEqual(
    replayed.map((m) => m.id),
    stored.map(([id]) => id),
  )
  assert.deepEqual(replayed.map((m) => m.data.transferId).sort(), [...missed].sort())
  assert.ok(replayed.every((m) => m.event === 'transfer.received'))
  const live = await transferOnA(5)
  const all = await again.waitFor(4)
  assert.equal(all[3]!.data.transferId, live)
  assert.equal(new Set(all.map((m) => m.id)).size, 4, 'no duplicate')
  again.close()
})

test('a Last-Event-ID Redis cannot start after (a part of 2^64 or more, the largest id) is a 400, not a 503', async () => {
  for (const id of [
    '99999999999999999999-0',
    '0-18446744073709551616',
    '18446744073709551615-18446744073709551615',
  ]) {
    const refused = await sse(urlB, bobCookieB, id)
    assert.equal(refused.status, 400)
    assert.equal(JSON.parse(refused.body).type, '/problems/validation')
  }
  const largest = await sse(urlB, bobCookieB, '18446744073709551615-0')
  assert.equal(largest.status, 200)
  largest.close()
})

test('a Last-Event-ID beyond the newest notification replays nothing and holds back no live one', async () => {
  // Made up, or kept from before Redis lost the stream: newer than anything the stream holds.
  const ahead = await sse(urlB, bobCookieB, `${Date.now() + 86_400_000}-0`)
  assert.equal(ahead.status, 200)
  const live = await transferOnA(6)
  const [first] = await ahead.waitFor(1)
  assert.equal(first!.data.transferId, live)
  ahead.close()
})

test('notifications published while the Pub/Sub connection is down arrive after it reconnects, once each', async () => {
  const frank = await createCustomer(database.db, 'frank', [1_000])
  const grace = await createCustomer(database.db, 'grace', [1_000])
  // frank has had a notification (the resync replays after it), grace none yet (after where her
  // stream stood when she opened).
  const [frankStream, graceStream] = await Promise.all([
    sse(urlB, await login(b.app, frank)),
    sse(urlB, await login(b.app, grace)),
  ])
  await notify(frank.customerId, 1)
  await frankStream.waitFor(1)

  const { Redis } = await import('ioredis')
  const admin = new Redis(TEST_REDIS_URL)
  try {
    await admin.call('CLIENT', 'KILL', 'ID', await subscriberOfB(admin))
    // Published at once, before ioredis reconnects (its first retry waits 50 ms).
    await Promise.all([notify(frank.customerId, 2), notify(grace.customerId, 3)])
  } finally {
    admin.disconnect()
  }
  const [frankGot, graceGot] = await Promise.all([frankStream.waitFor(2), graceStream.waitFor(1)])
  assert.deepEqual(
    frankGot.map((m) => m.data.transferId),
    [1, 2],
  )
  assert.deepEqual(
    graceGot.map((m) => m.data.transferId),
    [3],
  )
  // Live again: the next one comes once, over the new connection.
  await notify(grace.customerId, 4)
  assert.deepEqual(
    (await graceStream.waitFor(2)).map((m) => m.data.transferId),
    [3, 4],
  )
  frankStream.close()
  graceStream.close()
})

test('a stream opening while the Pub/Sub connection drops ends at its position; the reconnect misses nothing', async (t) => {
  const { Redis } = await import('ioredis')
  // A hub of its own, whose replay reply is held until the test lets it through: the replay has
  // run in Redis, the subscriber drops and a notification is published, and only then does the
  // open go on.
  const hubPrefix = `${prefix}gate:`
  const redis = new Redis(TEST_REDIS_URL)
  const admin = new Redis(TEST_REDIS_URL)
  let replayRan = () => {}
  const ran = new Promise<void>((resolve) => {
    replayRan = resolve
  })
  let release = () => {}
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  const multi = redis.multi.bind(redis)
  redis.multi = ((...args: Parameters<typeof redis.multi>) => {
    const transaction = multi(...args)
    const exec = transaction.exec.bind(transaction)
    transaction.exec = (async () => {
      const replies = await exec()
      replayRan()
      await held
      return replies
    }) as typeof transaction.exec
    return transaction
  }) as typeof redis.multi
  const hub = new SseHub({
    redis,
    prefix: hubPrefix,
    heartbeatMs: 60_000,
    sessionAlive: async (ids) => ids.map(() => true),
  })
  const customerId = 9_000_001
  const keys = notificationKeys(hubPrefix, customerId)
  /** What the notifier does for one notification: XADD to the customer's stream, then PUBLISH. */
  const notifyCommands = (transferId: number, tx: ReturnType<typeof admin.multi>) => {
    const data = JSON.stringify({ transferId })
    const id = `${Date.now()}-${transferId}`
    return tx
      .xadd(keys.stream, id, 'event', 'transfer.received', 'data', data)
      .publish(keys.channel, JSON.stringify({ id, event: 'transfer.received', data }))
  }
  const openClient = (lastEventId: string) => {
    const out = new PassThrough()
    let text = ''
    out.setEncoding('utf8')
    out.on('data', (chunk: string) => {
      text += chunk
    })
    const client = { customerId, sessionId: 's', out, buffer: [] as never[], lastId: null }
    return { client, out, opened: hub.open(client, lastEventId), text: () => text }
  }
  t.after(async () => {
    release()
    await hub.stop()
    await admin.del(keys.stream)
    redis.disconnect()
    admin.disconnect()
  })
  await notifyCommands(21, admin.multi()).exec()
  const seen = (await admin.xrevrange(keys.stream, '+', '-', 'COUNT', 1))[0]![0]
  const first = openClient(seen)
  await ran
  const subscriber = String(await admin.call('CLIENT', 'LIST', 'TYPE', 'pubsub'))
    .split('\n')
    .find((line) => line.includes(` name=${hubPrefix}sse-subscriber `))
  const subscriberId = /^id=([0-9]+) /.exec(subscriber ?? '')?.[1]
  assert.ok(subscriberId, "the hub's subscriber connection is listed")
  // The drop and the notification in one step: no subscriber can hear it.
  await notifyCommands(22, admin.multi().client('KILL', 'ID', subscriberId)).exec()
  // Back and subscribed again before the open goes on.
  for (;;) {
    const [, count] = (await admin.call('PUBSUB', 'NUMSUB', keys.channel)) as [string, number]
    if (Number(count) === 1) break
    await new Promise((r) => setTimeout(r, 10))
  }
  release()
  await first.opened
  assert.equal(first.out.writableEnded, true, 'the stream ends instead of going live')
  assert.equal(hub.count(customerId), 0)
  assert.doesNotMatch(first.text(), /"transferId\\?":22/)
  assert.equal(/id: (\S+)\n\n$/.exec(first.text())?.[1], seen, 'its last line is its position')

  // The browser reconnects with that id: the one it missed, once, then live ones.
  const again = openClient(seen)
  await again.opened
  await notifyCommands(23, admin.multi()).exec()
  for (;;) {
    if (/"transferId\\?":23/.test(again.text())) break
    await new Promise((r) => setTimeout(r, 10))
  }
  const ids = [...again.text().matchAll(/"transferId\\?":([0-9]+)/g)].map((m) => Number(m[1]))
  assert.deepEqual(ids, [22, 23])
})

test('a customer gets at most SSE_MAX_STREAMS open streams per instance: 429 beyond', async () => {
  const streams = [await sse(urlB, bobCookieB), await sse(urlB, bobCookieB), await sse(urlB, bobCookieB)]
  assert.ok(streams.every((s) => s.status === 200))
  const refused = await sse(urlB, bobCookieB)
  assert.equal(refused.status, 429)
  assert.match(refused.contentType, /^application\/problem\+json/)
  assert.equal(JSON.parse(refused.body).type, '/problems/too-many-notification-streams')
  for (const s of streams) s.close()
  for (const s of streams) await s.ended
  // Closed streams free their places (the hub hears the disconnect).
  const deadline = Date.now() + 5000
  while (b.app.events.hub.count(bob.customerId) > 0 && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 20))
  assert.equal((await sse(urlB, bobCookieB)).status, 200)
})

test('a client that disconnects before its stream opens takes no place among its SSE_MAX_STREAMS', async (t) => {
  const carol = await createCustomer(database.db, 'carol', [1_000])
  const cookie = await login(b.app, carol)
  // Redis holds every command for a moment, the session load among them: the client gives up
  // while its request waits, before the route runs.
  const { Redis } = await import('ioredis')
  const admin = new Redis(TEST_REDIS_URL)
  t.after(() => admin.disconnect())
  await admin.call('CLIENT', 'PAUSE', '400', 'ALL')
  const impatient = request(`${urlB}/notifications`, { headers: { cookie }, agent: false })
  impatient.on('error', () => {})
  impatient.end()
  await new Promise((r) => setTimeout(r, 100))
  impatient.destroy()
  // Their session loads queue behind the impatient one's: the route runs for it first.
  const streams = [await sse(urlB, cookie), await sse(urlB, cookie), await sse(urlB, cookie)]
  assert.deepEqual(
    streams.map((s) => s.status),
    [200, 200, 200],
  )
  assert.equal(b.app.events.hub.count(carol.customerId), 3)
  for (const s of streams) s.close()
})

test('a client that stops reading is dropped once 1 MiB waits for it; a reading one gets everything', async () => {
  const dave = await createCustomer(database.db, 'dave', [1_000])
  const erin = await createCustomer(database.db, 'erin', [1_000])
  const [daveCookie, erinCookie] = [await login(b.app, dave), await login(b.app, erin)]
  // dave's client reads the response head and then nothing: the socket's buffers fill, then the hub's.
  let received = 0
  const stalled = await new Promise<import('node:http').IncomingMessage>((resolve, reject) => {
    const req = request(`${urlB}/notifications`, { headers: { cookie: daveCookie }, agent: false })
    req.on('error', reject)
    req.on('response', (res) => {
      res.on('data', (chunk: Buffer) => {
        received += chunk.length
      })
      res.pause()
      resolve(res)
    })
    req.end()
  })
  assert.equal(stalled.statusCode, 200)
  const reading = await sse(urlB, erinCookie)
  while (b.app.events.hub.count(dave.customerId) === 0) await new Promise((r) => setTimeout(r, 10))
  // 16 MiB of live notifications to each, well past what loopback sockets hold (a few MiB).
  const data = JSON.stringify({ pad: 'x'.repeat(64 * 1024) })
  const published = 256
  const start = Date.now()
  for (let i = 1; i <= published; i++) {
    for (const customerId of [dave.customerId, erin.customerId]) {
      const message = JSON.stringify({ id: `${start}-${i}`, event: 'transfer.received', data })
      await b.redis.publish(notificationKeys(a.prefix, customerId).channel, message)
    }
  }
  const deadline = Date.now() + 15_000
  while (b.app.events.hub.count(dave.customerId) > 0 && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 20))
  assert.equal(b.app.events.hub.count(dave.customerId), 0, 'the stalled stream is closed')
  // The server dropped the connection: reading again, the client gets what the sockets held, then the end.
  const closed = new Promise<void>((resolve) => stalled.on('close', () => resolve()))
  stalled.resume()
  await closed
  assert.ok(received < published * data.length, `received ${received} bytes, fewer than were published`)
  // The reading client kept its stream and got every one of them, in order.
  const got = await reading.waitFor(published, 30_000)
  assert.deepEqual(
    got.map((m) => m.id),
    Array.from({ length: published }, (_, i) => `${start}-${i + 1}`),
  )
  assert.equal(b.app.events.hub.count(erin.customerId), 1)
  reading.close()
})

test('without a session: 401; logout in this process and a session ended elsewhere close the streams', async () => {
  const anonymous = await sse(urlB, '')
  assert.equal(anonymous.status, 401)

  const cookie = await login(b.app, bob)
  const here = await sse(urlB, cookie)
  assert.ok(here.comments.includes('connected'))
  const logout = await fetch(`${urlB}/session`, { method: 'DELETE', headers: { cookie } })
  assert.equal(logout.status, 204)
  await here.ended

  // Logged out through instance A: B sees the session gone at its next heartbeat check.
  const other = await login(b.app, bob)
  const there = await sse(urlB, other)
  const out = await fetch(`${urlA}/session`, { method: 'DELETE', headers: { cookie: other } })
  assert.equal(out.status, 204)
  await there.ended
})

test('EVENT_WORKERS splits the workers: A runs no consumer, each group has one (on B)', async () => {
  assert.equal(a.app.events.notifier, null)
  assert.deepEqual(a.app.campaigns.consumers, [])
  for (const group of ['notifier', 'leaderboard', 'daily-stats']) {
    const consumers = (await a.redis.xinfo('CONSUMERS', a.app.events.stream, group)) as unknown[][]
    assert.equal(consumers.length, 1, `${group}: one consumer`)
  }
})

test('a redelivered event is notified once per customer', async (context) => {
  const database2 = await createTestDatabase()
  const p = uniquePrefix('dup')
  const t = await buildTestApp({}, { testDatabase: database2, keyPrefix: p })
  context.after(async () => {
    await t.close()
    await database2.drop()
  })
  const x = await createCustomer(t.db, 'x', [1000])
  const y = await createCustomer(t.db, 'y', [1000])
  const event = {
    eventId: '42',
    type: 'transfer.completed',
    transferId: 42,
    fromCustomerId: x.customerId,
    toCustomerId: y.customerId,
    fromAccountId: x.accountIds[0],
    toAccountId: y.accountIds[0],
    amount: 1,
    currency: 'VND',
    occurredAt: new Date().toISOString(),
  }
  // The same event twice on the stream (a relay that died between XADD and COMMIT).
  for (let i = 0; i < 2; i++)
    await t.redis.xadd(t.app.events.stream, '*', 'eventId', '42', 'data', JSON.stringify(event))
  const { createNotifier } = await import('../../src/events/notifier.ts')
  const notifier = createNotifier({
    db: t.db,
    refillReach: 100_000,
    redis: t.redis,
    prefix: p,
    stream: t.app.events.stream,
    consumer: 'c',
    retention: 100,
    dedupTtlMs: 3_600_000,
    blockMs: 100,
  })
  await notifier.start()
  const deadline = Date.now() + 10_000
  while (!(await groupDone(t.app.events.stream, 'notifier'))) {
    assert.ok(Date.now() < deadline, 'the notifier went through the stream')
    await new Promise((r) => setTimeout(r, 20))
  }
  await notifier.stop()
  assert.equal(await t.redis.xlen(notificationKeys(p, x.customerId).stream), 1)
  assert.equal(await t.redis.xlen(notificationKeys(p, y.customerId).stream), 1)
  const keys = await scanKeys(t.redis, p)
  if (keys.length) await t.redis.del(...keys)
})

test('metrics: outbox backlog and age, stream length, group pending and lag, dead letters, SSE clients', async () => {
  const stream = await sse(urlB, bobCookieB)
  const text = await (await fetch(`${urlB}/metrics`)).text()
  stream.close()
  for (const series of [
    /^outbox_backlog \d+$/m,
    /^outbox_oldest_unrelayed_age_seconds [\d.e+-]+$/m,
    /^events_stream_length\{stream="stream"\} [1-9]\d*$/m,
    /^events_stream_length\{stream="dead_letter"\} 0$/m,
    /^events_group_entries\{group="notifier",state="pending"\} \d+$/m,
    /^events_group_entries\{group="notifier",state="lag"\} \d+$/m,
    /^sse_clients [1-9]\d*$/m,
  ])
    assert.match(text, series)
})
