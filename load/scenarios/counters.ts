// Counting without a hot key, and the memory of a big leaderboard (docs/sharded-counter.md,
// docs/leaderboard.md).
// (a) Concurrent writers count "one transfer" (a count, a volume, a distinct sender) into one key per
//     count or into 16 shards, with plain commands (INCRBY, INCRBY, PFADD) and with the
//     ShardedCounter's script (deduplicated by event id: `shards: 1` against `shards: 16`), first on
//     a private redis-server (Redis CPU per increment: sharding buys no throughput on one server),
//     then on a 3-master Redis Cluster (scripts/redis-cluster.ts), where the question is how the
//     commands and the CPU split over the masters.
// (b) MEMORY USAGE of a leaderboard of 1,000,000 members as the demo stores them (10-digit members,
//     negated integer scores; ZADD in pipelined batches), extrapolated to 10M; and of the set of
//     counted event ids against one marker key per event.
import { Redis } from 'ioredis'
import { startRedisCluster } from '../../scripts/redis-cluster.ts'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { createShardedCounter, type RedisClient } from '../../src/index.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import { redisCpuSeconds } from '../lib/cpu-time.ts'
import { pinUnderTest } from '../lib/cpus.ts'
import { formatTable, median } from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'

const SHARDS = 16
const WRITERS = 64
const SENDERS = 10_000

interface Variant {
  name: string
  /** Counts one transfer: event number `n`. */
  make(redis: RedisClient, run: string): (n: number) => Promise<unknown>
}

/** FNV-1a, as the ShardedCounter picks a member's shard. */
function shardOf(value: string): number {
  let hash = 0x811c9dc5
  for (let i = 0; i < value.length; i++) hash = Math.imul(hash ^ value.charCodeAt(i), 0x01000193)
  return (hash >>> 0) % SHARDS
}

const plain = (sharded: boolean): Variant => ({
  name: sharded ? `${SHARDS} shards: INCRBY, INCRBY, PFADD` : 'one key each: INCRBY, INCRBY, PFADD',
  make: (redis, run) => (n) => {
    const member = `c${n % SENDERS}`
    const tag = sharded ? `{${run}:${shardOf(member)}}` : `{${run}}`
    return Promise.all([
      redis.incrby(`bench:${tag}:transfers`, 1),
      redis.incrby(`bench:${tag}:volume`, 1000 + (n % 9000)),
      redis.pfadd(`bench:${tag}:senders`, member),
    ])
  },
})

const scripted = (shards: number): Variant => ({
  name: `ShardedCounter.add, shards: ${shards} (script, once per event id)`,
  make: (redis, run) => {
    const counter = createShardedCounter(redis, { key: (s) => `bench:{${run}:${s}}`, shards, ttlMs: 600_000 })
    return (n) =>
      counter.add({
        id: String(n),
        member: `c${n % SENDERS}`,
        counts: { transfers: 1, 'volume:VND': 1000 + (n % 9000) },
      })
  },
})

const VARIANTS = [plain(false), plain(true), scripted(1), scripted(SHARDS)]

interface NodeSample {
  cpuSeconds: number
  calls: number
}

/** redis-server's CPU (user + sys, all threads) and commands executed so far (scripts' inner calls included). */
async function sample(node: Redis): Promise<NodeSample> {
  const cpuSeconds = await redisCpuSeconds(node)
  const stats = await node.info('commandstats')
  const calls = [...stats.matchAll(/calls=(\d+)/g)].reduce((sum, m) => sum + Number(m[1]), 0)
  return { cpuSeconds, calls }
}

interface Outcome {
  opsPerSecond: number
  /** Redis CPU per counted transfer over every node, µs. */
  cpuMicrosPerOp: number
  /** Per node: its share of the commands executed and of the Redis CPU, in %. */
  commandShares: number[]
  cpuShares: number[]
}

/** `WRITERS` loops, each counting one transfer at a time, for `ms`. */
async function drive(
  client: RedisClient,
  nodes: Redis[],
  variant: Variant,
  run: string,
  ms: number,
): Promise<Outcome> {
  const count = variant.make(client, run)
  let next = 0
  const before = await Promise.all(nodes.map(sample))
  const started = performance.now()
  const end = started + ms
  await Promise.all(
    Array.from({ length: WRITERS }, async () => {
      while (performance.now() < end) await count(next++)
    }),
  )
  const seconds = (performance.now() - started) / 1000
  const after = await Promise.all(nodes.map(sample))
  const cpu = after.map((a, i) => a.cpuSeconds - before[i]!.cpuSeconds)
  const calls = after.map((a, i) => a.calls - before[i]!.calls)
  const share = (values: number[]) => {
    const total = values.reduce((s, v) => s + v, 0) || 1
    return values.map((v) => Math.round((100 * v) / total))
  }
  return {
    opsPerSecond: next / seconds,
    cpuMicrosPerOp: (cpu.reduce((s, v) => s + v, 0) * 1e6) / next,
    commandShares: share(calls),
    cpuShares: share(cpu),
  }
}

