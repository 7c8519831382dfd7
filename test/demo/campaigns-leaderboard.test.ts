import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import {
  createLeaderboardConsumer,
  itemsByBoard,
  LEADERBOARD_GROUP,
  maskUsername,
  memberOf,
  WEEK_GRACE_MS,
  weekBoard,
} from '../../src/campaigns/leaderboard.ts'
import { isoWeek } from '../../src/campaigns/periods.ts'
import type { TransferEvent } from '../../src/events/outbox-relay.ts'
import { createLeaderboard, type StreamEntry } from '../../src/index.ts'
import {
  campaignsCaughtUp,
  closeAndClean,
  duplicateEveryEvent,
  transfer,
  until,
} from '../helpers/campaigns.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

// The weekly leaderboard end to end: transfers over real HTTP, the outbox relay, the `leaderboard`
// consumer group, and GET /leaderboard and /leaderboard/me checked against a recomputation from
// Postgres; redeliveries (the same event twice on the stream, the script run again, a dead
// consumer's entries claimed by another) change no score.

const NAMES = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace', 'heidi']

let t: TestApp
let url: string
const customers: Array<TestCustomer & { cookie: string }> = []

before(async () => {
  t = await buildTestApp(
    { OUTBOX_RELAY_INTERVAL: '100ms' },
    { eventWorkers: 'on', eventConsumer: { visibilityTimeoutMs: 1000 } },
  )
  url = await listen(t.app)
  for (const name of NAMES) {
    const customer = await createCustomer(t.db, name, [100_000_000])
    customers.push({ ...customer, cookie: await login(t.app, customer) })
  }
})
after(() => closeAndClean(t))

/** What the leaderboard routes answer: a page, an entry or a problem. */
interface Body {
  type?: string
  period?: string
  currency?: string
  items?: Array<{ rank: number; customer: string; volume: number }>
  rank?: number | null
  volume?: number
}

async function get(path: string, cookie?: string): Promise<{ status: number; body: Body }> {
  const response = await fetch(`${url}${path}`, { headers: cookie ? { cookie } : {} })
  return { status: response.status, body: (await response.json()) as Body }
}

/** The week's VND volume per sender from Postgres, ranked by the documented rule. */
async function expectedRanking(currency = 'VND') {
  const week = isoWeek(Date.now())
  const rows = await t.db.query<{ customer_id: number; username: string; volume: string }>(
    `SELECT t.customer_id, c.username, sum(t.amount)::text AS volume
     FROM transfers t JOIN customers c ON c.id = t.customer_id
     WHERE t.currency = $1 AND t.created_at >= $2 AND t.created_at < $3
     GROUP BY t.customer_id, c.username
     ORDER BY sum(t.amount) DESC, t.customer_id ASC`,
    [currency, new Date(week.startMs), new Date(week.endMs)],
  )
  return {
    period: week.name,
    rows: rows.map((row, i) => ({
      rank: i + 1,
      customerId: row.customer_id,
      customer: maskUsername(row.username),
      volume: Number(row.volume),
    })),
  }
}

/** Many transfers at once over HTTP, every customer sending to others, amounts varied. */
async function burst(count: number, seed: number): Promise<void> {
  await Promise.all(
    Array.from({ length: count }, (_, i) => {
      const from = customers[(i * 5 + seed) % customers.length]!
      const to = customers[(i * 5 + seed + 1 + (i % 3)) % customers.length]!
      return transfer(url, {
        cookie: from.cookie,
        fromAccountId: from.accountIds[0]!,
        toAccountId: to.accountIds[0]!,
        amount: 100 + ((i * 37 + seed) % 900),
        currency: 'VND',
      })
    }),
  )
}

async function assertMatchesPostgres(): Promise<void> {
  const expected = await expectedRanking()
  const top = await get('/leaderboard?period=week&limit=100', customers[0]!.cookie)
  assert.equal(top.status, 200)
  assert.deepEqual(top.body, {
    period: expected.period,
    currency: 'VND',
    items: expected.rows.map(({ rank, customer, volume }) => ({ rank, customer, volume })),
  })
  for (const customer of customers) {
    const mine = await get('/leaderboard/me', customer.cookie)
    assert.equal(mine.status, 200)
    const row = expected.rows.find((r) => r.customerId === customer.customerId)
    assert.deepEqual(mine.body, {
      period: expected.period,
      currency: 'VND',
      rank: row?.rank ?? null,
      volume: row?.volume ?? 0,
    })
  }
}

