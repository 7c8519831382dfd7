// Sizing Redis for N customers (docs/demo/operations.md, "Sizing Redis"). The demo gateway runs with every
// feature on (sessions, rate limits, Idempotency-Key, balance cache, outbox relay and notifier, the
// leaderboard and daily-totals groups, the scheduler) on a private redis-server and a fresh database.
// C customers are seeded in Postgres with a funded account; each one, from an address of its own
// (X-Forwarded-For behind TRUST_PROXY=true), logs in, reads its balance, makes T transfers with an
// Idempotency-Key to random other customers, and reads its balance again once every transfer event
// has been handled. Then every key is measured (MEMORY USAGE key SAMPLES 0: exact for every type)
// and grouped by key class, per active customer or per transfer, and extrapolated to 100,000 and
// 1,000,000 customers making as many transfers each. Cross-checks: used_memory before and after, and
// used_memory given back by deleting each class's keys once the gateway has stopped.
//
// Collections that grow with the number of customers or transfers (the leaderboard board, the sets
// of counted event ids, the notification streams at their cap) change encoding as they grow: a set
// of 500 integers is an intset of 2 bytes a member, a set of millions a hash table of about 50. Their
// per-member cost is measured on collections of LARGE members shaped like the real ones, in database
// 15 of the private redis-server (flushed afterwards).
//
// SIZING_CUSTOMERS and SIZING_TRANSFERS change C and T (defaults 300 and 10; --quick: 100 and 5).
import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import pg from 'pg'
import { LEADERBOARD_GROUP } from '../../src/campaigns/leaderboard.ts'
import { STATS_GROUP } from '../../src/campaigns/stats.ts'
import { type Config, loadConfig } from '../../src/config.ts'
import { NOTIFIER_GROUP } from '../../src/events/notifier.ts'
import { FEED_GROUP } from '../../src/public-accounts/plugin.ts'
import { BENCH_PASSWORD, seedCustomers } from '../lib/customers.ts'
import { formatTable, type ServerHandle, startServer } from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'
import { BENCH_SECRET, GATEWAY_ENTRY } from '../servers/cache-cluster.ts'

/** Customers whose requests are in flight at once (each runs its own steps one after the other). */
const IN_FLIGHT = 16
/** Examples of active customers the table extrapolates to. */
const EXAMPLES = [100_000, 1_000_000]
/** Members of the large collections measured in database 15. */
const LARGE = 100_000
const STREAM = 'events:transfers'
/** The consumer groups on the transfer events: the notifier, the leaderboard, the daily totals, the feed. */
const EVENT_GROUPS = [NOTIFIER_GROUP, LEADERBOARD_GROUP, STATS_GROUP, FEED_GROUP]

/**
 * What a class grows with: active customers, transfers (kept for the class's retention), the
 * events stream (transfers, up to its cap), or nothing.
 */
type Scale = 'customer' | 'transfer' | 'events' | 'fixed'

interface KeyClass {
  id: string
  label: string
  /** Matched against the key without the gateway's key prefix; the first class that matches wins. */
  match: RegExp
  scale: Scale
  /** Its members cost what a large collection's do ('zset': a leaderboard; 'set': event ids). */
  large?: 'zset' | 'set'
  /** What holds it: TTL or cap, and the setting. */
  bound: string
}

const duration = (ms: number) =>
  ms % 3_600_000 === 0 ? `${ms / 3_600_000}h` : ms % 60_000 === 0 ? `${ms / 60_000}m` : `${ms / 1000}s`

