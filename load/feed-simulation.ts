// The feed's push/pull decision in numbers (docs/feed.md), `npm run bench:feed`.
//
// (A) The reference generator at its own scale: 1,000,000 users with follower counts
//     min(5e6, floor(20 / (1 - u)^(1/1.1)) - 19), u uniform in [0, 1), one post per user a day
//     written to every follower. Its three rows (no threshold, 100,000 and 10,000) beside the
//     reference figures, with the exact expectation of each and, for the no-threshold row, the
//     spread over many seeds: the reference figure lies outside what the generator can give.
// (B) A day of publishes on a Zipf network, in arithmetic (it needs follower counts, not the
//     graph): fan-out writes per day, the largest single fan-out and what readers pull, with no
//     threshold and with pushMaxFollowers 100,000 and 10,000. Once at full scale (100M users) and
//     once scaled down 100 times with the thresholds scaled alike.
// (C) On a private redis-server, through the module: MEMORY USAGE per entry of each key (the
//     sizing formula), read latency p50/p99 for a reader following 0, 10 and 50 pulled producers,
//     a rebuild by pull, and the Redis CPU a fan-out write costs.
import { cpus, loadavg } from 'node:os'
import { performance } from 'node:perf_hooks'
import { Redis } from 'ioredis'
import { startRedisServer } from '../src/embedded/redis-server.ts'
import { createFeed, type Feed, type FeedItem, type FeedSource } from '../src/index.ts'
import { redisCpuSeconds } from './lib/cpu-time.ts'
import { formatTable, writeResults } from './lib/runner.ts'

const quick = process.argv.includes('--quick')

// ---------------------------------------------------------------------------------------------
// (A) The reference generator.

const REFERENCE = {
  users: 1_000_000,
  cap: 5_000_000,
  alpha: 1.1,
  /** The reference figures: fan-out writes a day and producers above the threshold. */
  rows: [
    { threshold: null, writes: 206_800_000, celebrities: 0 },
    { threshold: 100_000, writes: 105_500_000, celebrities: 95 },
    { threshold: 10_000, writes: 77_800_000, celebrities: 1430 },
  ] as Array<{ threshold: number | null; writes: number; celebrities: number }>,
}
const REFERENCE_SEED = 20261206

/** One user's follower count: the reference generator, u uniform in [0, 1). */
const referenceFollowers = (u: number) =>
  Math.min(REFERENCE.cap, Math.floor(20 / (1 - u) ** (1 / REFERENCE.alpha)) - 19)

/** P(followers >= k) for k >= 1: floor(Y) - 19 >= k exactly when Y >= k + 19, Y Pareto(20, alpha). */
const referenceTail = (k: number) => (k > REFERENCE.cap ? 0 : Math.min(1, (20 / (k + 19)) ** REFERENCE.alpha))

/**
 * Exact moments of one user's follower count, from its tail: E[min(X, t)] = sum of P(X >= k) for
 * k = 1..t, and E[X^2] = sum of (2k - 1) P(X >= k).
 */
function referenceMoments() {
  const partial = new Map<number, number>() // t -> E[min(X, t)]
  const marks = new Set(REFERENCE.rows.map((r) => r.threshold ?? REFERENCE.cap))
  let mean = 0
  let square = 0
  for (let k = 1; k <= REFERENCE.cap; k++) {
    const tail = referenceTail(k)
    mean += tail
    square += (2 * k - 1) * tail
    if (marks.has(k)) partial.set(k, mean)
  }
  /** Expected follower sum of the users at or under t (a pushed user's writes: one post a day). */
  const pushedMean = (t: number) => partial.get(t)! - t * referenceTail(t + 1)
  // Without the cap the mean is 20 alpha / (alpha - 1) - 19 (to within the floor's half unit).
  const uncappedMean = (20 * REFERENCE.alpha) / (REFERENCE.alpha - 1) - 19
  return { mean, sd: Math.sqrt(square - mean * mean), pushedMean, uncappedMean }
}

interface ReferenceDraw {
  writes: number[]
  celebrities: number[]
  largest: number
  atCap: number
}

