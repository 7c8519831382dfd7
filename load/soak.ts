// Soak: `npm run soak [-- --minutes 5]` (`-- --quick`: half a minute, a smoke run written to
// load/results/quick/). Mixed load (reads, transfers, duplicate keys, retries)
// against the gateway in its own process, on a private redis-server and a fresh database; then
// every invariant is checked, and the app's memory growth and Redis's key count are reported.
// Exits non-zero when an invariant fails or a Redis key has no TTL and docs/demo/redis-keys.md does not
// bound it otherwise.
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { Redis } from 'ioredis'
import { createPgDatabase } from '../src/db/database.ts'
import { migrate } from '../src/db/migrate.ts'
import { createCustomer } from '../test/helpers/gateway.ts'
import { TEST_SECRET } from '../test/helpers/index.ts'
import {
  type Actor,
  mixedLoad,
  moneyAndKeyInvariants,
  settle,
  type TransferAttempt,
} from '../test/helpers/mixed-load.ts'
import { keysBoundWithoutTtl } from './lib/redis-keys.ts'
import { startServer, writeResults } from './lib/runner.ts'
import { startBenchServices } from './lib/services.ts'

const { values } = parseArgs({
  options: { minutes: { type: 'string' }, quick: { type: 'boolean', default: false } },
})
const quick = values.quick
const minutes = Number(values.minutes ?? (quick ? 0.5 : 5))
if (!(minutes > 0)) throw new Error('--minutes must be a positive number')

const rssMiB = (pid: number) =>
  Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024

const services = await startBenchServices()
const db = createPgDatabase({ connectionString: services.databaseUrl })
const redis = new Redis(services.redisUrl)
try {
  await migrate(db)
  const customers = []
  for (let i = 0; i < 8; i++) customers.push(await createCustomer(db, `soak${i}`, [1_000_000_000]))
  const server = await startServer(new URL('./servers/gateway.ts', import.meta.url).pathname, {
    DATABASE_URL: services.databaseUrl,
    REDIS_URL: services.redisUrl,
    SESSION_SECRET: TEST_SECRET,
    SEED_DEMO: 'false',
    // Limits high enough that the soak measures the plugins' bookkeeping, not 429s.
    RATE_LIMIT_IP: '1000000,1000000',
    RATE_LIMIT_TRANSFERS: '1000000/60s',
    RATE_LIMIT_LOGIN: '1000000/60s',
  })
  try {
    const actors: Actor[] = []
    for (const c of customers) {
      const res = await fetch(`${server.url}/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username: c.username, password: c.password }),
      })
      actors.push({ cookie: res.headers.get('set-cookie')!.split(';')[0]!, accountId: c.accountIds[0]! })
    }
    const attempts: TransferAttempt[] = []
    const statuses = new Map<string, number>()
    const samples: Array<{ at: number; rssMiB: number; redisKeys: number }> = []
    const sample = async (at: number) =>
      samples.push({ at, rssMiB: rssMiB(server.pid), redisKeys: await redis.dbsize() })
    const start = Date.now()
    let batches = 0
    while (Date.now() - start < minutes * 60_000) {
      const report = await mixedLoad(() => server.url, actors, { requests: 2000, inFlight: 50 })
      attempts.push(...report.attempts)
      for (const [status, n] of report.statuses)
        statuses.set(String(status), (statuses.get(String(status)) ?? 0) + n)
      // The first batch warms the JIT and pools: memory growth is measured from there.
      await sample(Math.round((Date.now() - start) / 1000))
      console.error(
        `soak ${samples.at(-1)!.at}s: batch ${++batches}, rss ${samples.at(-1)!.rssMiB.toFixed(1)} MiB, redis keys ${samples.at(-1)!.redisKeys}`,
      )
    }
    await settle(() => server.url, attempts)
    const invariants = await moneyAndKeyInvariants(db, attempts)
    // A key without a TTL must be one that docs/demo/redis-keys.md bounds otherwise: capped, or a fixed
    // number per deployment or instance (the account filter, the streams, a lock's fence...).
    const boundWithoutTtl = keysBoundWithoutTtl()
    // The gateway's keys live under its database's identity; the documented patterns follow it.
    const [row] = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
    const prefix = `${row!.identity}:`
    let withoutTtl = 0
    const namesWithoutTtl: string[] = []
    for await (const keys of redis.scanStream({ count: 1000 })) {
      for (const key of keys as string[]) {
        if ((await redis.pttl(key)) !== -1) continue
        if (
          boundWithoutTtl.some((pattern) =>
            pattern.test(key.startsWith(prefix) ? key.slice(prefix.length) : key),
          )
        )
          continue
        withoutTtl++
        if (namesWithoutTtl.length < 20) namesWithoutTtl.push(key)
      }
    }
    if (withoutTtl)
      console.error(`keys without a TTL or another bound (first 20): ${namesWithoutTtl.join(' ')}`)
    const first = samples[0]!
    const last = samples.at(-1)!
    const report = {
      minutes,
      requests: [...statuses.values()].reduce((a, b) => a + b, 0),
      statuses: Object.fromEntries(statuses),
      transfersAttempted: attempts.length,
      invariants,
      memory: { afterWarmupMiB: first.rssMiB, endMiB: last.rssMiB, growthMiB: last.rssMiB - first.rssMiB },
      redis: {
        keysAfterWarmup: first.redisKeys,
        keysAtEnd: last.redisKeys,
        keysWithoutTtl: withoutTtl,
        namesWithoutTtl,
      },
      samples,
    }
    console.log(JSON.stringify(report, null, 2))
    const growth = report.memory.growthMiB.toFixed(1)
    const md = `Soak of ${minutes} min: ${report.requests} requests, ${attempts.length} transfers attempted; invariants ${JSON.stringify(invariants)}; app RSS ${first.rssMiB.toFixed(1)} -> ${last.rssMiB.toFixed(1)} MiB (${growth} MiB); Redis keys ${first.redisKeys} -> ${last.redisKeys}, ${withoutTtl} without a TTL or another documented bound.`
    console.log(`(${writeResults('soak', report, md, { quick }).md})`)
    const ok =
      invariants.totalUnchanged &&
      invariants.negativeBalances === 0 &&
      invariants.unbalancedTransfers === 0 &&
      invariants.accountsNotMatchingLedger === 0 &&
      invariants.keysRunTwice === 0 &&
      invariants.keysAnswered201WithoutRow === 0 &&
      withoutTtl === 0
    if (!ok) process.exitCode = 1
  } finally {
    await server.stop()
  }
} finally {
  redis.disconnect()
  await db.close()
  await services.stop()
}
