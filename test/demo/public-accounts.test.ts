import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { type RedisServerProcess, startRedisServer } from '../../src/embedded/redis-server.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { scanKeys } from '../helpers/index.ts'
import { delta, scrape } from '../helpers/metrics-scrape.ts'

// The demo's public accounts over HTTP: a relief fund owned by `charity`, followed by alice; its
// movements reach her feed through the `feed` consumer group, masked; and the account filter that
// answers balance reads of ids no account has without the database. On a Redis of the test's own,
// so that it can be flushed.

let server: RedisServerProcess
let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let charity: TestCustomer
let fund: number
const cookies = new Map<string, string>()

before(async () => {
  server = await startRedisServer()
  t = await buildTestApp(
    { REDIS_URL: server.url, RATE_LIMITS: 'off', OUTBOX_RELAY_INTERVAL: '200ms' },
    { eventWorkers: 'on', accountFilter: 'on' },
  )
  alice = await createCustomer(t.db, 'alice', [1_000_000])
  bob = await createCustomer(t.db, 'bob', [1_000_000])
  charity = await createCustomer(t.db, 'charity', [0])
  fund = charity.accountIds[0]!
  await t.db.query("UPDATE accounts SET public_name = 'Flood Relief Fund' WHERE id = $1", [fund])
  // Inserted straight into Postgres, as the filter's catch-up would find them: told directly.
  await t.app.accountFilter.settled()
  await t.app.accountFilter.add([...alice.accountIds, ...bob.accountIds, fund])
  for (const customer of [alice, bob, charity]) cookies.set(customer.username, await login(t.app, customer))
})
after(async () => {
  await t.close()
  await server.stop()
})

const as = (customer: TestCustomer) => ({ cookie: cookies.get(customer.username)! })

async function transfer(from: TestCustomer, to: TestCustomer, amount: number): Promise<number> {
  const res = await t.app.inject({
    method: 'POST',
    url: '/transfers',
    headers: { ...as(from), 'idempotency-key': randomUUID() },
    payload: { fromAccountId: from.accountIds[0], toAccountId: to.accountIds[0], amount, currency: 'VND' },
  })
  assert.equal(res.statusCode, 201, res.body)
  return res.json().transferId
}

interface FeedItem {
  transferId: number
  accountId: number
  direction: string
  counterparty: string
  amount: number
}

async function feed(
  customer: TestCustomer,
  query = '',
): Promise<{ items: FeedItem[]; nextCursor: string | null }> {
  const res = await t.app.inject({ method: 'GET', url: `/feed${query}`, headers: as(customer) })
  assert.equal(res.statusCode, 200, res.body)
  return res.json()
}

async function until<T>(what: string, check: () => Promise<T | false>): Promise<T> {
  const deadline = Date.now() + 20_000
  for (;;) {
    const value = await check()
    if (value !== false) return value
    assert.ok(Date.now() < deadline, what)
    await sleep(50)
  }
}

const follow = (customer: TestCustomer, accountId: number, method: 'PUT' | 'DELETE' = 'PUT') =>
  t.app.inject({ method, url: `/public-accounts/${accountId}/follow`, headers: as(customer) })

test('public accounts are listed with whether you follow them; following is idempotent; only public accounts', async () => {
  const list = async () =>
    (await t.app.inject({ method: 'GET', url: '/public-accounts', headers: as(alice) })).json().publicAccounts
  assert.deepEqual(await list(), [
    { accountId: fund, name: 'Flood Relief Fund', currency: 'VND', following: false },
  ])
  assert.equal((await follow(alice, fund)).statusCode, 204)
  assert.equal((await follow(alice, fund)).statusCode, 204)
  assert.equal((await list())[0].following, true)
  const [row] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM follows')
  assert.equal(row!.n, 1)
  for (const id of [bob.accountIds[0]!, 999_999, 9_999_999_999]) {
    const res = await follow(alice, id)
    assert.equal(res.statusCode, 404, `${id}`)
    assert.equal(res.json().type, '/problems/account-not-found')
  }
  assert.equal((await t.app.inject({ method: 'GET', url: '/feed' })).statusCode, 401)
})