/** One network of the generator: per threshold, the writes a day and the producers above it. */
function drawReference(seed: number): ReferenceDraw {
  const rand = random(seed)
  const thresholds = REFERENCE.rows.map((r) => r.threshold ?? Number.POSITIVE_INFINITY)
  const writes = thresholds.map(() => 0)
  const celebrities = thresholds.map(() => 0)
  let largest = 0
  let atCap = 0
  for (let user = 0; user < REFERENCE.users; user++) {
    const followers = referenceFollowers(rand())
    if (followers > largest) largest = followers
    if (followers === REFERENCE.cap) atCap++
    for (let t = 0; t < thresholds.length; t++) {
      if (followers > thresholds[t]!) celebrities[t]!++
      else writes[t]! += followers
    }
  }
  return { writes, celebrities, largest, atCap }
}

// ---------------------------------------------------------------------------------------------
// (B) A Zipf network and its day.

/**
 * Users are readers and producers. The producer of rank i (1 = most followed) has
 * floor(maxFollowers * i^-alpha) followers: a Zipf law over ranks. alpha = 0.78 is the rank exponent
 * of a power law of follower counts with density exponent 1 + 1/alpha = 2.28, about what was
 * measured on Twitter; the largest producer reaches half of the users.
 */
interface Network {
  name: string
  users: number
  maxFollowers: number
  alpha: number
  /** Thresholds to compare (null: none, every producer pushed). */
  thresholds: Array<number | null>
}

const ALPHA = 0.78
/** Posts per user and day (Poisson), the same for every producer. */
const POSTS_PER_DAY = 0.5
/** Share of a producer's followers active within the window (30 days), each independently. */
const ACTIVE = 0.3

const followersOf = (network: Network, rank: number) =>
  Math.floor(network.maxFollowers * rank ** -network.alpha)

/** mulberry32: a seeded generator, so every run simulates the same day. */
function random(seed: number) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

function poisson(rand: () => number, lambda: number): number {
  const limit = Math.exp(-lambda)
  let k = 0
  let p = rand()
  while (p > limit) {
    k++
    p *= rand()
  }
  return k
}

/** Active followers reached by one post: Binomial(n, ACTIVE), exact below 50, normal above. */
function activeOf(rand: () => number, n: number): number {
  if (n < 50) {
    let k = 0
    for (let i = 0; i < n; i++) if (rand() < ACTIVE) k++
    return k
  }
  const mean = n * ACTIVE
  const z = Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand())
  return Math.max(0, Math.min(n, Math.round(mean + z * Math.sqrt(mean * (1 - ACTIVE)))))
}

interface DayRow {
  network: string
  threshold: string
  pulledProducers: number
  followsOfPulledPerReader: number
  writesPerDay: number
  writesShare: number
  largestFanout: number
  largestExpected: number
}

function simulateDay(network: Network): { rows: DayRow[]; posts: number; meanFollowing: number } {
  const rand = random(20261203)
  const thresholds = network.thresholds.map((t) => t ?? Number.POSITIVE_INFINITY)
  const writes = thresholds.map(() => 0)
  const largest = thresholds.map(() => 0)
  const pulled = thresholds.map(() => 0)
  const pulledFollows = thresholds.map(() => 0)
  let posts = 0
  let edges = 0
  for (let rank = 1; rank <= network.users; rank++) {
    const followers = followersOf(network, rank)
    edges += followers
    for (let t = 0; t < thresholds.length; t++) {
      if (followers > thresholds[t]!) {
        pulled[t]!++
        pulledFollows[t]! += followers
      }
    }
    const n = poisson(rand, POSTS_PER_DAY)
    for (let post = 0; post < n; post++) {
      posts++
      const reached = activeOf(rand, followers)
      for (let t = 0; t < thresholds.length; t++) {
        if (followers > thresholds[t]!) continue
        writes[t]! += reached
        if (reached > largest[t]!) largest[t] = reached
      }
    }
  }
  const rows = thresholds.map((threshold, t) => {
    // The largest pushed producer: the first rank at or under the threshold.
    let rank = 1
    if (Number.isFinite(threshold))
      rank = Math.max(1, Math.ceil((network.maxFollowers / (threshold + 1)) ** (1 / network.alpha)))
    while (followersOf(network, rank) > threshold) rank++
    return {
      network: network.name,
      threshold: Number.isFinite(threshold) ? threshold.toLocaleString('en-US') : 'none',
      pulledProducers: pulled[t]!,
      followsOfPulledPerReader: pulledFollows[t]! / network.users,
      writesPerDay: writes[t]!,
      writesShare: writes[t]! / writes[0]!,
      largestFanout: largest[t]!,
      largestExpected: Math.round(followersOf(network, rank) * ACTIVE),
    }
  })
  return { rows, posts, meanFollowing: edges / network.users }
}

