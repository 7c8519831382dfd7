import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { documentedKeys } from '../../load/lib/redis-keys.ts'
import { LEADERBOARD_GROUP } from '../../src/campaigns/leaderboard.ts'
import { STATS_GROUP } from '../../src/campaigns/stats.ts'
import { NOTIFIER_GROUP, notificationKeys } from '../../src/events/notifier.ts'
import { FEED_GROUP } from '../../src/public-accounts/plugin.ts'
import { closeAndClean, groupDone, until } from '../helpers/campaigns.ts'
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
import { listen, scanKeys, uniquePrefix } from '../helpers/index.ts'

// Every key bounded: the demo gateway, with every worker running (outbox relay, notifier,
// leaderboard and daily totals, scheduled transfers and the reconciliation job) and its rate limits
// on, goes through its flows over HTTP; then every key under its prefix must either expire (a TTL)
// or be one that docs/demo/redis-keys.md documents as capped or as a fixed number per deployment or
// instance. A key that docs/demo/redis-keys.md does not list fails the test with its name.

const DEAD_LETTER_RETENTION = 5
const NOTIFICATIONS_TTL_MS = 3 * 3_600_000

let database: TestDatabase
let t: TestApp
let url: string
let alice: TestCustomer & { cookie: string }
let bob: TestCustomer & { cookie: string }
let carol: TestCustomer & { cookie: string }
const prefix = uniquePrefix('rk')
const open: SseConnection[] = []

before(async () => {
  database = await createTestDatabase()
  t = await buildTestApp(
    {
      // Long enough that the keys the flows made are still there when the last test looks.
      CACHE_TTL: '10m',
      RATE_LIMIT_TRANSFERS: '20/10m',
      OUTBOX_RELAY_INTERVAL: '100ms',
      SSE_HEARTBEAT: '200ms',
      NOTIFICATIONS_TTL: '3h',
      EVENTS_DEAD_LETTER_RETENTION: String(DEAD_LETTER_RETENTION),
    },
    {
      testDatabase: database,
      keyPrefix: prefix,
      rateLimits: 'on',
      eventWorkers: 'on',
      accountFilter: 'on',
      // A poison entry goes to the dead letters on its second delivery, half a second after the first.
      eventConsumer: { visibilityTimeoutMs: 500, maxDeliveries: 2 },
      scheduler: {
        transfers: { moveIntervalMs: 50, reconcileIntervalMs: 1000, heartbeatTtlMs: 3000 },
        reconciliation: { periodMs: 3_600_000, moveIntervalMs: 50 },
      },
    },
  )
  url = await listen(t.app)
  const customer = async (name: string) => {
    const created = await createCustomer(database.db, name, [10_000_000])
    return { ...created, cookie: await login(t.app, created) }
  }
  alice = await customer('alice')
  bob = await customer('bob')
  carol = await customer('carol')
  // carol's account is public (the demo's relief fund): bob follows it below.
  await database.db.query("UPDATE accounts SET public_name = 'Relief Fund' WHERE id = $1", [
    carol.accountIds[0],
  ])
  // Inserted straight into Postgres: the account filter is told, as the gateway's own inserts do.
  await t.app.accountFilter.settled()
  await t.app.accountFilter.add([alice, bob, carol].flatMap((c) => c.accountIds))
})

after(async () => {
  for (const connection of open) connection.close()
  await closeAndClean(t)
  await database.drop()
})

/** Every committed event is on the stream and every consumer group has handled all of them. */
async function eventsCaughtUp(): Promise<void> {
  await until(async () => {
    const [row] = await database.db.query<{ n: number }>('SELECT count(*)::int AS n FROM outbox_events')
    if (row!.n > 0) return false
    for (const group of [NOTIFIER_GROUP, LEADERBOARD_GROUP, STATS_GROUP, FEED_GROUP])
      if (!(await groupDone(t, group))) return false
    return true
  }, 'the outbox relay and the notifier, leaderboard, daily-stats and feed groups')
}

function inject(
  who: { cookie: string },
  method: 'GET' | 'POST' | 'PUT' | 'DELETE',
  path: string,
  payload?: object,
  idempotencyKey?: string,
) {
  return t.app.inject({
    method,
    url: path,
    headers: { cookie: who.cookie, ...(idempotencyKey ? { 'idempotency-key': idempotencyKey } : {}) },
    ...(payload ? { payload } : {}),
  })
}