test("the fund's movements reach its follower's feed, newest first, masked; pages neither repeat nor skip", async () => {
  const made = [await transfer(bob, charity, 500), await transfer(alice, charity, 700)]
  const page = await until('both movements in the feed', async () => {
    const p = await feed(alice)
    return p.items.length >= 2 ? p : false
  })
  assert.deepEqual(
    page.items.map(({ transferId, accountId, direction, counterparty, amount }) => ({
      transferId,
      accountId,
      direction,
      counterparty,
      amount,
    })),
    [
      { transferId: made[1], accountId: fund, direction: 'in', counterparty: 'a***e', amount: 700 },
      { transferId: made[0], accountId: fund, direction: 'in', counterparty: 'b***b', amount: 500 },
    ],
  )
  assert.deepEqual((await feed(bob)).items, [], 'bob follows nothing')

  // Five more, then pages of two while a new one arrives between two pages.
  for (let i = 1; i <= 5; i++) made.push(await transfer(alice, charity, i))
  await until('seven in the feed', async () => ((await feed(alice)).items.length === 7 ? true : false))
  const seen: number[] = []
  let cursor: string | null = null
  let pages = 0
  do {
    const p = await feed(alice, `?limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`)
    seen.push(...p.items.map((item) => item.transferId))
    cursor = p.nextCursor
    if (++pages === 2) {
      const late = await transfer(bob, charity, 1)
      await until('the late one in the feed', async () => (await feed(alice)).items[0]?.transferId === late)
    }
  } while (cursor)
  assert.deepEqual(
    seen,
    [...made].reverse(),
    'every item once, newest first, the late one not in these pages',
  )
  const bad = await t.app.inject({ method: 'GET', url: '/feed?cursor=not-a-cursor', headers: as(alice) })
  assert.equal(bad.statusCode, 400, bad.body)
  assert.equal(bad.json().type, '/problems/invalid-cursor')
})

test('unfollowing hides the fund at once; following again shows its movements again', async () => {
  assert.equal((await follow(alice, fund, 'DELETE')).statusCode, 204)
  assert.deepEqual((await feed(alice)).items, [])
  assert.equal((await follow(alice, fund)).statusCode, 204)
  assert.ok((await feed(alice)).items.length >= 7)
})

test('Redis lost the feeds: the next read rebuilds them from Postgres, same items', async () => {
  const before = (await feed(alice, '?limit=100')).items.map((item) => item.transferId)
  await t.redis.flushall()
  cookies.set('alice', await login(t.app, alice))
  const rebuilt = (await feed(alice, '?limit=100')).items.map((item) => item.transferId)
  assert.deepEqual(rebuilt, before)
})

test('balance reads of ids no account has: no account row read and no key per id; existing ids still answer, also after Redis lost the filter', async () => {
  await t.app.accountFilter.settled()
  const cookie = await login(t.app, alice)
  cookies.set('alice', cookie)
  const read = (id: number) =>
    t.app.inject({ method: 'GET', url: `/accounts/${id}/balance`, headers: { cookie } })
  // Rebuilt after the flush above (the first read that found it gone asked for it).
  await read(alice.accountIds[0]!)
  await t.app.accountFilter.settled()
  const [max] = await t.db.query<{ id: number }>('SELECT max(id)::int AS id FROM accounts')
  const missing = Array.from({ length: 300 }, (_, i) => max!.id + 1 + i * 7919)
  // Statements that read accounts (the background workers' own statements are not counted); apart,
  // the filter's check of Postgres' newest id for ids above those its catch-up covered.
  let accountReads = 0
  let newestChecks = 0
  const stopObserving = t.db.observe!({
    query: ({ sql }) => {
      if (/max\(id\)/.test(sql)) newestChecks++
      else if (/FROM accounts/.test(sql)) accountReads++
    },
  })
  let notFound = 0
  for (const id of missing) if ((await read(id)).statusCode === 404) notFound++
  stopObserving()
  // The transaction history of such an id: 404 without the database as well.
  for (const id of missing.slice(0, 20))
    if (
      (await t.app.inject({ method: 'GET', url: `/accounts/${id}/transactions`, headers: { cookie } }))
        .statusCode === 404
    )
      notFound++
  assert.equal(notFound, 320)
  // A false positive (about 1 %) goes on to the database: a few queries at most.
  assert.ok(accountReads <= 10, `${accountReads} account reads`)
  // Above the newest account, each read (one after the other here) checks Postgres' newest id:
  // one index lookup, no row read, no key written.
  assert.ok(newestChecks >= 1, 'the newest id was checked')
  const perId = (await scanKeys(t.redis, t.prefix)).filter((key) => /account:[0-9]+/.test(key))
  assert.ok(perId.length <= 10, `${perId.length} cache keys for missing ids`)

  // No false negative: every existing account answers, also right after Redis lost the filter.
  await t.redis.flushall()
  const again = await login(t.app, alice)
  const res = await t.app.inject({
    method: 'GET',
    url: `/accounts/${alice.accountIds[0]}/balance`,
    headers: { cookie: again },
  })
  assert.equal(res.statusCode, 200)
  await t.app.accountFilter.settled()
  for (const id of [...alice.accountIds, ...bob.accountIds, fund])
    assert.equal(await t.app.accountFilter.mightExist(id), true, `account ${id}`)
})