const FULL: Network = {
  name: '100M users',
  users: 100_000_000,
  maxFollowers: 50_000_000,
  alpha: ALPHA,
  thresholds: [null, 100_000, 10_000],
}
/** 1/100: users, the largest producer's reach and the thresholds all divided by 100. */
const SCALED: Network = {
  name: '1M users (1/100)',
  users: 1_000_000,
  maxFollowers: 500_000,
  alpha: ALPHA,
  thresholds: [null, 1000, 100],
}

// ---------------------------------------------------------------------------------------------
// (C) Redis.

const percentile = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!
const ms = (value: number) => value.toFixed(3)

/** The application's database, in memory: follows and items, indexed by producer. */
class MemorySource implements FeedSource {
  readonly following = new Map<string, string[]>()
  readonly byProducer = new Map<string, FeedItem[]>()
  readonly counts = new Map<string, number>()

  async followingOf(reader: string) {
    return this.following.get(reader) ?? []
  }

  async followerCountsOf(producers: readonly string[]) {
    return producers.map((producer) => this.counts.get(producer) ?? 1)
  }

  async itemsOf(producers: readonly string[], { limit }: { limit: number }) {
    // Each producer's list is newest first: its first `limit` are all that can make the answer.
    return producers
      .flatMap((producer) => (this.byProducer.get(producer) ?? []).slice(0, limit))
      .sort((a, b) => b.at - a.at || (a.id < b.id ? 1 : -1))
      .slice(0, limit)
  }

  add(producer: string, count: number, start: number, step: number) {
    const items: FeedItem[] = []
    for (let i = 0; i < count; i++) {
      const at = start + i * step
      items.push({ id: `${at}${producer.padStart(6, '0')}`, producer, at })
    }
    this.byProducer.set(producer, items.reverse())
  }
}

async function memoryUsage(redis: Redis, key: string): Promise<number> {
  return Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'))
}

async function usedMemory(redis: Redis): Promise<number> {
  return Number(/used_memory:(\d+)/.exec(await redis.info('memory'))?.[1])
}

/** 19-digit ids and 8-digit producer ids, as a database's bigint and integer keys print. */
const itemId = (n: number) => String(1_800_000_000_000_000_000n + BigInt(n))
const userId = (n: number) => String(10_000_000 + n)