async function transfer(
  from: TestCustomer & { cookie: string },
  to: TestCustomer,
  amount: number,
  key = randomUUID(),
) {
  const response = await inject(
    from,
    'POST',
    '/transfers',
    { fromAccountId: from.accountIds[0], toAccountId: to.accountIds[0], amount, currency: 'VND' },
    key,
  )
  assert.equal(response.statusCode, 201, response.body)
  return response
}

test('the demo flows over HTTP: login, balances, transfers, a notification, scheduled transfers, campaigns, history, logout', async () => {
  // A failed login too: the per-username limit counts only failures.
  const failed = await t.app.inject({
    method: 'POST',
    url: '/session',
    payload: { username: 'alice', password: 'not her password' },
  })
  assert.equal(failed.statusCode, 401)
  const stream = await openSse(`${url}/notifications`, { cookie: bob.cookie })
  open.push(stream)
  assert.equal(stream.status, 200)

  // Balances, twice each: the second read is a cache hit.
  for (let i = 0; i < 2; i++) {
    assert.equal((await inject(alice, 'GET', '/accounts')).statusCode, 200)
    assert.equal((await inject(alice, 'GET', `/accounts/${alice.accountIds[0]}/balance`)).statusCode, 200)
  }
  const key = randomUUID()
  const first = await transfer(alice, bob, 1000, key)
  const replay = await transfer(alice, bob, 1000, key)
  assert.equal(replay.headers['idempotent-replayed'], 'true')
  assert.equal(replay.json().transferId, first.json().transferId)
  await transfer(alice, bob, 2000)
  await transfer(bob, alice, 500)
  const [notification] = await stream.waitFor(1)
  assert.equal(notification!.event, 'transfer.received')
  assert.equal(notification!.data.transferId, first.json().transferId)

  // bob follows carol's public account; the scheduled transfer to it below reaches his feed.
  assert.equal((await inject(bob, 'GET', '/public-accounts')).statusCode, 200)
  assert.equal((await inject(bob, 'PUT', `/public-accounts/${carol.accountIds[0]}/follow`)).statusCode, 204)
  assert.equal((await inject(bob, 'GET', '/feed')).statusCode, 200)

  // A scheduled transfer cancelled, and one that runs.
  const later = await inject(
    alice,
    'POST',
    '/scheduled-transfers',
    {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 300,
      currency: 'VND',
      runAt: new Date(Date.now() + 3_600_000).toISOString(),
    },
    randomUUID(),
  )
  assert.equal(later.statusCode, 201, later.body)
  const cancelled = await inject(alice, 'DELETE', `/scheduled-transfers/${later.json().scheduleId}`)
  assert.equal(cancelled.statusCode, 204, cancelled.body)
  const soon = await inject(
    alice,
    'POST',
    '/scheduled-transfers',
    {
      fromAccountId: alice.accountIds[0],
      toAccountId: carol.accountIds[0],
      amount: 400,
      currency: 'VND',
      runAt: new Date(Date.now() + 1000).toISOString(),
    },
    randomUUID(),
  )
  assert.equal(soon.statusCode, 201, soon.body)
  await until(async () => {
    const schedule = await inject(alice, 'GET', `/scheduled-transfers/${soon.json().scheduleId}`)
    return schedule.json().status === 'completed'
  }, 'the scheduled transfer to run')

  await eventsCaughtUp()
  await until(
    async () => (await inject(bob, 'GET', '/feed')).json().items.length === 1,
    "the movement in bob's feed",
  )
  const leaderboard = await inject(alice, 'GET', '/leaderboard')
  assert.equal(leaderboard.statusCode, 200, leaderboard.body)
  assert.ok(leaderboard.json().items.length >= 2)
  assert.equal((await inject(alice, 'GET', '/leaderboard/me')).statusCode, 200)
  const today = await inject(alice, 'GET', '/stats/today')
  assert.equal(today.statusCode, 200, today.body)
  assert.ok(today.json().transfers >= 4)
  const history = await inject(alice, 'GET', `/accounts/${alice.accountIds[0]}/transactions`)
  assert.equal(history.statusCode, 200, history.body)
  assert.ok(history.json().items.length >= 4)
  // Balances again, now that the transfers invalidated them: cached anew.
  assert.equal((await inject(alice, 'GET', `/accounts/${alice.accountIds[0]}/balance`)).statusCode, 200)
  assert.equal((await inject(alice, 'GET', '/accounts')).statusCode, 200)

  // Every notification stream written expires NOTIFICATIONS_TTL after its latest notification.
  for (const customer of [alice, bob, carol]) {
    const ttl = await t.redis.pttl(notificationKeys(t.prefix, customer.customerId).stream)
    assert.ok(ttl > 0 && ttl <= NOTIFICATIONS_TTL_MS, `customer ${customer.customerId}: stream TTL ${ttl} ms`)
  }
  const logout = await inject(alice, 'DELETE', '/session')
  assert.ok(logout.statusCode < 300, logout.body)
})

