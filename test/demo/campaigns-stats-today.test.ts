import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { utcDay } from '../../src/campaigns/periods.ts'
import { dayCounter, STATS_SHARDS, STATS_TTL_MS } from '../../src/campaigns/stats.ts'
import { createShardedCounter } from '../../src/index.ts'
import { campaignsCaughtUp, closeAndClean, duplicateEveryEvent, transfer } from '../helpers/campaigns.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { listen, scanKeys } from '../helpers/index.ts'

// Today's totals end to end: a burst of concurrent transfers over real HTTP, the `daily-stats`
// consumer group writing to a sharded counter, and GET /stats/today checked against Postgres's own
// count, sum and count(distinct); redeliveries count once. Then the ShardedCounter primitive alone.

let t: TestApp
let url: string
const customers: Array<TestCustomer & { cookie: string }> = []

before(async () => {
  t = await buildTestApp(
    { OUTBOX_RELAY_INTERVAL: '100ms' },
    { eventWorkers: 'on', eventConsumer: { visibilityTimeoutMs: 1000 } },
  )
  url = await listen(t.app)
  // Twelve customers in VND; every third also holds USD.
  for (let i = 0; i < 12; i++) {
    const balances: Array<number | [number, string]> =
      i % 3 === 0 ? [50_000_000, [1_000_000, 'USD']] : [50_000_000]
    const customer = await createCustomer(t.db, `stats${i}`, balances)
    customers.push({ ...customer, cookie: await login(t.app, customer) })
  }
})
after(() => closeAndClean(t))

async function todayFromPostgres() {
  const day = utcDay(Date.now())
  const range = [new Date(day.startMs), new Date(day.endMs)]
  const [totals] = await t.db.query<{ transfers: number; senders: number }>(
    `SELECT count(*)::int AS transfers, count(DISTINCT customer_id)::int AS senders
     FROM transfers WHERE created_at >= $1 AND created_at < $2`,
    range,
  )
  const volumes = await t.db.query<{ currency: string; volume: string }>(
    `SELECT currency, sum(amount)::text AS volume FROM transfers
     WHERE created_at >= $1 AND created_at < $2 GROUP BY currency ORDER BY currency`,
    range,
  )
  return {
    date: day.name,
    transfers: totals!.transfers,
    volume: Object.fromEntries(volumes.map((row) => [row.currency, Number(row.volume)])),
    distinctSenders: totals!.senders,
  }
}

/** GET /stats/today once per currency, folded into todayFromPostgres's shape. */
async function statsToday(cookie = customers[0]!.cookie) {
  const read = async (currency: string) => {
    const response = await fetch(`${url}/stats/today?currency=${currency}`, { headers: { cookie } })
    assert.equal(response.status, 200)
    const body = (await response.json()) as {
      date: string
      transfers: number
      currency: string
      volume: number
      distinctSenders: number
    }
    assert.equal(body.currency, currency)
    return body
  }
  const [usd, vnd] = [await read('USD'), await read('VND')]
  assert.deepEqual({ ...usd, volume: 0, currency: '' }, { ...vnd, volume: 0, currency: '' })
  return {
    date: vnd.date,
    transfers: vnd.transfers,
    volume: { USD: usd.volume, VND: vnd.volume },
    distinctSenders: vnd.distinctSenders,
  }
}

/** Transfers at once over HTTP from the first ten customers (the last two never send): VND, and USD from its holders. */
async function burst(count: number, seed: number): Promise<void> {
  const senders = customers.slice(0, 10)
  await Promise.all(
    Array.from({ length: count }, (_, i) => {
      const from = senders[(i * 7 + seed) % senders.length]!
      const usd = from.accountIds.length > 1 && i % 2 === 0
      const to = usd
        ? customers.find((c) => c !== from && c.accountIds.length > 1)!
        : customers[(customers.indexOf(from) + 1 + (i % 5)) % customers.length]!
      return transfer(url, {
        cookie: from.cookie,
        fromAccountId: from.accountIds[usd ? 1 : 0]!,
        toAccountId: to.accountIds[usd ? 1 : 0]!,
        amount: usd ? 1 + (i % 50) : 1000 + ((i * 131 + seed) % 9000),
        currency: usd ? 'USD' : 'VND',
      })
    }),
  )
}

test('after a burst of concurrent transfers, /stats/today equals Postgres: count, sum per currency, distinct senders', async () => {
  await burst(150, 0)
  await campaignsCaughtUp(t)
  const expected = await todayFromPostgres()
  assert.equal(expected.transfers, 150)
  assert.equal(expected.distinctSenders, 10)
  assert.deepEqual(Object.keys(expected.volume), ['USD', 'VND'])
  assert.deepEqual(await statsToday(), expected)
})