test('ISO weeks in UTC: Monday to Sunday, week 1 holds the first Thursday', () => {
  assert.equal(isoWeek(Date.parse('2026-11-30T00:00:00Z')).name, '2026-W49')
  assert.equal(isoWeek(Date.parse('2026-12-06T23:59:59.999Z')).name, '2026-W49')
  assert.equal(isoWeek(Date.parse('2026-12-07T00:00:00Z')).name, '2026-W50')
  assert.equal(isoWeek(Date.parse('2026-12-31T12:00:00Z')).name, '2026-W53')
  assert.equal(isoWeek(Date.parse('2027-01-01T12:00:00Z')).name, '2026-W53')
  assert.equal(isoWeek(Date.parse('2027-01-04T00:00:00Z')).name, '2027-W01')
  assert.equal(isoWeek(Date.parse('2024-12-30T00:00:00Z')).name, '2025-W01')
  const week = isoWeek(Date.parse('2026-12-02T15:00:00Z'))
  assert.equal(new Date(week.startMs).toISOString(), '2026-11-30T00:00:00.000Z')
  assert.equal(new Date(week.endMs).toISOString(), '2026-12-07T00:00:00.000Z')
})

test('usernames are masked: first and last character', () => {
  assert.equal(maskUsername('alice'), 'a***e')
  assert.equal(maskUsername('bob'), 'b***b')
  assert.equal(maskUsername('jo'), 'j***')
  assert.equal(maskUsername('x'), 'x***')
  assert.equal(maskUsername('😀mile😀'), '😀***😀')
})

test('ranks and volumes equal a recomputation from Postgres after concurrent transfers over HTTP', async () => {
  await burst(120, 0)
  await campaignsCaughtUp(t)
  const expected = await expectedRanking()
  assert.equal(expected.rows.length, customers.length, 'every customer sent')
  await assertMatchesPostgres()
  // The default is the top 10; limit cuts the same ranking.
  const defaults = await get('/leaderboard', customers[1]!.cookie)
  assert.equal(defaults.body.items!.length, Math.min(10, expected.rows.length))
  const three = await get('/leaderboard?limit=3', customers[1]!.cookie)
  assert.deepEqual(
    three.body.items,
    expected.rows.slice(0, 3).map(({ rank, customer, volume }) => ({ rank, customer, volume })),
  )
  assert.ok(three.body.items!.every((item) => /^.\*\*\*.?$/u.test(item.customer)))
})

test('every event delivered twice on the stream, while more transfers run, counts once', async () => {
  const board = t.app.campaigns.leaderboard.keys(weekBoard(isoWeek(Date.now()).name, 'VND')).board
  const before = await t.redis.zrange(board, '0', '-1', 'WITHSCORES')
  const duplicated = await duplicateEveryEvent(t)
  assert.ok(duplicated >= 120)
  await campaignsCaughtUp(t)
  assert.deepEqual(await t.redis.zrange(board, '0', '-1', 'WITHSCORES'), before)
  // Duplicates and new transfers interleaved on the stream.
  await Promise.all([duplicateEveryEvent(t), burst(40, 3)])
  await campaignsCaughtUp(t)
  await assertMatchesPostgres()
})

test('running the script again for counted event ids changes no score', async () => {
  const rows = await t.db.query<{ id: string; from_customer_id: number; amount: string }>(
    // An event's id is its transfer's id.
    "SELECT id::text, customer_id AS from_customer_id, amount::text FROM transfers WHERE has_event AND currency = 'VND'",
  )
  const week = isoWeek(Date.now())
  const name = weekBoard(week.name, 'VND')
  const { leaderboard } = t.app.campaigns
  const before = await leaderboard.top(name, 100)
  const items = rows.map((row) => ({
    id: row.id,
    member: memberOf(row.from_customer_id),
    amount: Number(row.amount),
  }))
  assert.equal(await leaderboard.add(name, items, { expireAtMs: week.endMs + WEEK_GRACE_MS }), 0)
  assert.deepEqual(await leaderboard.top(name, 100), before)
})