async function measureMemory(redis: Redis) {
  const now = Date.now()
  const rows: Array<[string, string, number, number]> = []
  const zset = async (key: string, n: number, member: (i: number) => string) => {
    for (let i = 0; i < n; i += 1000) {
      const args: string[] = []
      for (let j = i; j < Math.min(n, i + 1000); j++) args.push(String(now - j * 1000), member(j))
      await redis.zadd(key, ...args)
    }
    return memoryUsage(redis, key)
  }
  const feedMember = (i: number) => `${itemId(i)} ${userId(i % 200)}`
  const feedBytes = await zset('m:feed', 800, feedMember)
  rows.push([
    'reader feed (800 items, `<id> <producer>`)',
    String(await redis.object('ENCODING', 'm:feed')),
    feedBytes,
    feedBytes / 800,
  ])
  await redis.config('SET', 'zset-max-listpack-entries', '1024')
  const compactBytes = await zset('m:feed-compact', 800, feedMember)
  rows.push([
    'the same, `zset-max-listpack-entries 1024`',
    String(await redis.object('ENCODING', 'm:feed-compact')),
    compactBytes,
    compactBytes / 800,
  ])
  await redis.config('SET', 'zset-max-listpack-entries', '128')
  const timelineBytes = await zset('m:timeline', 800, itemId)
  rows.push([
    'producer timeline (800 items, `<id>`)',
    String(await redis.object('ENCODING', 'm:timeline')),
    timelineBytes,
    timelineBytes / 800,
  ])
  const followersBytes = await zset('m:followers', 10_000, userId)
  rows.push([
    'followers (10,000 readers -> mark)',
    String(await redis.object('ENCODING', 'm:followers')),
    followersBytes,
    followersBytes / 10_000,
  ])
  await redis.sadd('m:following', ...Array.from({ length: 200 }, (_, i) => userId(i * 7)))
  const followingBytes = await memoryUsage(redis, 'm:following')
  rows.push([
    'following (200 numeric ids)',
    String(await redis.object('ENCODING', 'm:following')),
    followingBytes,
    followingBytes / 200,
  ])
  await redis.sadd('m:following-names', ...Array.from({ length: 200 }, (_, i) => `user-${i * 7}`))
  const namesBytes = await memoryUsage(redis, 'm:following-names')
  rows.push([
    'following (200 names)',
    String(await redis.object('ENCODING', 'm:following-names')),
    namesBytes,
    namesBytes / 200,
  ])
  await redis.hset('m:meta', 'mark', String(now))
  rows.push([
    'reader meta (`mark`)',
    String(await redis.object('ENCODING', 'm:meta')),
    await memoryUsage(redis, 'm:meta'),
    0,
  ])
  await redis.zadd('m:empty-timeline', '-1', '')
  rows.push([
    'an empty timeline (placeholder only)',
    'listpack',
    await memoryUsage(redis, 'm:empty-timeline'),
    0,
  ])
  // MEMORY USAGE leaves out the keyspace's bucket and the expires entry: used_memory growth of many
  // full feeds with a TTL, per entry.
  const feeds = quick ? 20 : 200
  const before = await usedMemory(redis)
  for (let f = 0; f < feeds; f++) {
    await zset(`m:many:{r:${f}}:feed`, 800, (i) => `${itemId(f * 800 + i)} ${userId(i % 200)}`)
    await redis.pexpire(`m:many:{r:${f}}:feed`, 2_592_000_000)
  }
  const perEntry = ((await usedMemory(redis)) - before) / (feeds * 800)
  return { rows, usedMemoryPerFeedEntry: perEntry, feedBytes, timelineBytes, followersBytes, followingBytes }
}

interface ReadRow {
  pulled: number
  p50: number
  p99: number
  commandsPerRead: number
  redisMicrosPerRead: number
}

/** Commands sent (calls of `names`) and the Redis time they took (µs, script internals included). */
async function commandStats(redis: Redis, names: string[]): Promise<{ calls: number; usec: number }> {
  const stats = await redis.info('commandstats')
  let calls = 0
  let usec = 0
  for (const name of names) {
    const match = new RegExp(`cmdstat_${name}:calls=(\\d+),usec=(\\d+)`).exec(stats)
    calls += Number(match?.[1] ?? 0)
    usec += Number(match?.[2] ?? 0)
  }
  return { calls, usec }
}