test('every event delivered twice, while more transfers run, counts once', async () => {
  await duplicateEveryEvent(t)
  await campaignsCaughtUp(t)
  assert.deepEqual(await statsToday(), await todayFromPostgres())
  await Promise.all([duplicateEveryEvent(t), burst(60, 5)])
  await campaignsCaughtUp(t)
  const expected = await todayFromPostgres()
  assert.equal(expected.transfers, 210)
  assert.deepEqual(await statsToday(customers[5]!.cookie), expected)
})

test("the day's shards are several keys, each with a TTL of at most two days", async () => {
  const keys = await scanKeys(t.redis, `${t.prefix}stats:`)
  const day = utcDay(Date.now()).name
  const shards = new Set(keys.map((key) => /\{[0-9-]+:([0-9]+)\}/.exec(key)?.[1]))
  assert.ok(shards.size > 1, `writes spread over ${shards.size} of ${STATS_SHARDS} shards`)
  for (const key of keys) {
    assert.ok(key.startsWith(`${t.prefix}stats:{${day}:`), key)
    const ttl = await t.redis.pttl(key)
    assert.ok(ttl > 0 && ttl <= STATS_TTL_MS, `${key}: ${ttl}`)
  }
  // Every kind of key of a shard is there: counts, distinct senders, counted ids.
  const kinds = new Set(keys.map((key) => key.slice(key.indexOf('}') + 1)))
  assert.deepEqual([...kinds].sort(), ['', ':distinct', ':ids'])
  // The counter reads back what the route showed.
  const { counts } = await dayCounter(t.redis, t.prefix, day).read()
  assert.equal(counts.transfers, (await todayFromPostgres()).transfers)
})

test('/stats/today needs a session', async () => {
  const response = await fetch(`${url}/stats/today`)
  assert.equal(response.status, 401)
  assert.equal(((await response.json()) as { type: string }).type, '/problems/unauthenticated')
})

test('a day with no transfers reads zeros', async () => {
  assert.deepEqual(await dayCounter(t.redis, t.prefix, '2000-01-01').read(), { counts: {}, distinct: 0 })
})

test('ShardedCounter: concurrent writers with repeated ids count each id once, spread over the shards', async () => {
  const counter = createShardedCounter(t.redis, {
    key: (s) => `${t.prefix}sc-a:{${s}}`,
    shards: 4,
    ttlMs: 60_000,
  })
  // 400 adds at once for 200 ids (each twice), 40 members.
  const adds = Array.from({ length: 400 }, (_, i) => {
    const n = i % 200
    return counter.add({ id: `e${n}`, member: `m${n % 40}`, counts: { hits: 1, amount: n } })
  })
  const counted = (await Promise.all(adds)).reduce((sum, n) => sum + n, 0)
  assert.equal(counted, 200)
  const totals = await counter.read()
  assert.deepEqual(totals.counts, { hits: 200, amount: (199 * 200) / 2 })
  assert.equal(totals.distinct, 40)
  for (let shard = 0; shard < 4; shard++) {
    const { counts, ids } = counter.keys(shard)
    assert.ok((await t.redis.exists(counts)) === 1, `shard ${shard} was written`)
    assert.ok((await t.redis.pttl(ids)) > 0)
  }
  // A member always lands on its own shard.
  assert.equal(counter.shardOf('m7'), counter.shardOf('m7'))
})

test('ShardedCounter: items without an id are all counted, on random shards; counts saturate at 2^53 - 1', async () => {
  const counter = createShardedCounter(t.redis, { key: (s) => `${t.prefix}sc-b:{${s}}`, shards: 8 })
  assert.equal(await counter.add(Array.from({ length: 100 }, () => ({ counts: { views: 1 } }))), 100)
  assert.equal((await counter.read()).counts.views, 100)
  const used = await Promise.all(Array.from({ length: 8 }, (_, s) => t.redis.exists(counter.keys(s).counts)))
  assert.ok(used.filter((n) => n === 1).length > 1)
  const max = Number.MAX_SAFE_INTEGER
  await counter.add([
    { id: 'big1', counts: { big: max - 1 } },
    { id: 'big1', counts: { big: max - 1 } },
    { id: 'big2', counts: { big: 1, small: -5 } },
  ])
  const read = await counter.read()
  assert.equal(read.counts.small, -5)
  assert.equal(read.counts.big, max)
  // Beyond 2^53 - 1: saturated by the script (one shard) or clamped by the read's sum (two shards).
  await counter.add({ id: 'big3', counts: { big: max } })
  assert.equal((await counter.read()).counts.big, max)
  await assert.rejects(counter.add({ counts: { views: 0.5 } }), TypeError)
  assert.throws(() => createShardedCounter(t.redis, { key: (s) => `x${s}`, shards: 0 }), {
    code: 'FRG_INVALID_OPTION',
  })
})
