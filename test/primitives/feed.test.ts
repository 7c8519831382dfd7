import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import {
  createFeed,
  type FanoutWorker,
  type FanoutWorkerOptions,
  type Feed,
  FeedFollowLimitError,
  type FeedItem,
  type FeedOptions,
  type FeedSource,
  FeedSourceError,
  InvalidArgumentError,
  InvalidOptionError,
  RedisClientError,
  UnknownOptionError,
} from '../../src/index.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import { isCluster } from '../../src/redis/client.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../helpers/index.ts'

// The feed on the Redis the suites use: a single node, or the Redis Cluster under `npm run
// test:cluster` (readers' and producers' keys in many slots: any multi-slot command fails there).
// An in-memory source stands for the application's database.

const redis = createRedisClient({ ...testRedisConnection(), commandTimeoutMs: 10_000 })
const prefixes: string[] = []
const workers: FanoutWorker[] = []
before(() => connectRedis(redis))
after(async () => {
  for (const worker of workers) await worker.stop()
  for (const prefix of prefixes) await deleteKeys(prefix)
  redis.disconnect()
})

/** Every key under `prefix`, one DEL each (on a Cluster they live in many slots). */
async function deleteKeys(prefix: string): Promise<number> {
  const keys = await scanKeys(redis, prefix)
  await Promise.all(keys.map((key) => redis.del(key)))
  return keys.length
}

const newestFirst = (a: FeedItem, b: FeedItem) => b.at - a.at || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0)

/** The application's database: the follow graph and the items, the truth a feed is rebuilt from. */
class MemorySource implements FeedSource {
  readonly follows = new Map<string, Set<string>>()
  readonly items = new Map<string, FeedItem>()
  /** Followers outside the test's graph (a celebrity's audience). */
  readonly extraFollowers = new Map<string, number>()
  readonly calls = { followingOf: 0, followerCountsOf: 0, itemsOf: 0 }

  async followingOf(reader: string) {
    this.calls.followingOf++
    return [...(this.follows.get(reader) ?? [])]
  }

  async followerCountsOf(producers: readonly string[]) {
    this.calls.followerCountsOf++
    return producers.map((producer) => {
      let n = this.extraFollowers.get(producer) ?? 0
      for (const following of this.follows.values()) if (following.has(producer)) n++
      return n
    })
  }

  async itemsOf(producers: readonly string[], { limit }: { limit: number }) {
    this.calls.itemsOf++
    const wanted = new Set(producers)
    return [...this.items.values()]
      .filter((item) => wanted.has(item.producer))
      .sort(newestFirst)
      .slice(0, limit)
  }

  /** What `reader`'s feed must show: the items of the producers it follows and its own, newest first. */
  expected(reader: string): FeedItem[] {
    const following = this.follows.get(reader) ?? new Set()
    return [...this.items.values()]
      .filter((item) => item.producer === reader || following.has(item.producer))
      .sort(newestFirst)
  }
}

let sequence = 0
const base = Date.now()

/** The application: every change goes to its database first, then to each feed. */
class App {
  constructor(
    readonly source: MemorySource,
    readonly feeds: Feed[],
  ) {}

  async follow(reader: string, producer: string) {
    const following = this.source.follows.get(reader) ?? new Set()
    following.add(producer)
    this.source.follows.set(reader, following)
    for (const feed of this.feeds) await feed.follow(reader, producer)
  }

  async unfollow(reader: string, producer: string) {
    this.source.follows.get(reader)?.delete(producer)
    for (const feed of this.feeds) await feed.unfollow(reader, producer)
  }

  /** A new item; every third one shares its `at` with the one before (ties order by id). */
  async post(producer: string): Promise<FeedItem> {
    sequence++
    const item = {
      id: `i${String(sequence).padStart(6, '0')}`,
      producer,
      at: base + Math.floor(sequence / 3) * 10,
    }
    this.source.items.set(item.id, item)
    for (const feed of this.feeds) await feed.publish(item)
    return item
  }

  async remove(item: FeedItem) {
    this.source.items.delete(item.id)
    for (const feed of this.feeds) await feed.remove(item)
  }
}

