import { Redis } from 'ioredis'
import { processCpuSeconds, redisCpuSeconds } from './cpu-time.ts'
import { type LoadSpec, measure, redisCommandCount } from './runner.ts'

export interface RoundTrips {
  requests: number
  /** Commands the server under test sent to Redis per request (MONITOR, scripts' inner calls excluded). */
  redisSent: number
  /**
   * Sequential Redis round trips per request (commands in flight together count once), from a run
   * with one connection, when the server reports them (load/servers/chain.ts does).
   */
  redisRoundTrips?: number
  /** Commands Redis executed per request, including those scripts call (INFO commandstats delta). */
  redisExecuted: number
  /** CPU time of redis-server per request, in microseconds (INFO cpu delta): the Redis cost of a request. */
  redisCpuMicros: number
  /** CPU time of the server process per request, in microseconds (Linux /proc), when its pid is known. */
  serverCpuMicros?: number
  /** Postgres statements per request (BEGIN/COMMIT included), when the server reports them. */
  dbQueries?: number
  /** Postgres transactions per request, when the server reports them. */
  dbTransactions?: number
  /** Requests answered with anything but 2xx, or failed: a count that should be zero. */
  failures: number
}

interface BenchCounters {
  dbQueries: number
  dbTransactions?: number
  redisRoundTrips?: number
  /** Requests the server received: the divisor when present (autocannon's count misses those it cut off). */
  requests?: number
}

/** Bench servers answer GET /__bench/counters with their database counters; others have none. */
async function fetchCounters(url: string): Promise<BenchCounters | undefined> {
  const response = await fetch(`${url}/__bench/counters`).catch(() => undefined)
  if (!response?.ok) return undefined
  return (await response.json()) as BenchCounters
}

/**
 * The counters once the server is idle. autocannon stops sending at the end of a run but the
 * requests already in flight still run (a transfer commits after the client has gone); read
 * mid-flight, their work would be charged to the next window. Waits until two reads 100 ms apart
 * agree (at most 3 s).
 */
async function readCounters(url: string): Promise<BenchCounters | undefined> {
  let last = await fetchCounters(url)
  for (let waited = 0; last && waited < 3000; waited += 100) {
    await new Promise((resolve) => setTimeout(resolve, 100))
    const now = await fetchCounters(url)
    if (JSON.stringify(now) === JSON.stringify(last)) return now
    last = now
  }
  return last
}

/**
 * Work per request against a private Redis, in two short runs. The first counts what Redis
 * executed, the CPU Redis and the server spent and the Postgres statements. The second counts round
 * trips: MONITOR reports each command with its source, commands a script runs come from `lua`, so
 * the others are the commands the app sent. MONITOR slows Redis, hence its own run; both are
 * separate from the throughput runs.
 */
export async function roundTrips(
  redisUrl: string,
  url: string,
  spec: LoadSpec,
  options: { pid?: number } = {},
): Promise<RoundTrips> {
  const stats = new Redis(redisUrl)
  try {
    const run = { ...spec, durationSec: spec.durationSec ?? 2 }
    const countersBefore = await readCounters(url)
    const executedBefore = await redisCommandCount(stats)
    const redisCpuBefore = await redisCpuSeconds(stats)
    const serverCpuBefore = options.pid === undefined ? undefined : processCpuSeconds(options.pid)
    const sample = await measure(url, run)
    const serverCpuAfter = options.pid === undefined ? undefined : processCpuSeconds(options.pid)
    const redisCpu = (await redisCpuSeconds(stats)) - redisCpuBefore
    const executed = (await redisCommandCount(stats)) - executedBefore
    const countersAfter = await readCounters(url)
    const per = (n: number) => n / sample.requests
    const result: RoundTrips = {
      requests: sample.requests,
      redisSent: await sentPerRequest(stats, url, run),
      redisExecuted: per(executed),
      redisCpuMicros: per(redisCpu * 1e6),
      failures: sample.non2xx + sample.errors + sample.timeouts,
    }
    if (serverCpuBefore !== undefined && serverCpuAfter !== undefined) {
      result.serverCpuMicros = per((serverCpuAfter - serverCpuBefore) * 1e6)
    }
    const sequential = await roundTripsPerRequest(url, run)
    if (sequential !== undefined) result.redisRoundTrips = sequential
    if (countersBefore && countersAfter) {
      const served =
        countersBefore.requests !== undefined
          ? countersAfter.requests! - countersBefore.requests
          : sample.requests
      result.dbQueries = (countersAfter.dbQueries - countersBefore.dbQueries) / served
      if (countersBefore.dbTransactions !== undefined && countersAfter.dbTransactions !== undefined) {
        result.dbTransactions = (countersAfter.dbTransactions - countersBefore.dbTransactions) / served
      }
    }
    return result
  } finally {
    stats.disconnect()
  }
}

/** One connection, so the server's round-trip counter sees one request at a time. */
async function roundTripsPerRequest(url: string, spec: LoadSpec): Promise<number | undefined> {
  // The gateway counts round trips only when asked (counting costs a little per command).
  await fetch(`${url}/__bench/counters?roundTrips=on`).catch(() => undefined)
  const before = await readCounters(url)
  if (before?.redisRoundTrips === undefined) return undefined
  const sample = await measure(url, { ...spec, connections: 1 })
  const after = await readCounters(url)
  await fetch(`${url}/__bench/counters?roundTrips=off`)
  const served = before.requests !== undefined ? after!.requests! - before.requests : sample.requests
  return (after!.redisRoundTrips! - before.redisRoundTrips) / served
}

async function sentPerRequest(stats: Redis, url: string, spec: LoadSpec): Promise<number> {
  // A connection of its own in monitor mode, as stats.monitor() opens, but with its 'error'
  // listener on before it connects. ioredis switches to monitor mode a microtask after MONITOR's
  // reply: lines that arrive in the same read (a script's TIME on a busy Redis) and lines still
  // arriving while the connection closes find no command queued, and ioredis emits 'error' for
  // each. monitor() listens for one such error only, so a second one crashed the run. They come
  // before the count starts or after it is read: dropped.
  const monitor = stats.duplicate({ monitor: true, lazyConnect: true })
  monitor.on('error', () => {})
  const monitoring = new Promise((resolve) => monitor.once('monitoring', resolve))
  await monitor.connect()
  await monitoring
  let sent = 0
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (source !== 'lua' && args[0]?.toLowerCase() !== 'info') sent++
  })
  try {
    const sample = await measure(url, spec)
    // MONITOR lines trail the replies a little; wait for them before reading the count.
    await new Promise((resolve) => setTimeout(resolve, 300))
    return sent / sample.requests
  } finally {
    monitor.disconnect()
  }
}

/** Two decimals, or n/a when the server could not report the figure. */
export const perRequest = (value: number | undefined, digits = 2): string =>
  value === undefined ? 'n/a' : value.toFixed(digits)
