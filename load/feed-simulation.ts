// The feed's push/pull decision in numbers (docs/feed.md), `npm run bench:feed`.
//
// (A) A day of publishes on a network with a heavy-tailed follower distribution, in arithmetic (it
//     needs follower counts, not the graph): fan-out writes per day, the largest single fan-out and
//     what readers pull, with no threshold and with pushMaxFollowers 100,000 and 10,000. Once at
//     full scale (100M users) and once scaled down 100 times with the thresholds scaled alike.
// (B) On a private redis-server, through the module: MEMORY USAGE per entry of each key (the
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
// (A) The network and its day.

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
// (B) Redis.

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

async function main() {
  const md: string[] = ['# Feed simulation', '']
  md.push(
    `Model: the producer of rank i has floor(M * i^-${ALPHA}) followers (M: the largest, half of the users);`,
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
      `(A) ${network.name}: ${fmt(posts)} posts, mean following ${meanFollowing.toFixed(1)} (${((performance.now() - t0) / 1000).toFixed(1)} s)`,
    )
    md.push(
      `## (A) ${network.name}: ${fmt(posts)} posts in the day, mean following ${meanFollowing.toFixed(1)}`,
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
      `## (B) Redis ${version}, a private redis-server on this machine (${cpus().length} CPUs, load average ${loadavg()[0]!.toFixed(1)} at the start)`,
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
      `### The day of (A) at ${fanout.redisCpuMicrosPerWrite.toFixed(2)} µs of Redis CPU per write (skiplist)`,
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
    const { json, md: mdPath } = writeResults('feed', { quick, day, memory, runs }, md.join('\n'), { quick })
    console.log(`results: ${json}, ${mdPath}`)
  } finally {
    redis.disconnect()
    await server.stop()
  }
}

await main()