/** Every key the gateway writes, by pattern, with the bounds of the settings this run used. */
function keyClasses(config: Config): KeyClass[] {
  const { session, cache, events, rateLimits } = config
  // The cache's generation TTL: twice the longest entry lifetime (TTL + 20 % jitter) plus the lease.
  const generationMs = 2 * cache.ttlMs * 1.2 + Math.max(5000, cache.leaseWaitMs)
  return [
    {
      id: 'session-index',
      label: "session index (a customer's session ids)",
      match: /^sess:principal:\{/,
      scale: 'customer',
      bound: `TTL SESSION_ABSOLUTE_TIMEOUT (${duration(session.absoluteTimeoutMs)}), renewed at each login`,
    },
    {
      id: 'session',
      label: 'session',
      match: /^sess:\{/,
      scale: 'customer',
      bound: `TTL SESSION_IDLE_TIMEOUT (${duration(session.idleTimeoutMs)}) from the last request, at most SESSION_ABSOLUTE_TIMEOUT`,
    },
    {
      id: 'rl-transfers',
      label: 'rate limit `transfers` (fixed window, per customer)',
      match: /^rl:\{[^}]*\}:transfers:/,
      scale: 'customer',
      bound: `TTL the RATE_LIMIT_TRANSFERS window (${duration(rateLimits.transfers.windowMs)})`,
    },
    {
      id: 'rl-login-ip',
      label: 'rate limit `login-ip` (sliding counter, per client IP)',
      match: /^rl:\{[^}]*\}:login-ip:/,
      scale: 'customer',
      bound: `TTL 2 x the RATE_LIMIT_LOGIN_IP window (${duration(2 * rateLimits.loginIp.windowMs)})`,
    },
    {
      id: 'rl-login',
      label: 'rate limit `login` (failed logins, per username)',
      match: /^rl:\{[^}]*\}:login:/,
      scale: 'customer',
      bound: `TTL the RATE_LIMIT_LOGIN window (${duration(rateLimits.login.windowMs)})`,
    },
    {
      id: 'rl-ip',
      label: 'rate limit `ip` (token bucket, per client IP)',
      match: /^rl:\{[^}]*\}:ip:/,
      scale: 'customer',
      bound: `TTL until the bucket is full again (RATE_LIMIT_IP: at most ${rateLimits.ip.capacity / rateLimits.ip.refillPerSecond}s)`,
    },
    { id: 'rl-other', label: 'rate limit, other', match: /^rl:/, scale: 'customer', bound: 'TTL its window' },
    {
      id: 'idempotency',
      label: 'idempotency record',
      match: /^idem:/,
      scale: 'transfer',
      bound: "TTL 24h (the idempotency plugin's `retentionMs`)",
    },
    {
      id: 'cache-entry',
      label: 'cache entry (balance)',
      match: /^cache:\{.*\}:v$/,
      scale: 'customer',
      bound: `TTL CACHE_TTL (${duration(cache.ttlMs)}) + up to 20 %`,
    },
    {
      id: 'cache-generation',
      label: 'cache generation (a key a transfer invalidated)',
      match: /^cache:\{.*\}:g$/,
      scale: 'customer',
      bound: `TTL 2 x (CACHE_TTL + 20 %) + 5s (${Math.round(generationMs / 1000)}s)`,
    },
    {
      id: 'cache-other',
      label: 'cache lease or tag',
      match: /^cache:/,
      scale: 'customer',
      bound: 'TTL the lease (5s) or a generation',
    },
    {
      id: 'notifications',
      label: 'notifications stream (per customer)',
      match: /^notifications:\{/,
      scale: 'customer',
      bound: `NOTIFICATIONS_RETENTION entries (MAXLEN ~ ${events.notificationsRetention}); TTL NOTIFICATIONS_TTL (${duration(events.notificationsTtlMs)}) from the latest, older entries trimmed`,
    },
    {
      id: 'notified',
      label: 'notification dedup marker (2 per transfer)',
      match: /^notified:\{/,
      scale: 'transfer',
      bound: `TTL NOTIFICATIONS_DEDUP (${duration(events.notificationsDedupMs)})`,
    },
    {
      id: 'leaderboard-ids',
      label: 'leaderboard counted event ids',
      match: /^lb:\{.*\}:ids$/,
      scale: 'transfer',
      large: 'set',
      bound: 'TTL the end of the ISO week + 7 days',
    },
    {
      id: 'leaderboard',
      label: 'leaderboard board (a member per sender)',
      match: /^lb:\{/,
      scale: 'customer',
      large: 'zset',
      bound: 'TTL the end of the ISO week + 7 days',
    },
    {
      id: 'stats-ids',
      label: 'daily totals counted event ids',
      match: /^stats:\{.*\}:ids$/,
      scale: 'transfer',
      large: 'set',
      bound: "TTL 2 days after its shard's last write",
    },
    {
      id: 'stats-distinct',
      label: 'daily totals distinct senders (HyperLogLog)',
      match: /^stats:\{.*\}:distinct$/,
      scale: 'fixed',
      bound: '8 a day, each at most a dense HyperLogLog; TTL 2 days',
    },
    {
      id: 'stats',
      label: 'daily totals counts',
      match: /^stats:\{/,
      scale: 'fixed',
      bound: '8 a day; TTL 2 days',
    },
    {
      id: 'events',
      label: 'events stream (an entry per transfer)',
      match: /^events:transfers$/,
      scale: 'events',
      bound: `EVENTS_RETENTION entries (MAXLEN ~ ${events.streamRetention}); no TTL`,
    },
    {
      id: 'events-other',
      label: "events dead letters, relay's epoch",
      match: /^events:/,
      scale: 'fixed',
      bound: `entries that failed 5 deliveries, EVENTS_DEAD_LETTER_RETENTION (MAXLEN ~ ${events.deadLetterRetention}); no TTL`,
    },
    {
      id: 'scheduler',
      label: 'scheduler queues, heartbeats, locks',
      match: /^(dq|lock):/,
      scale: 'fixed',
      bound: 'scheduled transfers and jobs pending',
    },
    { id: 'other', label: 'anything else', match: /^/, scale: 'fixed', bound: '' },
  ]
}

interface ClassStats {
  keys: number
  /** MEMORY USAGE ... SAMPLES 0, summed. */
  bytes: number
  /** Stream entries, set and sorted set members, hash fields. */
  elements: number
  withoutTtl: number
  minTtlMs: number | null
  maxTtlMs: number | null
  /** A few key names. */
  examples: string[]
}

interface KeySnapshot {
  keys: number
  bytes: number
  classes: Record<string, ClassStats>
  /** Key names per class, for the deletion cross-check. */
  names: Record<string, string[]>
}

const LENGTH: Record<string, string | undefined> = {
  stream: 'XLEN',
  zset: 'ZCARD',
  set: 'SCARD',
  hash: 'HLEN',
  list: 'LLEN',
}

/** Every key under `prefix`: MEMORY USAGE ... SAMPLES 0, TTL and length, by key class. */
async function snapshotKeys(redis: Redis, prefix: string, classes: KeyClass[]): Promise<KeySnapshot> {
  const snapshot: KeySnapshot = { keys: 0, bytes: 0, classes: {}, names: {} }
  for (const c of classes) {
    snapshot.names[c.id] = []
    snapshot.classes[c.id] = {
      keys: 0,
      bytes: 0,
      elements: 0,
      withoutTtl: 0,
      minTtlMs: null,
      maxTtlMs: null,
      examples: [],
    }
  }
  let cursor = '0'
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
    cursor = next
    if (keys.length === 0) continue
    const types = (await redis.pipeline(keys.map((k) => ['type', k])).exec())!.map(([, t]) => String(t))
    const batch = redis.pipeline()
    keys.forEach((key, i) => {
      batch.call('MEMORY', 'USAGE', key, 'SAMPLES', '0')
      batch.pttl(key)
      const length = LENGTH[types[i]!]
      if (length) batch.call(length, key)
      else batch.exists(key)
    })
    const replies = (await batch.exec())!.map(([, value]) => Number(value ?? 0))
    keys.forEach((key, i) => {
      const [bytes, ttl, length] = replies.slice(3 * i, 3 * i + 3) as [number, number, number]
      if (ttl === -2) return // expired between SCAN and MEMORY USAGE
      const keyClass = classes.find((c) => c.match.test(key.slice(prefix.length)))!
      const stats = snapshot.classes[keyClass.id]!
      stats.keys++
      stats.bytes += bytes
      if (LENGTH[types[i]!]) stats.elements += length
      if (ttl < 0) stats.withoutTtl++
      else {
        stats.minTtlMs = Math.min(stats.minTtlMs ?? ttl, ttl)
        stats.maxTtlMs = Math.max(stats.maxTtlMs ?? ttl, ttl)
      }
      if (stats.examples.length < 3) stats.examples.push(key)
      snapshot.names[keyClass.id]!.push(key)
      snapshot.keys++
      snapshot.bytes += bytes
    })
  } while (cursor !== '0')
  return snapshot
}

async function memoryInfo(redis: Redis) {
  const info = await redis.info('memory')
  const field = (name: string) => Number(new RegExp(`^${name}:(\\d+)`, 'm').exec(info)![1])
  return {
    usedMemory: field('used_memory'),
    dataset: field('used_memory_dataset'),
    overhead: field('used_memory_overhead'),
    clients: field('mem_clients_normal'),
    scripts: field('used_memory_scripts'),
  }
}

/**
 * used_memory given back by deleting each class's keys (DEL frees at once), with the gateway stopped
 * so that nothing else writes meanwhile: what each class costs Redis, its keys' entries in the
 * keyspace and expires dictionaries included.
 */
async function freedByClass(redis: Redis, names: Record<string, string[]>): Promise<Record<string, number>> {
  const freed: Record<string, number> = {}
  for (const [id, keys] of Object.entries(names)) {
    if (keys.length === 0) continue
    const before = (await memoryInfo(redis)).usedMemory
    for (let i = 0; i < keys.length; i += 500) await redis.del(...keys.slice(i, i + 500))
    freed[id] = before - (await memoryInfo(redis)).usedMemory
  }
  return freed
}

/** Database 15 of the private redis-server, empty; flushed when `measure` is done. */
async function inScratch<T>(redisUrl: string, measure: (scratch: Redis) => Promise<T>): Promise<T> {
  const scratch = new Redis(redisUrl, { db: 15 })
  try {
    if ((await scratch.dbsize()) !== 0) throw new Error('database 15 of the bench Redis is not empty')
    return await measure(scratch)
  } finally {
    await scratch.flushdb()
    scratch.disconnect()
  }
}

const usage = async (redis: Redis, key: string) =>
  Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'))

/** Writes `count` commands in pipelines of 1000. */
async function pipelined(
  redis: Redis,
  count: number,
  add: (batch: ReturnType<Redis['pipeline']>, i: number) => void,
) {
  for (let start = 0; start < count; start += 1000) {
    const batch = redis.pipeline()
    for (let i = start; i < Math.min(count, start + 1000); i++) add(batch, i)
    await batch.exec()
  }
}

/**
 * A stream of one real entry's fields appended 2 x `cap` times with MAXLEN ~ cap: approximate
 * trimming in its steady state, as a stream at its retention stays.
 */
const streamAtCap = (redisUrl: string, fields: string[], cap: number) =>
  inScratch(redisUrl, async (scratch) => {
    await pipelined(scratch, 2 * cap, (batch) => batch.xadd('s', 'MAXLEN', '~', String(cap), '*', ...fields))
    const bytes = await usage(scratch, 's')
    const entries = await scratch.xlen('s')
    return { cap, entries, bytes, bytesPerEntry: bytes / entries }
  })

/**
 * What a key costs used_memory beyond its MEMORY USAGE: its entry in the expires dictionary and its
 * share of both dictionaries' bucket arrays, over LARGE small keys with a TTL.
 */
const keyOverhead = (redisUrl: string) =>
  inScratch(redisUrl, async (scratch) => {
    const used = async () => (await memoryInfo(scratch)).usedMemory
    const before = await used()
    await pipelined(scratch, LARGE, (batch, i) => batch.set(`k:{${i}}`, 'x', 'PX', 86_400_000))
    return ((await used()) - before) / LARGE - (await usage(scratch, 'k:{0}'))
  })

/**
 * Per member: a leaderboard board of LARGE senders (10-digit members, negated integer volumes) and a
 * set of LARGE counted event ids (8-digit integers, as ids are once millions of transfers were made);
 * and a dense HyperLogLog (the most one takes).
 */
const largeCollections = (redisUrl: string) =>
  inScratch(redisUrl, async (scratch) => {
    await pipelined(scratch, LARGE, (batch, i) =>
      batch
        .zadd('board', -(1 + ((i * 7919) % 1_000_000_000)), String(1_000_000 + i).padStart(10, '0'))
        .sadd('ids', String(10_000_000 + i))
        .pfadd('hll', String(i)),
    )
    return {
      members: LARGE,
      zsetBytesPerMember: (await usage(scratch, 'board')) / LARGE,
      setBytesPerMember: (await usage(scratch, 'ids')) / LARGE,
      denseHllBytes: await usage(scratch, 'hll'),
    }
  })

/** Runs `work(0..count-1)`, `width` at a time. */
async function inPool(count: number, width: number, work: (i: number) => Promise<void>): Promise<void> {
  let next = 0
  await Promise.all(
    Array.from({ length: Math.min(width, count) }, async () => {
      while (next < count) await work(next++)
    }),
  )
}

const fmtBytes = (bytes: number) => {
  if (bytes >= 2 ** 30) return `${(bytes / 2 ** 30).toFixed(2)} GiB`
  if (bytes >= 2 ** 20) return `${(bytes / 2 ** 20).toFixed(1)} MiB`
  if (bytes >= 2 ** 10) return `${(bytes / 2 ** 10).toFixed(1)} KiB`
  return `${Math.round(bytes)} B`
}
const fmtInt = (n: number) => Math.round(n).toLocaleString('en-US')

const sizing: Scenario = async ({ quick }) => {
  const customers = Number(process.env.SIZING_CUSTOMERS ?? (quick ? 100 : 300))
  const transfersEach = Number(process.env.SIZING_TRANSFERS ?? (quick ? 5 : 10))
  if (
    !(Number.isInteger(customers) && customers >= 2 && Number.isInteger(transfersEach) && transfersEach >= 1)
  )
    throw new Error('SIZING_CUSTOMERS must be an integer of 2 or more, SIZING_TRANSFERS of 1 or more')
  const started = performance.now()
  const services = await startBenchServices()
  const redis = new Redis(services.redisUrl)
  const db = new pg.Client({ connectionString: services.databaseUrl })
  let server: ServerHandle | undefined
  try {
    const env: Record<string, string> = {
      REDIS_URL: services.redisUrl,
      DATABASE_URL: services.databaseUrl,
      SESSION_SECRET: BENCH_SECRET,
      SEED_DEMO: 'false',
      SHUTDOWN_DRAIN: '0s',
      // Each customer comes from an address of its own, as clients behind a load balancer do: the
      // per-IP rate limits then keep a key per customer, the most they can cost.
      TRUST_PROXY: 'true',
      // The default (10 a minute) unless a customer makes more transfers than that in this run.
      ...(transfersEach > 10 ? { RATE_LIMIT_TRANSFERS: `${transfersEach}/60s` } : {}),
    }
    const config = loadConfig({ ...env, NODE_ENV: 'production' })
    const classes = keyClasses(config)
    server = await startServer(GATEWAY_ENTRY, env)
    const url = server.url
    await db.connect()
    const seeded = await seedCustomers(db, customers, 1_000_000_000)
    // The gateway has booted (consumer groups, scheduler): what the activity adds counts from here.
    const before = {
      memory: await memoryInfo(redis),
      keys: await snapshotKeys(redis, seeded.keyPrefix, classes),
    }

    const address = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`
    const cookies: string[] = []
    const call = async (i: number, method: string, path: string, expect: number, init: RequestInit = {}) => {
      const res = await fetch(`${url}${path}`, {
        ...init,
        method,
        headers: {
          'x-forwarded-for': address(i),
          ...(cookies[i] ? { cookie: cookies[i] } : {}),
          ...(init.headers as Record<string, string>),
        },
      })
      const body = await res.text()
      if (res.status !== expect) throw new Error(`${method} ${path}: ${res.status} ${body}`)
      return res
    }
    const readBalance = (i: number) => call(i, 'GET', `/accounts/${seeded.first + i}/balance`, 200)

    // Each customer: log in, read the balance, T transfers to random others, one after the other.
    const activityStarted = performance.now()
    await inPool(customers, IN_FLIGHT, async (i) => {
      const login = await call(i, 'POST', '/session', 200, {
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username: `load-${i + 1}`, password: BENCH_PASSWORD }),
      })
      cookies[i] = login.headers.getSetCookie()[0]!.split(';')[0]!
      await readBalance(i)
      for (let t = 0; t < transfersEach; t++) {
        const to = (i + 1 + Math.floor(Math.random() * (customers - 1))) % customers
        await call(i, 'POST', '/transfers', 201, {
          headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID() },
          body: JSON.stringify({
            fromAccountId: seeded.first + i,
            toAccountId: seeded.first + to,
            amount: 1 + Math.floor(Math.random() * 100_000),
            currency: 'VND',
          }),
        })
      }
    })
    const activitySec = (performance.now() - activityStarted) / 1000
    // The `ip` token buckets live until they refill (2 s with the defaults): seen only now.
    let ipBuckets = { keys: 0, bytes: 0 }
    for await (const keys of redis.scanStream({
      match: `${seeded.keyPrefix}rl:*:ip:*`,
      count: 1000,
    }) as AsyncIterable<string[]>)
      for (const key of keys)
        ipBuckets = { keys: ipBuckets.keys + 1, bytes: ipBuckets.bytes + (await usage(redis, key)) }

    // Every event relayed and handled by the four groups (notifier, leaderboard, daily totals, feed).
    const count = async (sql: string) => Number((await db.query<{ n: string }>(sql)).rows[0]!.n)
    const behind = async () => {
      const groups = (await redis.xinfo('GROUPS', seeded.keyPrefix + STREAM).catch(() => [])) as unknown[][]
      // Until every group the gateway reads the stream with exists, something is still to come.
      const missing = new Set(EVENT_GROUPS)
      let entries = 0
      for (const info of groups) {
        const fields = new Map<string, unknown>()
        for (let i = 0; i + 1 < info.length; i += 2) fields.set(String(info[i]), info[i + 1])
        missing.delete(String(fields.get('name')))
        entries += Number(fields.get('pending') ?? 0) + Number(fields.get('lag') ?? 0)
      }
      return entries + missing.size
    }
    const deadline = Date.now() + 60_000
    while ((await count('SELECT count(*) AS n FROM outbox_events')) > 0 || (await behind()) > 0) {
      if (Date.now() > deadline) throw new Error('the transfer events were not all handled within 60 s')
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    // Transfers to a customer dropped its cached balance: every customer reads it once more.
    await inPool(customers, IN_FLIGHT, async (i) => void (await readBalance(i)))

    const transfers = await count('SELECT count(*) AS n FROM transfers')
    const after = {
      memory: await memoryInfo(redis),
      keys: await snapshotKeys(redis, seeded.keyPrefix, classes),
    }

    // The gateway stopped, nothing else writes: each class's keys deleted in turn.
    await server.stop()
    server = undefined
    const notificationKey = after.keys.classes['notifications']!.examples[0]
    if (!notificationKey) throw new Error('no notification stream was written')
    const [notificationEntry] = await redis.xrange(notificationKey, '-', '+', 'COUNT', 1)
    const freed = await freedByClass(redis, after.keys.names)
    const emptied = { ...(await memoryInfo(redis)), keys: await redis.dbsize() }
    const notificationsCap = await streamAtCap(
      services.redisUrl,
      notificationEntry![1],
      config.events.notificationsRetention,
    )
    const large = await largeCollections(services.redisUrl)
    const perKeyOverhead = await keyOverhead(services.redisUrl)

    // Per class: what the activity added, per active customer or per transfer, and the examples.
    const transfersPerCustomer = transfers / customers
    const rows = classes.map((c) => {
      const a = after.keys.classes[c.id]!
      const b = before.keys.classes[c.id]!
      const bytesAdded = a.bytes - b.bytes
      const elementsAdded = a.elements - b.elements
      const memberBytes =
        c.large === 'zset' ? large.zsetBytesPerMember : c.large === 'set' ? large.setBytesPerMember : 0
      const units = c.scale === 'customer' ? customers : transfers
      // A large collection's members at their large encoding; anything else as measured.
      const perUnit = c.large ? (elementsAdded / units) * memberBytes : bytesAdded / units
      const entryBytes = c.scale === 'events' && a.elements ? a.bytes / a.elements : 0
      const at = (n: number) => {
        if (c.scale === 'customer') return perUnit * n
        if (c.scale === 'transfer') return perUnit * n * transfersPerCustomer
        if (c.scale === 'events')
          return entryBytes * Math.min(n * transfersPerCustomer, config.events.streamRetention)
        if (c.id === 'stats-distinct')
          return a.keys * Math.max(large.denseHllBytes, a.bytes / Math.max(1, a.keys))
        return a.bytes
      }
      const keysAt = (n: number) => {
        if (c.scale === 'customer') return ((a.keys - b.keys) / customers) * n
        if (c.scale === 'transfer') return ((a.keys - b.keys) / transfers) * n * transfersPerCustomer
        return a.keys
      }
      return {
        id: c.id,
        label: c.label,
        scale: c.scale,
        bound: c.bound,
        keys: a.keys,
        bytes: a.bytes,
        elements: a.elements,
        keysAdded: a.keys - b.keys,
        bytesAdded,
        withoutTtl: a.withoutTtl,
        ttlMs: { min: a.minTtlMs, max: a.maxTtlMs },
        examples: a.examples,
        freedByDel: freed[c.id] ?? 0,
        perCustomer: c.scale === 'customer' ? perUnit : undefined,
        perTransfer: c.scale === 'transfer' ? perUnit : c.scale === 'events' ? entryBytes : undefined,
        atScale: c.large !== undefined,
        examplesBytes: Object.fromEntries(EXAMPLES.map((n) => [n, at(n)])),
        examplesKeys: Object.fromEntries(EXAMPLES.map((n) => [n, keysAt(n)])),
      }
    })
    const present = rows.filter((r) => r.keys > 0)
    const sum = (pick: (r: (typeof rows)[number]) => number) => present.reduce((s, r) => s + pick(r), 0)
    const total = Object.fromEntries(EXAMPLES.map((n) => [n, sum((r) => r.examplesBytes[n]!)]))
    // used_memory: MEMORY USAGE plus each key's entries in the keyspace's dictionaries.
    const keysPerCustomer = sum((r) => (r.scale === 'customer' ? r.keysAdded / customers : 0))
    const keysPerTransfer = sum((r) => (r.scale === 'transfer' ? r.keysAdded / transfers : 0))
    const keyspace = Object.fromEntries(
      EXAMPLES.map((n) => [n, sum((r) => r.examplesKeys[n]!) * perKeyOverhead]),
    )
    const used = Object.fromEntries(EXAMPLES.map((n) => [n, total[n]! + keyspace[n]!]))
    const perCustomerTotal = sum((r) => r.perCustomer ?? 0)
    const perTransferTotal = sum((r) => (r.scale === 'transfer' ? r.perTransfer! : 0))
    const notifications = rows.find((r) => r.id === 'notifications')!
    const capPerCustomer = notificationsCap.bytesPerEntry * config.events.notificationsRetention
    const usedAtCap = Object.fromEntries(
      EXAMPLES.map((n) => [n, used[n]! - notifications.examplesBytes[n]! + capPerCustomer * n]),
    )
    const freedTotal = Object.values(freed).reduce((s, n) => s + n, 0)
    const usedDelta = after.memory.usedMemory - before.memory.usedMemory
    const usageDelta = after.keys.bytes - before.keys.bytes
    const keysDelta = after.keys.keys - before.keys.keys
    // Memory that stayed with every key deleted, beyond what the gateway's boot left.
    const outsideKeys = emptied.usedMemory - (before.memory.usedMemory - before.keys.bytes)

    const perKey = (bytes: number, keys: number) => (keys ? fmtInt(bytes / keys) : '')
    const table = formatTable(
      [
        'key class',
        'keys',
        'B/key',
        'B/key freed by DEL',
        'B per active customer',
        'B per transfer',
        'bound',
        ...EXAMPLES.map((n) => `${fmtInt(n)} customers`),
      ],
      [
        ...present.map((r) => [
          r.id === 'notifications'
            ? `${r.label}, ${(r.elements / r.keys).toFixed(1)} entries each`
            : r.id === 'events'
              ? `${r.label}, ${fmtInt(r.elements)} entries`
              : r.label,
          fmtInt(r.keys),
          perKey(r.bytes, r.keys),
          perKey(r.freedByDel, r.keys),
          r.perCustomer === undefined ? '' : `${fmtInt(r.perCustomer)}${r.atScale ? ' *' : ''}`,
          r.perTransfer === undefined ? '' : `${fmtInt(r.perTransfer)}${r.atScale ? ' *' : ''}`,
          r.bound + (r.withoutTtl && !/no TTL/.test(r.bound) ? `; ${fmtInt(r.withoutTtl)} without TTL` : ''),
          ...EXAMPLES.map((n) => fmtBytes(r.examplesBytes[n]!)),
        ]),
        [
          '**total** (MEMORY USAGE)',
          fmtInt(after.keys.keys),
          '',
          '',
          fmtInt(perCustomerTotal),
          fmtInt(perTransferTotal),
          `${transfersPerCustomer.toFixed(0)} transfers per customer, all within every TTL`,
          ...EXAMPLES.map((n) => fmtBytes(total[n]!)),
        ],
        [
          `keyspace: ${Math.round(perKeyOverhead)} B a key (its expires entry, buckets)`,
          '',
          '',
          '',
          fmtInt(keysPerCustomer * perKeyOverhead),
          fmtInt(keysPerTransfer * perKeyOverhead),
          `${keysPerCustomer.toFixed(1)} keys per customer, ${keysPerTransfer.toFixed(1)} per transfer`,
          ...EXAMPLES.map((n) => fmtBytes(keyspace[n]!)),
        ],
        [
          '**total in used_memory**',
          '',
          '',
          '',
          `**${fmtInt(perCustomerTotal + keysPerCustomer * perKeyOverhead)}**`,
          `**${fmtInt(perTransferTotal + keysPerTransfer * perKeyOverhead)}**`,
          '',
          ...EXAMPLES.map((n) => `**${fmtBytes(used[n]!)}**`),
        ],
        [
          `notifications streams at their cap instead (${fmtInt(config.events.notificationsRetention)} entries x ${Math.round(notificationsCap.bytesPerEntry)} B)`,
          '',
          '',
          '',
          fmtInt(capPerCustomer),
          '',
          'once customers have had NOTIFICATIONS_RETENTION notifications',
          ...EXAMPLES.map((n) => fmtBytes(capPerCustomer * n)),
        ],
        [
          '**total in used_memory, notifications streams at their cap**',
          '',
          '',
          '',
          `**${fmtInt(perCustomerTotal + keysPerCustomer * perKeyOverhead - notifications.perCustomer! + capPerCustomer)}**`,
          `**${fmtInt(perTransferTotal + keysPerTransfer * perKeyOverhead)}**`,
          '',
          ...EXAMPLES.map((n) => `**${fmtBytes(usedAtCap[n]!)}**`),
        ],
      ],
    )
    const withoutTtl = present.filter((r) => r.withoutTtl > 0)
    const markdown = [
      `${fmtInt(customers)} active customers, each from its own IP: a login, a balance read, ${transfersEach} ` +
        `transfers with an Idempotency-Key to random other customers (${fmtInt(transfers)} transfers, so ` +
        `${(2 * transfersPerCustomer).toFixed(0)} notifications per customer on average), every event handled, ` +
        'a balance read. Every feature on, default settings. Bytes: `MEMORY USAGE key SAMPLES 0` of every key, ' +
        'by key class: what the activity added, per active customer or per transfer (the events stream: per ' +
        `entry). The examples multiply them by the customers and by ${transfersPerCustomer.toFixed(0)} transfers ` +
        'per customer, all still within every TTL; the events stream stops at its cap. ' +
        `\\* a large collection's members: measured on ${fmtInt(LARGE)} members shaped like these (this run's ` +
        'small ones use compact encodings).',
      '',
      table,
      '',
      `Cross-check: used_memory grew ${fmtBytes(usedDelta)} with the activity: the new keys' MEMORY USAGE ` +
        `${fmtBytes(usageDelta)}, their keyspace entries ${fmtBytes(keysDelta * perKeyOverhead)} ` +
        `(${fmtInt(keysDelta)} keys x ${Math.round(perKeyOverhead)} B, measured on ${fmtInt(LARGE)} keys with a TTL), ` +
        `and ${fmtBytes(usedDelta - usageDelta - keysDelta * perKeyOverhead)} outside the keys. With the gateway ` +
        `stopped, deleting every key gave back ${fmtBytes(freedTotal)} (their MEMORY USAGE: ` +
        `${fmtBytes(after.keys.bytes)}; the column "freed by DEL" per class), and ${fmtBytes(outsideKeys)} more ` +
        "than after the gateway's start stayed with no key left: the keyspace's bucket arrays, the Lua scripts " +
        'the gateway loaded, buffers.',
      '',
      `Keys without a TTL: ${withoutTtl.map((r) => `${r.label} (${fmtInt(r.withoutTtl)})`).join(', ') || 'none'}. ` +
        `Notifications streams: ${fmtInt(notifications.bytes / Math.max(1, notifications.keys))} B each here, ` +
        'a 4 KB node preallocated with the first entry; one at its cap (MAXLEN ~ ' +
        `${config.events.notificationsRetention}: ${fmtInt(notificationsCap.entries)} entries) takes ` +
        `${fmtBytes(notificationsCap.bytes)}. Token buckets of the \`ip\` policy right after the load: ` +
        `${fmtInt(ipBuckets.keys)} keys of ${perKey(ipBuckets.bytes, ipBuckets.keys) || '-'} B, gone within 2 s.`,
    ].join('\n')

    const seconds = (performance.now() - started) / 1000
    console.error(
      `sizing: ${customers} customers, ${transfers} transfers, activity ${activitySec.toFixed(1)} s, total ${seconds.toFixed(1)} s`,
    )
    return {
      title: 'Sizing Redis: memory per active customer and per transfer',
      markdown,
      data: {
        customers,
        transfersPerCustomer: transfersEach,
        transfers,
        settings: {
          sessionIdleTimeoutMs: config.session.idleTimeoutMs,
          sessionAbsoluteTimeoutMs: config.session.absoluteTimeoutMs,
          cacheTtlMs: config.cache.ttlMs,
          eventsRetention: config.events.streamRetention,
          notificationsRetention: config.events.notificationsRetention,
          notificationsDedupMs: config.events.notificationsDedupMs,
          rateLimits: config.rateLimits,
        },
        classes: rows,
        perCustomer: perCustomerTotal,
        perTransfer: perTransferTotal,
        keysPerCustomer,
        keysPerTransfer,
        total,
        used,
        usedAtCap,
        notificationsAtCap: { stream: notificationsCap, perCustomer: capPerCustomer },
        largeCollections: large,
        ipBucketsAfterLoad: ipBuckets,
        usedMemory: {
          before: before.memory,
          after: after.memory,
          emptied,
          delta: usedDelta,
          memoryUsageDelta: usageDelta,
          keysDelta,
          freedByDeletingEveryKey: freedTotal,
          outsideKeys,
          perKeyOverhead,
        },
        activitySec,
        seconds,
      },
      ratios: [],
    }
  } finally {
    redis.disconnect()
    await db.end().catch(() => {})
    await server?.stop()
    await services.stop()
  }
}

export default sizing