test("a dead consumer's entries, claimed and handled again by a live one, count once", async () => {
  const stream = `${t.prefix}claim-test`
  const leaderboard = createLeaderboard(t.redis, { keyPrefix: `${t.prefix}lb-claim:` })
  const occurredAt = new Date().toISOString()
  const event = (id: number, from: number, amount: number): TransferEvent => ({
    eventId: String(id),
    type: 'transfer.completed',
    transferId: id,
    fromCustomerId: from,
    toCustomerId: 99,
    fromAccountId: from,
    toAccountId: 99,
    amount,
    currency: 'VND',
    occurredAt,
  })
  const events = [event(1, 7, 500), event(2, 7, 250), event(3, 8, 600)]
  await t.redis.xgroup('CREATE', stream, LEADERBOARD_GROUP, '0', 'MKSTREAM')
  for (const e of events) await t.redis.xadd(stream, '*', 'data', JSON.stringify(e))
  // A consumer reads all three and does the work, then dies before XACK: they stay pending.
  const read = (await t.redis.xreadgroup(
    'GROUP',
    LEADERBOARD_GROUP,
    'dead',
    'COUNT',
    10,
    'STREAMS',
    stream,
    '>',
  )) as Array<[string, Array<[string, string[]]>]>
  const entries: StreamEntry[] = read[0]![1].map(([id, list]) => ({
    id,
    fields: { [list[0]!]: list[1]! },
    deliveries: 1,
  }))
  for (const [name, { items, expireAtMs }] of itemsByBoard(entries))
    await leaderboard.add(name, items, { expireAtMs })
  const name = weekBoard(isoWeek(Date.now()).name, 'VND')
  const afterFirst = await leaderboard.top(name, 10)
  assert.deepEqual(
    afterFirst.map((e) => [e.member, e.score]),
    [
      [memberOf(7), 750],
      [memberOf(8), 600],
    ],
  )
  // A live consumer claims them once idle past its visibility timeout and handles them again.
  const live = createLeaderboardConsumer({
    redis: t.redis,
    leaderboard,
    stream,
    consumer: 'live',
    visibilityTimeoutMs: 200,
  })
  await live.start()
  try {
    await until(
      async () => Number(((await t.redis.xpending(stream, LEADERBOARD_GROUP)) as [number])[0]) === 0,
      'the claim',
    )
  } finally {
    await live.stop()
  }
  const claimed = (await t.redis.xinfo('CONSUMERS', stream, LEADERBOARD_GROUP)) as unknown[][]
  assert.ok(
    claimed.some((info) => info.includes('live')),
    'the live consumer took them over',
  )
  assert.deepEqual(await leaderboard.top(name, 10), afterFirst)
})

test('equal volumes rank the lower customer id first, whoever reached the volume first', async () => {
  // EUR: a board of its own, so this tie is not mixed with the VND ranking.
  const first = await createCustomer(t.db, 'tiefirst', [[10_000, 'EUR']])
  const second = await createCustomer(t.db, 'tiesecond', [[10_000, 'EUR']])
  const recipient = await createCustomer(t.db, 'tierecipient', [[0, 'EUR']])
  assert.ok(first.customerId < second.customerId)
  const firstCookie = await login(t.app, first)
  const secondCookie = await login(t.app, second)
  // The higher id reaches 700 first.
  for (const [customer, cookie] of [
    [second, secondCookie],
    [first, firstCookie],
  ] as const) {
    await transfer(url, {
      cookie,
      fromAccountId: customer.accountIds[0]!,
      toAccountId: recipient.accountIds[0]!,
      amount: 700,
      currency: 'EUR',
    })
    await campaignsCaughtUp(t)
  }
  const eur = await get('/leaderboard?currency=EUR', secondCookie)
  assert.deepEqual(eur.body.items, [
    { rank: 1, customer: 't***t', volume: 700 },
    { rank: 2, customer: 't***d', volume: 700 },
  ])
  const me = async (path: string, cookie: string) => {
    const { rank, volume } = (await get(path, cookie)).body
    return { rank, volume }
  }
  assert.deepEqual(await me('/leaderboard/me?currency=EUR', secondCookie), { rank: 2, volume: 700 })
  assert.deepEqual(await me('/leaderboard/me?currency=EUR', firstCookie), { rank: 1, volume: 700 })
  // Nothing in VND: no rank there, and EUR never counts in the VND ranking.
  assert.deepEqual(await me('/leaderboard/me', firstCookie), { rank: null, volume: 0 })
  await assertMatchesPostgres()
  // The same rule on the primitive: members are zero-padded ids, so 9 ranks before 10.
  const board = createLeaderboard(t.redis, { keyPrefix: `${t.prefix}lb-ties:` })
  await board.add('b', [
    { id: 'x', member: memberOf(10), amount: 5 },
    { id: 'y', member: memberOf(9), amount: 5 },
    { id: 'z', member: memberOf(11), amount: 6 },
  ])
  assert.deepEqual(
    (await board.top('b', 10)).map((e) => [e.rank, Number(e.member), e.score]),
    [
      [1, 11, 6],
      [2, 9, 5],
      [3, 10, 5],
    ],
  )
})