/** Interleaved rounds of every variant; per variant the median of each measure. */
async function compare(client: RedisClient, nodes: Redis[], rounds: number, ms: number, label: string) {
  const results = new Map<string, Outcome[]>(VARIANTS.map((v) => [v.name, []]))
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? VARIANTS : [...VARIANTS].reverse()
    for (const variant of order) {
      const outcome = await drive(client, nodes, variant, `${label}${round}`, ms)
      results.get(variant.name)!.push(outcome)
      console.error(
        `  ${label} round ${round + 1}/${rounds} ${variant.name}: ${Math.round(outcome.opsPerSecond)} ops/s, ` +
          `${outcome.cpuMicrosPerOp.toFixed(1)} µs Redis CPU/op, commands ${outcome.commandShares.join('/')} %`,
      )
    }
  }
  return VARIANTS.map((v) => {
    const outcomes = results.get(v.name)!
    // The shares of the median-throughput round (shares of different rounds do not average).
    const middle = [...outcomes].sort((a, b) => a.opsPerSecond - b.opsPerSecond)[
      Math.floor(outcomes.length / 2)
    ]!
    return {
      variant: v.name,
      opsPerSecond: median(outcomes.map((o) => o.opsPerSecond)),
      cpuMicrosPerOp: median(outcomes.map((o) => o.cpuMicrosPerOp)),
      commandShares: middle.commandShares,
      cpuShares: middle.cpuShares,
    }
  })
}

const pidOf = async (node: Redis) => Number(/process_id:(\d+)/.exec(await node.info('server'))?.[1])

/** MEMORY USAGE of a demo-shaped board of `members` members, and of the counted ids, on a fresh server. */
async function leaderboardMemory(members: number) {
  const server = await startRedisServer()
  const redis = new Redis(server.url)
  try {
    pinUnderTest(await pidOf(redis))
    const board = 'lb:{week:2026-W49:VND}'
    const perCommand = 1000
    for (let start = 0; start < members; start += perCommand * 20) {
      const pipeline = redis.pipeline()
      for (let from = start; from < Math.min(members, start + perCommand * 20); from += perCommand) {
        const args: Array<string | number> = []
        for (let i = from; i < Math.min(members, from + perCommand); i++)
          args.push(-(1 + ((i * 2_654_435_761) % 1_000_000_000)), String(i + 1).padStart(10, '0'))
        pipeline.zadd(board, ...args)
      }
      await pipeline.exec()
    }
    const boardBytes = Number(await redis.call('MEMORY', 'USAGE', board, 'SAMPLES', '0'))
    assertCount(await redis.zcard(board), members)
    // Reading the top 10 and one member's rank and score, as the routes do.
    const top = await timeMicros(() => redis.zrange(board, '0', '9', 'WITHSCORES'))
    const me = await timeMicros(() =>
      redis.multi().zrank(board, '0000500000').zscore(board, '0000500000').exec(),
    )
    // The counted event ids of one week: a set next to the board (what the script does) ...
    const ids = 'lb:{week:2026-W49:VND}:ids'
    for (let start = 0; start < members; start += 20_000) {
      const pipeline = redis.pipeline()
      for (let from = start; from < Math.min(members, start + 20_000); from += 1000) {
        const batch: string[] = []
        for (let i = from; i < Math.min(members, from + 1000); i++) batch.push(String(40_000_000 + i))
        pipeline.sadd(ids, ...batch)
      }
      await pipeline.exec()
    }
    const idsBytes = Number(await redis.call('MEMORY', 'USAGE', ids, 'SAMPLES', '0'))
    // ... against one marker key per event with its own TTL (used_memory delta: keys have no MEMORY USAGE total).
    const markers = Math.min(members, 200_000)
    const used = async () => Number(/used_memory:(\d+)/.exec(await redis.info('memory'))?.[1])
    const before = await used()
    for (let start = 0; start < markers; start += 10_000) {
      const pipeline = redis.pipeline()
      for (let i = start; i < Math.min(markers, start + 10_000); i++)
        pipeline.set(`lb:{week:2026-W49:VND}:seen:${40_000_000 + i}`, '1', 'PX', 1_209_600_000, 'NX')
      await pipeline.exec()
    }
    const markerBytes = ((await used()) - before) / markers
    return {
      members,
      boardBytes,
      bytesPerMember: boardBytes / members,
      extrapolated10M: (boardBytes / members) * 10_000_000,
      topMicros: top,
      entryMicros: me,
      idsBytesPerEvent: idsBytes / members,
      markerBytesPerEvent: markerBytes,
    }
  } finally {
    redis.disconnect()
    await server.stop()
  }
}