async function measureReads(redis: Redis, source: MemorySource, feed: Feed) {
  const start = Date.now() - 30 * 86_400_000
  // 200 pushed producers with 20 items each, 50 pulled producers with 800 each.
  for (let p = 0; p < 200; p++) source.add(`p${p}`, 20, start + p, 3_600_000)
  for (let c = 0; c < 50; c++) {
    source.add(`star${c}`, 800, start + c, 60_000 + c)
    source.counts.set(`star${c}`, 1_000_000)
  }
  const pushed = Array.from({ length: 200 }, (_, p) => `p${p}`)
  const readers = [0, 10, 50].map((n) => ({ reader: `reader${n}`, pulled: n }))
  for (const { reader, pulled } of readers)
    source.following.set(reader, [...pushed, ...Array.from({ length: pulled }, (_, c) => `star${c}`)])
  for (const { reader } of readers) await feed.read(reader) // builds the feed and the timelines

  const rounds = quick ? 2 : 5
  const perRound = quick ? 100 : 400
  const latencies = new Map<string, number[]>(readers.map(({ reader }) => [reader, []]))
  const commands = new Map<string, { calls: number; usec: number }>(
    readers.map(({ reader }) => [reader, { calls: 0, usec: 0 }]),
  )
  const names = ['evalsha', 'zrem']
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? readers : [...readers].reverse()
    for (const { reader } of order) {
      const before = await commandStats(redis, names)
      for (let i = 0; i < perRound; i++) {
        const t0 = performance.now()
        await feed.read(reader, { limit: 20 })
        latencies.get(reader)!.push(performance.now() - t0)
      }
      const after = await commandStats(redis, names)
      const total = commands.get(reader)!
      total.calls += after.calls - before.calls
      total.usec += after.usec - before.usec
    }
  }
  const rows: ReadRow[] = readers.map(({ reader, pulled }) => {
    const sorted = latencies.get(reader)!.sort((a, b) => a - b)
    const { calls, usec } = commands.get(reader)!
    const reads = rounds * perRound
    return {
      pulled,
      p50: percentile(sorted, 0.5),
      p99: percentile(sorted, 0.99),
      commandsPerRead: calls / reads,
      redisMicrosPerRead: usec / reads,
    }
  })
  // A deep page: the 10th, by cursor.
  let cursor: string | null = null
  for (let page = 0; page < 9; page++) cursor = (await feed.read('reader50', { limit: 20, cursor })).cursor
  const deep: number[] = []
  for (let i = 0; i < (quick ? 50 : 300); i++) {
    const t0 = performance.now()
    await feed.read('reader50', { limit: 20, cursor })
    deep.push(performance.now() - t0)
  }
  deep.sort((a, b) => a - b)
  // A rebuild by pull: the reader's keys gone, the next read asks the source (in memory here).
  const rebuilds: number[] = []
  for (let i = 0; i < (quick ? 5 : 20); i++) {
    await redis.del(...Object.values(feed.keys.reader('reader50')))
    const t0 = performance.now()
    await feed.read('reader50', { limit: 20 })
    rebuilds.push(performance.now() - t0)
  }
  rebuilds.sort((a, b) => a - b)
  return {
    rows,
    deepPage: { p50: percentile(deep, 0.5), p99: percentile(deep, 0.99) },
    rebuild: { p50: percentile(rebuilds, 0.5), max: rebuilds.at(-1)! },
  }
}

async function measureFanout(redis: Redis, source: MemorySource, feed: Feed) {
  const followers = quick ? 200 : 1000
  const posts = quick ? 5 : 20
  for (let i = 0; i < followers; i++) source.following.set(`fan${i}`, ['hub'])
  source.counts.set('hub', followers)
  source.add('hub', 800, Date.now() - 86_400_000, 60_000)
  // Each follower's feed is built (by its first read) full of the hub's 800 older items, so each
  // is active and reachable, and each write also trims the oldest item.
  for (let i = 0; i < followers; i += 50)
    await Promise.all(Array.from({ length: Math.min(50, followers - i) }, (_, j) => feed.read(`fan${i + j}`)))
  const now = Date.now()
  for (let i = 0; i < posts; i++) await feed.publish({ id: `hub-post-${i}`, producer: 'hub', at: now + i })
  const cpu0 = await redisCpuSeconds(redis)
  const t0 = performance.now()
  const worker = feed.createFanoutWorker({ consumer: 'bench', blockMs: 100 })
  await worker.start()
  while ((await feed.fanoutLag()).entries > 0) await new Promise((resolve) => setTimeout(resolve, 10))
  const seconds = (performance.now() - t0) / 1000
  await worker.stop()
  const writes = worker.stats().writes
  return {
    followers,
    posts,
    writes,
    seconds,
    writesPerSecond: writes / seconds,
    redisCpuMicrosPerWrite: (((await redisCpuSeconds(redis)) - cpu0) * 1e6) / writes,
  }
}

// ---------------------------------------------------------------------------------------------

const fmt = (n: number) => Math.round(n).toLocaleString('en-US')

const millions = (n: number) => `${(n / 1e6).toFixed(1)} M`
const ratio = (drawn: number, reference: number) => {
  const r = (drawn / reference - 1) * 100
  return `${r >= 0 ? '+' : ''}${r.toFixed(1)} %`
}