test('volumes stay exact integers and saturate at 2^53 - 1', async () => {
  const board = createLeaderboard(t.redis, { keyPrefix: `${t.prefix}lb-big:` })
  const max = Number.MAX_SAFE_INTEGER
  await board.add('b', [
    { id: '1', member: 'a', amount: max - 2 },
    { id: '2', member: 'a', amount: 1 },
    { id: '3', member: 'b', amount: max },
    { id: '4', member: 'b', amount: max },
  ])
  assert.deepEqual(await board.entry('b', 'a'), { rank: 2, member: 'a', score: max - 1 })
  assert.deepEqual(await board.entry('b', 'b'), { rank: 1, member: 'b', score: max })
  assert.equal(await board.entry('b', 'nobody'), null)
  await assert.rejects(board.add('b', [{ id: '5', member: 'a', amount: 0 }]), TypeError)
  await assert.rejects(board.add('b', [{ id: '6', member: 'a', amount: 1.5 }]), TypeError)
})

test("the week's keys carry a TTL: the end of the week plus the grace", async () => {
  const week = isoWeek(Date.now())
  const { board, ids } = t.app.campaigns.leaderboard.keys(weekBoard(week.name, 'VND'))
  for (const key of [board, ids]) {
    const ttl = await t.redis.pttl(key)
    assert.ok(ttl > 0, `${key} has a TTL`)
    assert.ok(ttl <= week.endMs + WEEK_GRACE_MS - Date.now() + 1000, `${key} expires a week after its week`)
    assert.ok(ttl > week.endMs + WEEK_GRACE_MS - Date.now() - 60_000)
  }
})

test('both routes need a session', async () => {
  for (const path of ['/leaderboard', '/leaderboard/me']) {
    const response = await get(path)
    assert.equal(response.status, 401)
    assert.equal(response.body.type, '/problems/unauthenticated')
  }
})

test('bad query strings are refused with 400 validation', async () => {
  const cookie = customers[0]!.cookie
  for (const query of [
    'limit=0',
    'limit=101',
    'limit=ten',
    'limit=01',
    'period=month',
    'currency=vnd',
    'currency=VNDX',
    'page=2',
  ]) {
    const response = await get(`/leaderboard?${query}`, cookie)
    assert.equal(response.status, 400, query)
    assert.equal(response.body.type, '/problems/validation', query)
  }
  assert.equal((await get('/leaderboard/me?period=day', cookie)).status, 400)
  assert.equal((await get('/leaderboard?limit=100', cookie)).status, 200)
})

test('a board Redis cannot read answers 503 leaderboard-unavailable', async () => {
  // A key of the wrong type: every read of that board fails in Redis (WRONGTYPE).
  const name = weekBoard(isoWeek(Date.now()).name, 'JPY')
  await t.redis.set(t.app.campaigns.leaderboard.keys(name).board, 'not a sorted set', 'PX', 60_000)
  for (const path of ['/leaderboard?currency=JPY', '/leaderboard/me?currency=JPY']) {
    const response = await fetch(`${url}${path}`, { headers: { cookie: customers[0]!.cookie } })
    assert.equal(response.status, 503, path)
    assert.equal(response.headers.get('retry-after'), '1')
    assert.equal(((await response.json()) as { type: string }).type, '/problems/leaderboard-unavailable')
  }
})

test('closing the app stops both consumer groups, nothing left pending', async () => {
  const other = await buildTestApp(
    {},
    { eventWorkers: 'on', keyPrefix: t.basePrefix, testDatabase: { db: t.db, drop: async () => {} } },
  )
  assert.equal(other.app.campaigns.consumers.length, 2)
  assert.ok(other.app.campaigns.consumers.every((c) => c.running))
  await other.app.close()
  assert.ok(other.app.campaigns.consumers.every((c) => !c.running))
  for (const group of [LEADERBOARD_GROUP, 'daily-stats']) {
    const [pending] = (await t.redis.xpending(t.app.events.stream, group)) as [number]
    assert.equal(Number(pending), 0, group)
  }
})