test('a feed item that is not a movement of its account is dropped, and the page is filled from older ones', async () => {
  for (const customer of [alice, bob]) cookies.set(customer.username, await login(t.app, customer))
  assert.equal((await follow(alice, fund)).statusCode, 204)
  const newest = (await feed(alice, '?limit=1')).items[0]!
  // alice's private transfer to bob, as Redis could hold it after a database restore: the fund's.
  const secret = await transfer(alice, bob, 3)
  const forged = { id: `${secret}:${fund}`, producer: String(fund), at: Date.now() + 60_000 }
  const { feed: redisFeed } = t.app.publicAccounts
  await redisFeed.publish(forged)
  await until('the forged item in alice’s feed', async () =>
    (await t.redis.zscore(redisFeed.keys.reader(String(alice.customerId)).feed, `${forged.id} ${fund}`)) !==
    null
      ? true
      : false,
  )
  const page = await feed(alice, '?limit=1')
  assert.deepEqual(
    page.items.map((item) => item.transferId),
    [newest.transferId],
  )
  assert.notEqual(page.nextCursor, null)
  await redisFeed.remove(forged)
})

test("a customer whose id is a public account's id sees none of its movements unless following it", async () => {
  const people = [alice, bob, charity]
  const [pair] = people.flatMap((reader) =>
    people.flatMap((owner) =>
      owner.accountIds
        .filter((id) => id === reader.customerId && id !== fund)
        .map((account) => ({ reader, owner, account })),
    ),
  )
  assert.ok(pair, 'a customer id that is also an account id')
  const { reader, owner, account } = pair
  for (const customer of people) cookies.set(customer.username, await login(t.app, customer))
  await t.db.query("UPDATE accounts SET public_name = 'Mirror' WHERE id = $1", [account])
  try {
    const other = owner === alice ? bob : alice
    const res = await t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { ...as(owner), 'idempotency-key': randomUUID() },
      payload: { fromAccountId: account, toAccountId: other.accountIds[0], amount: 1, currency: 'VND' },
    })
    assert.equal(res.statusCode, 201, res.body)
    const transferId = res.json().transferId as number
    const { feed: redisFeed } = t.app.publicAccounts
    await until('the movement published', async () =>
      (await t.redis.zscore(
        redisFeed.keys.producer(String(account)).timeline,
        `${transferId}:${account}`,
      )) !== null
        ? true
        : false,
    )
    const shown = (await feed(reader, '?limit=100')).items.map((item) => item.transferId)
    assert.ok(!shown.includes(transferId), `customer ${reader.customerId} sees account ${account}`)
  } finally {
    await t.db.query('UPDATE accounts SET public_name = NULL WHERE id = $1', [account])
  }
})

test("a movement of the pushed fund: its fan-out's lag is observed once", async () => {
  for (const customer of [alice, bob]) cookies.set(customer.username, await login(t.app, customer))
  assert.equal((await follow(alice, fund)).statusCode, 204)
  const { feed: redisFeed } = t.app.publicAccounts
  // The earlier tests' events published and their fan-out jobs done (each acknowledged after it).
  const feedGroupIdle = async () => {
    const groups = (await t.redis.xinfo('GROUPS', t.app.events.stream)) as unknown[][]
    const fields = groups
      .map((info) => new Map(info.flatMap((value, i) => (i % 2 ? [] : [[String(value), info[i + 1]]]))))
      .find((group) => group.get('name') === 'feed')!
    // `lag` is reported from Redis 7; before, pending alone.
    return fields.get('pending') === 0 && (fields.get('lag') ?? 0) === 0
  }
  await until(
    'no event or fan-out job left',
    async () => (await feedGroupIdle()) && (await redisFeed.fanoutLag()).entries === 0,
  )
  const before = await scrape(t.app)
  await transfer(bob, charity, 2)
  const moved = await until('the fan-out observed', async () => {
    const m = delta(before, await scrape(t.app))
    return m('feed_fanout_lag_seconds_count') >= 1 ? m : false
  })
  assert.equal(moved('feed_fanout_lag_seconds_count'), 1)
  assert.equal(moved('feed_fanout_lag_seconds_bucket', { le: '+Inf' }), 1)
  assert.ok(moved('feed_fanout_lag_seconds_sum') >= 0)
})