/** (A): the reference generator's rows beside the reference figures, and why one of them differs. */
function referenceSection(md: string[]) {
  const t0 = performance.now()
  const moments = referenceMoments()
  const draw = drawReference(REFERENCE_SEED)
  const seeds = quick ? 10 : 50
  const totals: number[] = []
  let seedsAtCap = 0
  for (let s = 1; s <= seeds; s++) {
    const other = drawReference(REFERENCE_SEED + s)
    totals.push(other.writes[0]!)
    seedsAtCap = Math.max(seedsAtCap, other.atCap)
  }
  totals.sort((a, b) => a - b)
  const { users, cap } = REFERENCE
  const rows = REFERENCE.rows.map((row, t) => {
    const threshold = row.threshold ?? cap
    return {
      threshold: row.threshold === null ? 'none' : fmt(row.threshold),
      writes: draw.writes[t]!,
      expectedWrites: users * moments.pushedMean(threshold),
      referenceWrites: row.writes,
      celebrities: draw.celebrities[t]!,
      expectedCelebrities: row.threshold === null ? 0 : users * referenceTail(threshold + 1),
      referenceCelebrities: row.celebrities,
    }
  })
  const sdOfSum = moments.sd * Math.sqrt(users)
  const expectedAtCap = users * referenceTail(cap)
  // The capped sum exceeds its mean by at most `cap` per user drawn at the cap: reaching the
  // reference figure takes this many of them, against the expected count.
  const neededAtCap = Math.ceil((REFERENCE.rows[0]!.writes - users * moments.mean) / cap)
  const reference = REFERENCE.rows[0]!.writes
  const reason = [
    `The no-threshold row cannot be reproduced under the cap. Capped at ${fmt(cap)}, a user's expected`,
    `follower count is ${moments.mean.toFixed(1)}, so ${fmt(users)} users make ${millions(users * moments.mean)} writes a day, with a standard`,
    `deviation of ${millions(sdOfSum)}: ${millions(reference)} is ${((reference - users * moments.mean) / sdOfSum).toFixed(1)} standard deviations above. The sum gains at most`,
    `${fmt(cap)} over its mean per user drawn at the cap; reaching ${millions(reference)} would take about ${neededAtCap} of them,`,
    `where ${expectedAtCap.toFixed(2)} are expected (P(X >= ${fmt(cap)}) = ${referenceTail(cap).toExponential(2)}). Over ${seeds} other seeds the total`,
    `ran from ${millions(totals[0]!)} to ${millions(totals.at(-1)!)} (median ${millions(totals[Math.floor(seeds / 2)]!)}), with at most ${seedsAtCap} user(s) at the cap in one`,
    `network. Without the cap the expectation is 20 * 1.1 / 0.1 - 19 = ${moments.uncappedMean.toFixed(0)} a user, ${millions(users * moments.uncappedMean)} a day,`,
    `${ratio(users * moments.uncappedMean, reference)} from the reference figure: that figure is near the uncapped expectation, which a capped`,
    `draw of ${fmt(users)} users does not reach. The thresholded rows do not depend on the cap, and match within 10 %.`,
  ]
  const last = rows.at(-1)!
  reason.push(
    '',
    `The reference count of ${fmt(last.referenceCelebrities)} producers above ${last.threshold} is not the generator's either: it`,
    `expects ${fmt(last.expectedCelebrities)} (${fmt(users)} * P(X > ${last.threshold})), give or take ${Math.sqrt(last.expectedCelebrities).toFixed(0)} (Poisson);`,
    'the writes at that threshold match all the same.',
  )
  md.push(
    `## (A) The reference generator: ${fmt(users)} users, min(5e6, floor(20 / (1 - u)^(1/1.1)) - 19) followers`,
    '',
    'u uniform in [0, 1) from a seeded generator (seed ' +
      `${REFERENCE_SEED}), one post per user a day written to every follower of a pushed producer:`,
    'fan-out writes a day are the follower sum of the producers at or under the threshold. "Expected":',
    'the exact expectation of the generator (from its tail, P(X >= k) = (20 / (k + 19))^1.1 under the cap).',
    `This network: mean following ${(draw.writes[0]! / users).toFixed(1)}, largest producer ${fmt(draw.largest)} followers.`,
    '',
    formatTable(
      [
        'pushMaxFollowers',
        'fan-out writes/day',
        'expected',
        'reference',
        'vs reference',
        'producers above the threshold',
        'expected',
        'reference',
        'vs reference',
      ],
      rows.map((r) => [
        r.threshold,
        millions(r.writes),
        millions(r.expectedWrites),
        millions(r.referenceWrites),
        ratio(r.writes, r.referenceWrites),
        fmt(r.celebrities),
        r.expectedCelebrities ? fmt(r.expectedCelebrities) : '0',
        fmt(r.referenceCelebrities),
        r.referenceCelebrities ? ratio(r.celebrities, r.referenceCelebrities) : '',
      ]),
    ),
    '',
    ...reason,
    '',
  )
  console.log(md.slice(-(reason.length + 4)).join('\n'))
  console.log(`(A) ${((performance.now() - t0) / 1000).toFixed(1)} s`)
  return {
    seed: REFERENCE_SEED,
    rows,
    moments: { mean: moments.mean, sd: moments.sd, uncappedMean: moments.uncappedMean },
    otherSeeds: { seeds, min: totals[0], max: totals.at(-1), median: totals[Math.floor(seeds / 2)] },
    largest: draw.largest,
    atCap: draw.atCap,
  }
}