function assertCount(actual: number, expected: number): void {
  if (actual !== expected) throw new Error(`the board holds ${actual} members, not ${expected}`)
}

/** Median time of one call, µs, over 200 sequential calls after 20 warm-ups. */
async function timeMicros(call: () => Promise<unknown>): Promise<number> {
  const times: number[] = []
  for (let i = 0; i < 220; i++) {
    const start = performance.now()
    await call()
    if (i >= 20) times.push((performance.now() - start) * 1000)
  }
  return median(times)
}

const fmt = (n: number, digits = 0) =>
  n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })

const counters: Scenario = async ({ quick }) => {
  const rounds = quick ? 1 : 3
  const ms = quick ? 1500 : 5000

  // (a) one redis-server
  const server = await startRedisServer()
  const single = createRedisClient({ url: server.url, commandTimeoutMs: 5000 })
  const singleNode = new Redis(server.url)
  let onOne: Awaited<ReturnType<typeof compare>>
  try {
    await connectRedis(single)
    pinUnderTest(await pidOf(singleNode))
    console.error('  one redis-server')
    onOne = await compare(single, [singleNode], rounds, ms, 'one')
  } finally {
    single.disconnect()
    singleNode.disconnect()
    await server.stop()
  }

  // (a) a 3-master Redis Cluster
  const cluster = await startRedisCluster(3)
  const clustered = createRedisClient({ clusterNodes: cluster.primaries, commandTimeoutMs: 5000 })
  const masters = cluster.primaries.map((p) => new Redis(p.port, p.host))
  let onCluster: Awaited<ReturnType<typeof compare>>
  try {
    await connectRedis(clustered)
    for (const master of masters) pinUnderTest(await pidOf(master))
    console.error('  3-master Redis Cluster')
    onCluster = await compare(clustered, masters, rounds, ms, 'cluster')
  } finally {
    clustered.disconnect()
    for (const master of masters) master.disconnect()
    await cluster.stop()
  }

  // (b)
  const memory = await leaderboardMemory(1_000_000)

  const markdown = [
    `Counting one transfer (a count, a volume and a distinct sender), ${WRITERS} concurrent writers in the ` +
      `load generator's process, ${rounds} interleaved round(s) of ${ms / 1000} s per variant, medians.`,
    '',
    formatTable(
      ['one redis-server', 'transfers counted/s', 'Redis CPU µs per transfer'],
      onOne.map((r) => [r.variant, fmt(r.opsPerSecond), fmt(r.cpuMicrosPerOp, 1)]),
    ),
    '',
    formatTable(
      [
        '3-master Redis Cluster',
        'transfers counted/s',
        'Redis CPU µs per transfer (all masters)',
        'commands per master (%)',
        'CPU per master (%)',
      ],
      onCluster.map((r) => [
        r.variant,
        fmt(r.opsPerSecond),
        fmt(r.cpuMicrosPerOp, 1),
        r.commandShares.join(' / '),
        r.cpuShares.join(' / '),
      ]),
    ),
    '',
    'On one server a shard is just another key: sharding buys no throughput there, and the Redis CPU per ' +
      'transfer shows what each variant costs. On the Cluster, one key per count puts every write on one ' +
      'master whatever the number of masters; the shards spread them. (All masters share one CPU on this ' +
      'machine, so the Cluster rows show the split, not a scaled throughput.)',
    '',
    formatTable(
      ['leaderboard (sorted set)', 'members', 'MEMORY USAGE', 'bytes/member', '10M members (extrapolated)'],
      [
        [
          'demo board: 10-digit members, integer scores',
          fmt(memory.members),
          `${fmt(memory.boardBytes / 1e6, 1)} MB`,
          fmt(memory.bytesPerMember, 1),
          `${fmt(memory.extrapolated10M / 1e6)} MB (rough estimate: ~750 MB)`,
        ],
      ],
    ),
    '',
    formatTable(
      ['dedup of counted event ids', 'bytes per event'],
      [
        ['one set per board (SADD; what the script does)', fmt(memory.idsBytesPerEvent, 1)],
        ['one marker key per event (SET NX PX)', fmt(memory.markerBytesPerEvent, 1)],
      ],
    ),
    '',
    `Reads on the ${fmt(memory.members)}-member board, one connection, median: top 10 (ZRANGE 0 9 WITHSCORES) ` +
      `${fmt(memory.topMicros)} µs, one member's rank and score (MULTI ZRANK ZSCORE) ${fmt(memory.entryMicros)} µs.`,
  ].join('\n')

  return {
    title: 'Counters without a hot key; leaderboard memory',
    markdown,
    data: { writers: WRITERS, shards: SHARDS, rounds, seconds: ms / 1000, onOne, onCluster, memory },
    ratios: [],
  }
}

export default counters