test('a notification trims the notifications older than NOTIFICATIONS_TTL from the customer stream', async () => {
  const dave = await createCustomer(database.db, 'dave', [1000])
  const key = notificationKeys(t.prefix, dave.customerId).stream
  // Notifications of four hours ago, more than a node of the stream (100 entries) holds: a whole
  // node of them can be trimmed (MINID ~ removes whole nodes only).
  const old = Date.now() - 4 * 3_600_000
  const fill = t.redis.multi()
  for (let i = 0; i < 150; i++) fill.xadd(key, `${old}-${i}`, 'event', 'transfer.received', 'data', '{}')
  await fill.exec()
  await transfer(bob, dave, 100)
  await until(async () => {
    const [last] = (await t.redis.xrevrange(key, '+', '-', 'COUNT', 1)) as Array<[string, string[]]>
    return Number(last![0].split('-')[0]) > old
  }, "dave's notification")
  const [oldest] = (await t.redis.xrange(key, '-', '+', 'COUNT', 1)) as Array<[string, string[]]>
  assert.notEqual(oldest![0], `${old}-0`, 'the oldest notifications were trimmed')
  assert.ok((await t.redis.xlen(key)) < 151)
  const ttl = await t.redis.pttl(key)
  assert.ok(ttl > 0 && ttl <= NOTIFICATIONS_TTL_MS, `stream TTL ${ttl} ms`)
})

test('poison events: the dead-letter stream keeps about EVENTS_DEAD_LETTER_RETENTION entries', async () => {
  // Entries no consumer can parse: each of the four groups dead-letters every one (4 x 40).
  const poison = t.redis.multi()
  for (let i = 0; i < 40; i++)
    poison.xadd(t.app.events.stream, '*', 'eventId', `poison-${i}`, 'data', 'not json')
  await poison.exec()
  await eventsCaughtUp()
  const dead = t.app.events.deadLetterStream
  const length = await t.redis.xlen(dead)
  // MAXLEN ~ trims whole nodes of the stream (at most 100 entries each by default).
  assert.ok(
    length >= DEAD_LETTER_RETENTION && length <= DEAD_LETTER_RETENTION + 100,
    `${length} dead letters kept of 160`,
  )
  const [newest] = (await t.redis.xrevrange(dead, '+', '-', 'COUNT', 1)) as Array<[string, string[]]>
  assert.ok(newest![1].includes('not json'))
})

test('every key the gateway wrote expires, or is documented in docs/demo/redis-keys.md as capped or one per deployment', async () => {
  const documented = documentedKeys()
  for (const key of documented)
    assert.ok(
      key.withoutTtl || /^TTL\b/.test(key.bound),
      `a bound that is a TTL, a cap or a fixed count: ${key.pattern}`,
    )
  const keys = await scanKeys(t.redis, prefix)
  assert.ok(keys.length > 0)
  const problems: string[] = []
  const seen = new Set<string>()
  for (const key of keys.sort()) {
    const name = key.slice(t.prefix.length)
    const matching = documented.filter((d) => d.regex.test(name))
    const ttl = await t.redis.pttl(key)
    if (ttl === -2) continue
    const type = await t.redis.type(key)
    for (const d of matching) seen.add(d.pattern)
    if (matching.length === 0)
      problems.push(`${name} (${type}, PTTL ${ttl}): no pattern of docs/demo/redis-keys.md`)
    else if (ttl === -1 && !matching.some((d) => d.withoutTtl))
      problems.push(`${name} (${type}): no TTL, documented as "${matching[0]!.bound}"`)
  }
  assert.deepEqual(problems, [])
  // The flows above wrote keys of every part of the gateway.
  for (const pattern of [
    'sess:{*}',
    'sess:principal:{*}',
    'rl:{*}:transfers:fixed-window',
    'idem:{*}',
    'cache:{*}:v',
    'events:transfers',
    'events:transfers:dead',
    'notifications:{*}',
    'notified:{*}:*:*',
    'lb:{week:*:*}',
    'stats:{*:*}',
    'dq:{scheduled-transfers}:heartbeat:*',
  ])
    assert.ok(seen.has(pattern), `a key of \`${pattern}\` was written`)
})