function newFeed(source: FeedSource, options: Partial<FeedOptions> = {}): Feed {
  const keyPrefix = uniquePrefix('feed')
  prefixes.push(keyPrefix)
  return createFeed(redis, { source, keyPrefix, ...options })
}

async function startWorker(feed: Feed, options: Partial<FanoutWorkerOptions> = {}) {
  const worker = feed.createFanoutWorker({ consumer: `w${workers.length}`, blockMs: 100, ...options })
  workers.push(worker)
  await worker.start()
  return worker
}

async function until(check: () => Promise<boolean> | boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/** Waits until the fan-out worker has done every job. */
const drained = (feed: Feed) => until(async () => (await feed.fanoutLag()).entries === 0, 'the fan-out')

/** Every page of `reader`'s feed, in order. */
async function readAll(feed: Feed, reader: string, limit: number): Promise<FeedItem[]> {
  const items: FeedItem[] = []
  let cursor: string | null = null
  for (let pages = 0; pages < 1000; pages++) {
    const page = await feed.read(reader, { limit, cursor })
    assert.ok(page.items.length <= limit)
    items.push(...page.items)
    if (!page.cursor) return items
    cursor = page.cursor
  }
  return assert.fail('no end of pages')
}

const ids = (items: FeedItem[]) => items.map((item) => item.id)

test('push and pull give the same feed for the same history', async () => {
  const source = new MemorySource()
  const push = newFeed(source, { pushMaxFollowers: Number.MAX_SAFE_INTEGER })
  const pull = newFeed(source, { pushMaxFollowers: 0 })
  const app = new App(source, [push, pull])
  const pushWorker = await startWorker(push)
  const pullWorker = await startWorker(pull)
  const producers = ['p1', 'p2', 'p3', 'p4']
  const readers = ['ann', 'bob', 'cid', 'dan']
  await app.follow('ann', 'p1')
  await app.follow('ann', 'p2')
  await app.follow('ann', 'bob')
  await app.follow('bob', 'p2')
  await app.follow('bob', 'p3')
  await app.follow('cid', 'p1')
  await app.follow('cid', 'p3')
  await app.follow('cid', 'p4')
  await app.follow('cid', 'ann')
  // Ann and Bob read before anything is published (their feeds are built and fan-out reaches
  // them); Cid and Dan only at the end (their feeds are built by pull then).
  for (const feed of [push, pull]) for (const reader of ['ann', 'bob']) await feed.read(reader)

  const posted: FeedItem[] = []
  const authors = [...producers, ...readers]
  for (let i = 0; i < 24; i++) posted.push(await app.post(authors[i % authors.length]!))
  await app.follow('bob', 'p1') // p1's earlier items join Bob's feed
  await app.unfollow('ann', 'p2')
  await app.remove(posted.find((item) => item.producer === 'p3')!)
  await app.remove(posted.find((item) => item.producer === 'p1')!)
  for (let i = 0; i < 16; i++) posted.push(await app.post(authors[(i * 3) % authors.length]!))
  await drained(push)
  await drained(pull)

  for (const reader of readers) {
    const expected = ids(source.expected(reader))
    assert.ok(reader === 'dan' || expected.length > 5, reader)
    assert.deepEqual(ids(await readAll(push, reader, 4)), expected, `${reader} by push`)
    assert.deepEqual(ids(await readAll(pull, reader, 4)), expected, `${reader} by pull`)
  }
  assert.ok(pushWorker.stats().writes > 0)
  assert.equal(pullWorker.stats().writes, 0, 'nothing is fanned out when every producer is pulled')
  // By pull, a reader's feed holds its placeholder only: the items come from the timelines.
  assert.equal(await redis.zcard(pull.keys.reader('cid').feed), 1)
  assert.ok((await redis.zcard(push.keys.reader('cid').feed)) > 5)
})

test('every item once, newest first, over pages while new items are published between page reads', async () => {
  const source = new MemorySource()
  source.extraFollowers.set('star1', 50)
  source.extraFollowers.set('star2', 50)
  const feed = newFeed(source, { pushMaxFollowers: 10 })
  const app = new App(source, [feed])
  await startWorker(feed)
  for (const producer of ['a', 'b', 'c', 'star1', 'star2']) await app.follow('reader', producer)
  await feed.read('reader')
  const authors = ['a', 'b', 'c', 'star1', 'star2', 'reader', 'stranger']
  for (let i = 0; i < 60; i++) await app.post(authors[(i * 5) % authors.length]!)
  await drained(feed)
  // The pulled producers are read from their timelines, the others come from the feed.
  assert.deepEqual((await redis.smembers(feed.keys.reader('reader').pulled)).sort(), ['star1', 'star2'])
  assert.ok((await redis.zcard(feed.keys.reader('reader').feed)) > 20)

  const initial = ids(source.expected('reader'))
  const seen: string[] = []
  const fresh: string[] = []
  let cursor: string | null = null
  do {
    const page = await feed.read('reader', { limit: 7, cursor })
    seen.push(...ids(page.items))
    cursor = page.cursor
    // Newer than any cursor: they never shift the pages still to come.
    for (const producer of ['a', 'star1', 'reader']) fresh.push((await app.post(producer)).id)
  } while (cursor)
  assert.deepEqual(seen, initial)
  assert.equal(new Set(seen).size, seen.length)

  await drained(feed)
  const top = await feed.read('reader', { limit: fresh.length })
  assert.deepEqual(ids(top.items).sort(), [...fresh].sort())
})

test('an unfollowed producer and a removed item disappear at read, pushed or pulled', async () => {
  const source = new MemorySource()
  source.extraFollowers.set('star', 100)
  const feed = newFeed(source, { pushMaxFollowers: 10 })
  const app = new App(source, [feed])
  await startWorker(feed)
  for (const producer of ['a', 'b', 'star']) await app.follow('reader', producer)
  await feed.read('reader')
  const items: FeedItem[] = []
  for (let i = 0; i < 12; i++) items.push(await app.post(['a', 'b', 'star'][i % 3]!))
  await drained(feed)
  const keys = feed.keys.reader('reader')
  assert.ok((await redis.zrange(keys.feed, '0', '-1')).some((member) => member.endsWith(' b')))

  await app.unfollow('reader', 'b')
  const fromA = items.find((item) => item.producer === 'a')!
  const fromStar = items.find((item) => item.producer === 'star')!
  await app.remove(fromA)
  await app.remove(fromStar)
  const shown = await readAll(feed, 'reader', 5)
  assert.deepEqual(ids(shown), ids(source.expected('reader')))
  assert.ok(!shown.some((item) => item.producer === 'b' || item.id === fromA.id || item.id === fromStar.id))
  assert.equal(shown.length, 6)
  // What a read found unfollowed or removed is gone from the reader's feed, nowhere else.
  const members = await redis.zrange(keys.feed, '0', '-1')
  assert.ok(!members.some((member) => member.endsWith(' b') || member.startsWith(`${fromA.id} `)))
  assert.equal(await redis.zscore(feed.keys.producer('star').timeline, fromStar.id), null)
  const deleted = feed.keys.producer('a').deleted
  assert.notEqual(await redis.zscore(deleted, fromA.id), null)
  assert.ok((await redis.pttl(deleted)) > 0, 'the deleted set expires')

  // Following again brings the producer's recent items back.
  await app.follow('reader', 'b')
  assert.deepEqual(ids(await readAll(feed, 'reader', 5)), ids(source.expected('reader')))
})

test('read-your-writes: the producer sees its item at once, followers after the fan-out; the lag tells', async () => {
  const source = new MemorySource()
  const feed = newFeed(source)
  const app = new App(source, [feed])
  await app.follow('follower', 'writer')
  await feed.read('writer')
  await feed.read('follower')
  assert.deepEqual(await feed.fanoutLag(), { entries: 0, pending: 0, oldestAgeMs: 0 })

  const item = await app.post('writer')
  assert.deepEqual((await feed.read('writer')).items, [item])
  assert.deepEqual((await feed.read('follower')).items, [], 'not fanned out yet: no worker runs')
  const lag = await feed.fanoutLag()
  assert.equal(lag.entries, 1)
  assert.equal(lag.pending, 0)
  // The age of the one entry waiting, from its stream id.
  const [entry] = await redis.xrange(feed.keys.fanout, '-', '+')
  assert.ok(lag.oldestAgeMs >= 0 && lag.oldestAgeMs <= Date.now() - Number(entry![0].split('-')[0]))

  const done: unknown[] = []
  const worker = await startWorker(feed, { onJobDone: (job) => void done.push(job) })
  await drained(feed)
  assert.deepEqual((await feed.read('follower')).items, [item])
  assert.deepEqual(await feed.fanoutLag(), { entries: 0, pending: 0, oldestAgeMs: 0 })
  assert.deepEqual(worker.stats(), { jobs: 1, writes: 1, skipped: 0, largestFanout: 1 })
  // Told as the job ended, before it was acknowledged.
  assert.deepEqual(done, [{ item, writes: 1, skipped: 0 }])
})

test('an inactive follower is skipped by fan-out and rebuilt by pull when it returns', async () => {
  const source = new MemorySource()
  const activeWindowMs = 7 * 86_400_000
  const feed = newFeed(source, { activeWindowMs })
  const app = new App(source, [feed])
  const worker = await startWorker(feed)
  await app.follow('active', 'p')
  await app.follow('away', 'p')
  await feed.read('active')
  await feed.read('away')
  const followers = feed.keys.producer('p').followers
  assert.notEqual(await redis.zscore(followers, 'away'), null)

  // 'away' was last active before the window and its keys expired.
  await redis.zadd(followers, String(Date.now() - activeWindowMs - 60_000), 'away')
  for (const key of Object.values(feed.keys.reader('away'))) await redis.del(key)
  const items = [await app.post('p'), await app.post('p'), await app.post('p')]
  await drained(feed)
  assert.equal(worker.stats().writes, 3, "fan-out wrote to 'active' only")
  assert.equal(worker.stats().skipped, 0)
  assert.equal(await redis.exists(feed.keys.reader('away').feed), 0, 'fan-out never creates a feed')
  assert.equal(await redis.zscore(followers, 'away'), null, 'inactive followers leave the followers set')

  const builds = source.calls.followingOf
  assert.deepEqual(ids((await feed.read('away')).items), ids([...items].reverse()))
  assert.equal(source.calls.followingOf, builds + 1, 'rebuilt by pull')
  assert.ok(Number(await redis.zscore(followers, 'away')) >= Date.now() - activeWindowMs, 'active again')

  const next = await app.post('p')
  await drained(feed)
  assert.notEqual(
    await redis.zscore(feed.keys.reader('away').feed, `${next.id} p`),
    null,
    'fanned out to again',
  )
  assert.equal((await feed.read('away')).items[0]?.id, next.id)
  assert.equal(source.calls.followingOf, builds + 1)
})

test('a producer crossing pushMaxFollowers goes pulled, and back, and no follower misses an item', async () => {
  const source = new MemorySource()
  const markActiveEveryMs = 600_000
  const feed = newFeed(source, { pushMaxFollowers: 3, markActiveEveryMs })
  const app = new App(source, [feed])
  await startWorker(feed)
  const readers = ['r1', 'r2', 'r3', 'r4']
  for (const reader of readers) await feed.read(reader)
  for (const reader of readers.slice(0, 3)) await app.follow(reader, 'p')
  const meta = feed.keys.producer('p').meta
  assert.equal(await redis.hget(meta, 'pulledAt'), null, '3 followers: pushed')
  await app.follow('r4', 'p')
  assert.notEqual(await redis.hget(meta, 'pulledAt'), null, '4 followers: pulled')
  // Within the grace (one mark interval) it is still fanned out: r1..r3 learn it is pulled at their
  // next activity mark only. r4 followed it pulled and reads it by pull at once.
  const posted = [await app.post('p')]
  assert.equal(await redis.xlen(feed.keys.fanout), 1)
  assert.deepEqual(await redis.smembers(feed.keys.reader('r4').pulled), ['p'])

  /** Moves the clock of the mode and of every reader's activity mark past one mark interval. */
  const later = async (field: string) => {
    const past = String(Date.now() - markActiveEveryMs - 1)
    await redis.hset(meta, field, past)
    for (const reader of readers) await redis.hset(feed.keys.reader(reader).meta, 'mark', past)
  }
  await later('pulledAt')
  posted.push(await app.post('p'))
  assert.equal(await redis.xlen(feed.keys.fanout), 1, 'past the grace: not fanned out')
  assert.equal(await redis.exists(feed.keys.producer('p').followers), 0, 'its followers set is dropped')
  await drained(feed)
  for (const reader of readers)
    assert.deepEqual(ids((await feed.read(reader)).items), ids([...posted].reverse()))
  assert.deepEqual(await redis.smembers(feed.keys.reader('r1').pulled), ['p'], 'learnt at the mark')

  // Under 90 % of the threshold it is pushed again; readers still read its timeline for a window.
  await app.unfollow('r3', 'p')
  await app.unfollow('r4', 'p')
  assert.equal(await redis.hget(meta, 'pulledAt'), null)
  posted.push(await app.post('p'))
  await drained(feed)
  for (const reader of ['r1', 'r2'])
    assert.deepEqual(ids((await feed.read(reader)).items), ids([...posted].reverse()))
  assert.deepEqual((await feed.read('r3')).items, [])
  await later('pushedAt')
  await feed.read('r1') // its mark puts it back in the followers set
  posted.push(await app.post('p'))
  await drained(feed)
  assert.notEqual(
    await redis.zscore(feed.keys.reader('r1').feed, `${posted.at(-1)!.id} p`),
    null,
    'fanned out',
  )
  for (const reader of ['r1', 'r2'])
    assert.deepEqual(ids((await feed.read(reader)).items), ids([...posted].reverse()))
})

test('after Redis lost every key of the feed, reads rebuild from the source and fan-out resumes', async () => {
  const source = new MemorySource()
  source.extraFollowers.set('star', 1000)
  const feed = newFeed(source, { pushMaxFollowers: 100 })
  const app = new App(source, [feed])
  await startWorker(feed)
  const readers = ['r1', 'r2', 'r3']
  for (const reader of readers) {
    await app.follow(reader, 'star')
    await app.follow(reader, 'p1')
  }
  await app.follow('r1', 'p2')
  await app.follow('r2', 'r1')
  for (const reader of readers) await feed.read(reader)
  const authors = ['star', 'p1', 'p2', 'r1', 'r3']
  for (let i = 0; i < 25; i++) await app.post(authors[i % authors.length]!)
  await drained(feed)
  const before = new Map<string, string[]>()
  for (const reader of readers) {
    before.set(reader, ids(await readAll(feed, reader, 6)))
    assert.deepEqual(before.get(reader), ids(source.expected(reader)))
  }

  const prefix = prefixes.at(-1)!
  assert.ok((await deleteKeys(prefix)) > 10)
  assert.deepEqual(await scanKeys(redis, prefix), [])
  for (const reader of readers)
    assert.deepEqual(ids(await readAll(feed, reader, 6)), before.get(reader), reader)
  // The follower counts came back from the source: the star is pulled again, p1 pushed.
  assert.equal(await redis.hget(feed.keys.producer('star').meta, 'n'), '1003')
  assert.deepEqual(await redis.smembers(feed.keys.reader('r2').pulled), ['star'])

  const fresh = [await app.post('p1'), await app.post('star'), await app.post('r1')]
  await drained(feed)
  for (const reader of readers) {
    assert.deepEqual(ids(await readAll(feed, reader, 6)), ids(source.expected(reader)), reader)
    assert.ok(ids((await feed.read(reader)).items).includes(fresh[1]!.id))
  }
  // The new pushed item reached the rebuilt feeds by fan-out (the graph came back with the rebuilds).
  assert.notEqual(await redis.zscore(feed.keys.reader('r3').feed, `${fresh[0]!.id} p1`), null)
})

test('fan-out in batches and pages reaches every active follower once', async () => {
  const source = new MemorySource()
  const activeWindowMs = 7 * 86_400_000
  const feed = newFeed(source, { activeWindowMs })
  const app = new App(source, [feed])
  const followers = Array.from({ length: 90 }, (_, i) => `f${i}`)
  for (const follower of followers) await app.follow(follower, 'hub')
  for (const follower of followers) await feed.read(follower)
  const inactive = followers.slice(0, 15)
  for (const follower of inactive) {
    await redis.zadd(
      feed.keys.producer('hub').followers,
      String(Date.now() - activeWindowMs - 60_000),
      follower,
    )
    for (const key of Object.values(feed.keys.reader(follower))) await redis.del(key)
  }
  const items: FeedItem[] = []
  for (let i = 0; i < 6; i++) items.push(await app.post('hub'))
  assert.equal((await feed.fanoutLag()).entries, 6)

  const worker = await startWorker(feed, { batch: 4, pageSize: 16 })
  await drained(feed)
  const active = followers.length - inactive.length
  assert.deepEqual(worker.stats(), { jobs: 6, writes: 6 * active, skipped: 0, largestFanout: active })
  const members = items.map((item) => `${item.id} hub`)
  for (const follower of followers.slice(inactive.length)) {
    const scores = await redis.zmscore(feed.keys.reader(follower).feed, ...members)
    assert.ok(
      scores.every((score) => score !== null),
      follower,
    )
  }
  for (const follower of inactive) assert.equal(await redis.exists(feed.keys.reader(follower).feed), 0)
  assert.deepEqual(ids((await feed.read('f50')).items), ids([...items].reverse()))
  // The snapshots of the jobs are gone.
  const prefix = prefixes.at(-1)!
  assert.deepEqual(
    (await scanKeys(redis, prefix)).filter((key) => key.includes(':fanout:')),
    [],
  )
  if (isCluster(redis)) {
    // One slot per reader: the feeds are spread over every master.
    const perMaster = await Promise.all(
      redis.nodes('master').map(async (node) => (await scanKeys(node, prefix)).length),
    )
    assert.ok(
      perMaster.every((n) => n > 0),
      String(perMaster),
    )
  }
})

test('a feed caps what it keeps and expires with its reader', async () => {
  const source = new MemorySource()
  const feed = newFeed(source, {
    feedMaxItems: 5,
    timelineMaxItems: 4,
    feedTtlMs: 3_600_000,
    markActiveEveryMs: 600_000,
  })
  const app = new App(source, [feed])
  await startWorker(feed)
  await app.follow('reader', 'p')
  await feed.read('reader')
  for (let i = 0; i < 9; i++) await app.post('p')
  await drained(feed)
  const keys = feed.keys.reader('reader')
  assert.equal(await redis.zcard(keys.feed), 5)
  assert.equal(await redis.zcard(feed.keys.producer('p').timeline), 4)
  for (const key of [keys.feed, keys.following, keys.meta]) {
    const ttl = await redis.pttl(key)
    assert.ok(ttl > 0 && ttl <= 3_600_000, `${key}: ${ttl}`)
  }
  assert.ok((await redis.pttl(feed.keys.producer('p').timeline)) > 0)
  assert.equal((await feed.read('reader', { limit: 100 })).items.length, 5)
})

test('options, arguments and what the source answers are checked, with coded errors', async () => {
  const source = new MemorySource()
  const options = { source, keyPrefix: uniquePrefix('feed') }
  prefixes.push(options.keyPrefix)
  assert.throws(
    () => createFeed(redis, { ...options, pushMaxFolowers: 1 } as FeedOptions),
    (err: UnknownOptionError) =>
      err instanceof UnknownOptionError && /Did you mean `pushMaxFollowers`/.test(err.message),
  )
  const invalid = (bad: Partial<FeedOptions>) =>
    assert.throws(
      () => createFeed(redis, { ...options, ...bad } as FeedOptions),
      (err: InvalidOptionError) => err instanceof InvalidOptionError && err.code === 'FRG_INVALID_OPTION',
      JSON.stringify(bad),
    )
  invalid({ feedTtlMs: 31 * 86_400_000 })
  invalid({ keyPrefix: 'x{y}' })
  invalid({ feedMaxItems: 0 })
  invalid({ pushMaxFollowers: -1 })
  invalid({ markActiveEveryMs: 30 * 86_400_000 })
  invalid({ source: { followingOf: source.followingOf } as unknown as FeedSource })
  assert.throws(() => createFeed('redis://x' as never, options), RedisClientError)

  const feed = createFeed(redis, { ...options, maxFollowing: 2 })
  const argument = (err: InvalidArgumentError) =>
    err instanceof InvalidArgumentError && err.code === 'FRG_INVALID_ARGUMENT'
  await assert.rejects(feed.read('has space'), argument)
  await assert.rejects(feed.read('{tag}'), argument)
  await assert.rejects(feed.read('x'.repeat(65)), argument)
  await assert.rejects(feed.read('ok', { limit: 101 }), argument)
  await assert.rejects(feed.read('ok', { cursor: 'not-a-cursor' }), argument)
  await assert.rejects(feed.read('ok', { cursor: Buffer.from('[1,"a b"]').toString('base64url') }), argument)
  await assert.rejects(feed.publish({ id: 'i1', producer: 'p', at: -1 }), argument)
  await assert.rejects(feed.publish({ id: 'i1', producer: 'p', at: 1.5 }), argument)
  await assert.rejects(
    feed.publish({ id: 'i1', producer: 'p', at: 1, text: 'hi' } as FeedItem),
    UnknownOptionError,
  )
  await assert.rejects(feed.read('ok', { limt: 5 } as never), UnknownOptionError)
  assert.throws(() => feed.createFanoutWorker({ consumer: '' }), InvalidOptionError)
  assert.throws(
    () => feed.createFanoutWorker({ consumer: 'w', onJobDone: 'log' as never }),
    InvalidOptionError,
  )

  const app = new App(source, [feed])
  await app.follow('ok', 'p1')
  await feed.read('ok')
  await app.follow('ok', 'p2')
  await assert.rejects(app.follow('ok', 'p3'), (err: FeedFollowLimitError) => {
    assert.ok(err instanceof FeedFollowLimitError)
    assert.equal(err.code, 'FRG_FEED_FOLLOW_LIMIT')
    return true
  })

  const badFeed = newFeed({
    followingOf: async () => ['fine', 'not fine'],
    followerCountsOf: (producers) => source.followerCountsOf(producers),
    itemsOf: (producers, limit) => source.itemsOf(producers, limit),
  })
  await assert.rejects(badFeed.read('someone'), (err: FeedSourceError) => {
    assert.ok(err instanceof FeedSourceError)
    assert.equal(err.code, 'FRG_FEED_SOURCE_INVALID')
    return true
  })
})

test('a follow or an unfollow that lands while the feed is being rebuilt is kept', async () => {
  const source = new MemorySource()
  // The rebuild's followingOf answers what the database held when it was asked, and is held back
  // until the follow and the unfollow are done.
  let release!: () => void
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  let hold = false
  const followingOf = source.followingOf.bind(source)
  source.followingOf = async (reader) => {
    const answer = await followingOf(reader)
    if (hold) await held
    return answer
  }
  const feed = newFeed(source)
  const app = new App(source, [feed])
  await startWorker(feed)
  await app.follow('ann', 'old')
  const posts = [await app.post('new'), await app.post('old')]
  hold = true
  const reading = feed.read('ann')
  await until(async () => (await redis.exists(feed.keys.reader('ann').feed)) === 1, 'the rebuild')
  await app.follow('ann', 'new')
  await app.unfollow('ann', 'old')
  release()
  await reading
  hold = false
  assert.deepEqual(await redis.smembers(feed.keys.reader('ann').following), ['new'])
  assert.deepEqual(ids((await feed.read('ann')).items), [posts[0]!.id])
  const later = await app.post('new')
  await drained(feed)
  assert.deepEqual(ids((await feed.read('ann')).items), [later.id, posts[0]!.id])
})

test('a follow or unfollow retried before the first read counts once', async () => {
  const source = new MemorySource()
  const feed = newFeed(source, { pushMaxFollowers: 5 })
  const app = new App(source, [feed])
  await startWorker(feed)
  for (let i = 0; i < 12; i++) await app.follow('ann', 'p')
  await app.follow('bob', 'p')
  for (let i = 0; i < 3; i++) await app.unfollow('bob', 'p')
  const post = await app.post('p')
  const meta = feed.keys.producer('p').meta
  assert.equal(await redis.hget(meta, 'n'), '1')
  assert.equal(await redis.hget(meta, 'pulledAt'), null, 'pushed')
  await drained(feed)
  assert.deepEqual(ids((await feed.read('ann')).items), [post.id])
  // Built now: retries count once as well.
  for (let i = 0; i < 12; i++) await app.follow('ann', 'q')
  await app.post('q')
  assert.equal(await redis.hget(feed.keys.producer('q').meta, 'n'), '1')
})

test('a feed rebuilt while a producer is pushed again keeps what it published while pulled', async () => {
  const source = new MemorySource()
  const markActiveEveryMs = 600_000
  const feed = newFeed(source, { pushMaxFollowers: 2, markActiveEveryMs })
  const app = new App(source, [feed])
  await startWorker(feed)
  const readers = ['r1', 'r2', 'r3']
  for (const reader of readers) await feed.read(reader)
  for (const reader of readers) await app.follow(reader, 'p')
  const meta = feed.keys.producer('p').meta
  assert.notEqual(await redis.hget(meta, 'pulledAt'), null, '3 followers: pulled')
  const past = () => String(Date.now() - 2 * markActiveEveryMs)
  await redis.hset(meta, 'pulledAt', past())
  const whilePulled = await app.post('p')
  await app.unfollow('r2', 'p')
  await app.unfollow('r3', 'p')
  assert.notEqual(await redis.hget(meta, 'pushedAt'), null, 'pushed again, read by pull for a while')
  // r1's feed is lost and rebuilt now, while p is still read by pull.
  await redis.del(feed.keys.reader('r1').feed)
  assert.deepEqual(ids((await feed.read('r1')).items), [whilePulled.id])
  // The window ends: r1 reads p from its feed alone.
  await redis.hset(meta, 'pushedAt', '1')
  await redis.hset(feed.keys.reader('r1').meta, 'mark', past())
  assert.deepEqual(ids((await feed.read('r1')).items), [whilePulled.id])
  assert.deepEqual(await redis.smembers(feed.keys.reader('r1').pulled), [])
})

test("when a producer's keys alone are lost, feeds that survived still show its next items and hide its removed ones", async () => {
  const source = new MemorySource()
  const feed = newFeed(source)
  const app = new App(source, [feed])
  await startWorker(feed)
  await app.follow('ann', 'p')
  await app.follow('bob', 'p')
  for (const reader of ['ann', 'bob']) await feed.read(reader)
  const first = await app.post('p')
  const second = await app.post('p')
  await drained(feed)
  assert.deepEqual(ids((await feed.read('ann')).items), [second.id, first.id])
  const dropProducer = async () => {
    const keys = feed.keys.producer('p')
    await redis.del(keys.timeline, keys.meta, keys.followers, keys.deleted)
  }
  // Lost, then a publish: its fan-out finds no follower.
  await dropProducer()
  const third = await app.post('p')
  await drained(feed)
  for (const reader of ['ann', 'bob'])
    assert.deepEqual(ids((await feed.read(reader)).items), [third.id, second.id, first.id], reader)
  // A removal, then lost: its deleted set went with it.
  await app.remove(second)
  await dropProducer()
  for (const reader of ['ann', 'bob'])
    assert.deepEqual(ids((await feed.read(reader)).items), [third.id, first.id], reader)
  const fourth = await app.post('p')
  await drained(feed)
  assert.deepEqual(ids((await feed.read('ann')).items), [fourth.id, third.id, first.id])
})

test('with ownItems false, a reader whose id is a producer id sees none of its items unless it follows it', async () => {
  const source = new MemorySource()
  const feed = newFeed(source, { ownItems: false })
  const app = new App(source, [feed])
  await startWorker(feed)
  await app.follow('7', '8')
  const mine = await app.post('7')
  const followed = await app.post('8')
  await drained(feed)
  assert.deepEqual(await feed.read('7', { limit: 1 }), { items: [followed], cursor: null })
  await app.follow('7', '7')
  assert.deepEqual(ids((await feed.read('7')).items), [followed.id, mine.id])
})
