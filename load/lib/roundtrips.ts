import { Redis } from 'ioredis'
import { type LoadSpec, measure, redisCommandCount } from './runner.ts'

export interface RoundTrips {
  requests: number
  /** Commands the server under test sent to Redis per request: its round trips (MONITOR, scripts' inner calls excluded). */
  redisSent: number
  /** Commands Redis executed per request, including those scripts call (INFO commandstats delta). */
  redisExecuted: number
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
}

/** Bench servers answer GET /__bench/counters with their database counters; others have none. */
async function readCounters(url: string): Promise<BenchCounters | undefined> {
  const response = await fetch(`${url}/__bench/counters`).catch(() => undefined)
  if (!response?.ok) return undefined
  return (await response.json()) as BenchCounters
}

/**
 * Round trips per request for one short run against a private Redis. MONITOR reports each command
 * with its source, and commands a script runs come from `lua`: counting the others gives the
 * commands the app sent. MONITOR slows Redis, so this run is separate from the throughput runs.
 */
export async function roundTrips(redisUrl: string, url: string, spec: LoadSpec): Promise<RoundTrips> {
  const stats = new Redis(redisUrl)
  // monitor() opens a connection of its own; `stats` keeps doing the INFO reads.
  const monitor = await stats.monitor()
  let sent = 0
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (source !== 'lua' && args[0]?.toLowerCase() !== 'info') sent++
  })
  try {
    const countersBefore = await readCounters(url)
    const executedBefore = await redisCommandCount(stats)
    const sentBefore = sent
    const sample = await measure(url, { ...spec, durationSec: spec.durationSec ?? 2 })
    const executed = (await redisCommandCount(stats)) - executedBefore
    // MONITOR lines trail the replies a little; wait for them before reading the count.
    await new Promise((resolve) => setTimeout(resolve, 300))
    const sentDuring = sent - sentBefore
    const countersAfter = await readCounters(url)
    const per = (n: number) => n / sample.requests
    const result: RoundTrips = {
      requests: sample.requests,
      redisSent: per(sentDuring),
      redisExecuted: per(executed),
      failures: sample.non2xx + sample.errors + sample.timeouts,
    }
    if (countersBefore && countersAfter) {
      result.dbQueries = per(countersAfter.dbQueries - countersBefore.dbQueries)
      if (countersBefore.dbTransactions !== undefined && countersAfter.dbTransactions !== undefined) {
        result.dbTransactions = per(countersAfter.dbTransactions - countersBefore.dbTransactions)
      }
    }
    return result
  } finally {
    monitor.disconnect()
    stats.disconnect()
  }
}

/** Two decimals, without trailing noise from requests still in flight when a run ends. */
export const perRequest = (value: number | undefined): string =>
  value === undefined ? 'n/a' : value.toFixed(2)