async function main() {
  const md: string[] = ['# Feed simulation', '']
  const reference = referenceSection(md)
  md.push(
    '## (B) A Zipf network',
    '',
    `The producer of rank i has floor(M * i^-${ALPHA}) followers (M: the largest, half of the users);`,
    `each user posts Poisson(${POSTS_PER_DAY}) items a day; each follower is active within the window with`,
    `probability ${ACTIVE}. One simulated day (seeded). Fan-out writes: active followers reached by pushed posts.`,
    '',
  )
  const day: Record<string, { rows: DayRow[]; posts: number; meanFollowing: number }> = {}
  for (const network of [FULL, SCALED]) {
    const t0 = performance.now()
    const { rows, posts, meanFollowing } = simulateDay(network)
    day[network.name] = { rows, posts, meanFollowing }
    console.log(
      `(B) ${network.name}: ${fmt(posts)} posts, mean following ${meanFollowing.toFixed(1)} (${((performance.now() - t0) / 1000).toFixed(1)} s)`,
    )
    md.push(
      `### ${network.name}: ${fmt(posts)} posts in the day, mean following ${meanFollowing.toFixed(1)}`,
      '',
    )
    md.push(
      formatTable(
        [
          'pushMaxFollowers',
          'pulled producers',
          'follows of pulled producers per reader',
          'fan-out writes/day',
          'vs none',
          'largest fan-out (the day)',
          'largest pushed producer, one post',
        ],
        rows.map((r) => [
          r.threshold,
          fmt(r.pulledProducers),
          r.followsOfPulledPerReader.toFixed(1),
          fmt(r.writesPerDay),
          `${(r.writesShare * 100).toFixed(1)} %`,
          fmt(r.largestFanout),
          fmt(r.largestExpected),
        ]),
      ),
      '',
    )
    console.log(md.slice(-2).join('\n'))
  }

  const server = await startRedisServer()
  const redis = new Redis(server.url)
  try {
    const info = await redis.info('server')
    const version = /redis_version:(\S+)/.exec(info)?.[1]
    md.push(
      `## (C) Redis ${version}, a private redis-server on this machine (${cpus().length} CPUs, load average ${loadavg()[0]!.toFixed(1)} at the start)`,
      '',
    )
    const memory = await measureMemory(redis)
    md.push(
      '### MEMORY USAGE',
      '',
      formatTable(
        ['key', 'encoding', 'bytes', 'bytes per entry'],
        memory.rows.map(([what, encoding, bytes, per]) => [
          what,
          encoding,
          fmt(bytes),
          per ? per.toFixed(1) : '',
        ]),
      ),
      '',
      `used_memory growth per feed entry over full feeds with a TTL: ${memory.usedMemoryPerFeedEntry.toFixed(1)} bytes`,
      '',
    )
    console.log(md.slice(-6).join('\n'))
    // Reads and fan-out with the feeds and timelines in each encoding: skiplist (the default,
    // zset-max-listpack-entries 128) and listpack (1024, above feedMaxItems and timelineMaxItems).
    const runs: Array<{
      encoding: string
      reads: Awaited<ReturnType<typeof measureReads>>
      fanout: Awaited<ReturnType<typeof measureFanout>>
    }> = []
    for (const listpackEntries of [128, 1024]) {
      await redis.flushdb() // the private server only
      await redis.config('SET', 'zset-max-listpack-entries', String(listpackEntries))
      const source = new MemorySource()
      const feed = createFeed(redis, { source, keyPrefix: 'bench:' })
      const reads = await measureReads(redis, source, feed)
      const encoding = String(await redis.object('ENCODING', feed.keys.reader('reader50').feed))
      const fanout = await measureFanout(redis, source, feed)
      runs.push({ encoding, reads, fanout })
      console.log(encoding, JSON.stringify(reads), JSON.stringify(fanout))
    }
    md.push(
      '### Reads (first page, limit 20; the reader follows 200 pushed producers, a full feed of 800)',
      '',
      formatTable(
        [
          'feeds and timelines',
          'pulled producers followed',
          'p50 ms',
          'p99 ms',
          'commands sent per read',
          'Redis µs per read',
        ],
        runs.flatMap(({ encoding, reads }) =>
          reads.rows.map((r) => [
            encoding,
            r.pulled,
            ms(r.p50),
            ms(r.p99),
            r.commandsPerRead.toFixed(1),
            r.redisMicrosPerRead.toFixed(0),
          ]),
        ),
      ),
      '',
    )
    for (const { encoding, reads } of runs)
      md.push(
        `${encoding}: the 10th page by cursor, 50 pulled: p50 ${ms(reads.deepPage.p50)} ms, p99 ${ms(reads.deepPage.p99)} ms; ` +
          `a rebuild by pull (50 pulled + 200 pushed, in-memory source): p50 ${ms(reads.rebuild.p50)} ms, max ${ms(reads.rebuild.max)} ms.`,
        '',
      )
    md.push('### Fan-out', '')
    for (const { encoding, fanout } of runs)
      md.push(
        `${encoding}: ${fanout.posts} posts of a producer with ${fmt(fanout.followers)} active followers (feeds full: each write trims one): ` +
          `${fmt(fanout.writes)} feed writes in ${fanout.seconds.toFixed(2)} s (${fmt(fanout.writesPerSecond)} writes/s, one worker), ` +
          `${fanout.redisCpuMicrosPerWrite.toFixed(2)} µs of Redis CPU per write.`,
        '',
      )
    console.log(md.slice(-12).join('\n'))
    const fanout = runs[0]!.fanout
    // The day's fan-out in Redis CPU, at the measured cost of a write.
    const cost = (writes: number) => (writes * fanout.redisCpuMicrosPerWrite) / 1e6
    md.push(
      `### The day of (B) at ${fanout.redisCpuMicrosPerWrite.toFixed(2)} µs of Redis CPU per write (skiplist)`,
      '',
      formatTable(
        [
          'network',
          'pushMaxFollowers',
          'Redis CPU s/day',
          'mean Redis cores',
          'largest fan-out: Redis CPU s',
        ],
        Object.values(day).flatMap(({ rows }) =>
          rows.map((r) => [
            r.network,
            r.threshold,
            fmt(cost(r.writesPerDay)),
            (cost(r.writesPerDay) / 86_400).toFixed(2),
            cost(r.largestFanout).toFixed(3),
          ]),
        ),
      ),
      '',
    )
    console.log(md.slice(-3).join('\n'))
    const { json, md: mdPath } = writeResults(
      'feed',
      { quick, reference, day, memory, runs },
      md.join('\n'),
      { quick },
    )
    console.log(`results: ${json}, ${mdPath}`)
  } finally {
    redis.disconnect()
    await server.stop()
  }
}

await main()
