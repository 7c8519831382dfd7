// Our five algorithms, the fixed window in shadow mode and a concurrency policy, against @fastify/rate-limit (Redis store) and rate-limiter-flexible
// (RateLimiterRedis): same GET route, same key (client IP), same ioredis client options, a limit no
// run reaches, interleaved rounds. Then Redis round trips and commands per request (MONITOR and
// INFO commandstats on a private redis-server) and MEMORY USAGE of each algorithm's key, the
// sliding log at limit 100.
import { randomBytes } from 'node:crypto'
import { runEncoded } from '../../src/plugins/rate-limit/protocol.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import { roundTrips } from '../lib/roundtrips.ts'
import {
  type Contender,
  CPU_PER_REQUEST_NOTE,
  cpuCell,
  formatTable,
  interleave,
  ratio,
  type ServerHandle,
  startServer,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'
import { compareGenerators, generatorReport, measureWrk, WRK_MISSING, wrkAvailable } from '../lib/wrk.ts'

const ALGORITHMS = ['fixed-window', 'sliding-log', 'sliding-counter', 'token-bucket', 'gcra'] as const
/** The issue's targets: minimum throughput ratio against each peer. */
const COMPAT = 'compat/fastify-rate-limit (Redis, @fastify/rate-limit options)'
const TARGETS: Record<string, { fastify: number; flexible?: number }> = {
  [COMPAT]: { fastify: 1.3 },
  'fixed-window': { fastify: 1.2, flexible: 1.0 },
  gcra: { fastify: 1.2, flexible: 1.0 },
  'sliding-log': { fastify: 1.0 },
  'sliding-counter': { fastify: 1.0 },
  'token-bucket': { fastify: 1.0 },
}
const FASTIFY = '@fastify/rate-limit (Redis store)'
/** The fixed window in shadow mode: it must cost no more than enforcing (Redis and server CPU per request). */
const SHADOW = 'fixed-window (shadow)'
/** A concurrency slot taken and given back: it must cost no more Redis CPU per request than a token bucket. */
const CONCURRENCY = 'concurrency (take + give back)'
const FLEXIBLE = 'rate-limiter-flexible (RateLimiterRedis)'

const oursEntry = new URL('../servers/rate-limit-ours.ts', import.meta.url).pathname
const peersEntry = new URL('../servers/rate-limit-peers.ts', import.meta.url).pathname

/** MEMORY USAGE of one key per algorithm after `limit` requests at limit 100 (the log then holds 100 members). */
async function keyMemory(redisUrl: string): Promise<Record<string, number>> {
  // Measuring, not under test: a loaded machine must not time out these commands (500 ms by default).
  const redis = createRedisClient({ url: redisUrl, commandTimeoutMs: 10_000 })
  await connectRedis(redis)
  const nonce = randomBytes(6).toString('base64url')
  const sizes: Record<string, number> = {}
  try {
    for (const algorithm of ALGORITHMS) {
      const key = `mem:{${randomBytes(16).toString('base64url').slice(0, 22)}}:${algorithm}`
      const second = algorithm === 'token-bucket' ? 1 : 60_000
      for (let i = 0; i < 100; i++)
        await runEncoded(redis, algorithm, {
          keys: [key],
          argv: ['c', `${nonce}${i.toString(36)}`, 100, second, 1, 0],
        })
      sizes[algorithm] = Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'))
    }
  } finally {
    redis.disconnect()
  }
  return sizes
}

const fmt = (n: number, digits = 2) => n.toFixed(digits)

const rateLimitScenario: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  const servers: ServerHandle[] = []
  try {
    const env = { REDIS_URL: services.redisUrl }
    // One process per algorithm, like one per peer: on a shared machine a process that has just been
    // idle is scheduled ahead of one that has been busy, so a shared process would be handicapped.
    const ours: ServerHandle[] = []
    for (const _ of ALGORITHMS) {
      ours.push(await startServer(oursEntry, env))
      servers.push(ours[ours.length - 1]!)
    }
    const shadow = await startServer(oursEntry, env)
    servers.push(shadow)
    const concurrency = await startServer(oursEntry, env)
    servers.push(concurrency)
    const fastify = await startServer(peersEntry, { ...env, PEER: 'fastify-rate-limit' })
    servers.push(fastify)
    const flexible = await startServer(peersEntry, { ...env, PEER: 'rate-limiter-flexible' })
    servers.push(flexible)
    const compat = await startServer(peersEntry, { ...env, PEER: 'compat' })
    servers.push(compat)

    // Short slots and many rounds: the two runs of a pair are seconds apart, not half a minute.
    const spec = (path: string) => ({ path, connections: 50, durationSec: quick ? 1 : 3 })
    const contenders: Contender[] = [
      ...ALGORITHMS.map((a, i) => ({
        name: a,
        url: ours[i]!.url,
        pid: ours[i]!.pid,
        spec: spec(`/limited/${a}`),
      })),
      { name: SHADOW, url: shadow.url, pid: shadow.pid, spec: spec('/limited/shadow') },
      { name: CONCURRENCY, url: concurrency.url, pid: concurrency.pid, spec: spec('/limited/concurrency') },
      { name: FASTIFY, url: fastify.url, pid: fastify.pid, spec: spec('/limited/peer') },
      { name: FLEXIBLE, url: flexible.url, pid: flexible.pid, spec: spec('/limited/peer') },
      { name: COMPAT, url: compat.url, pid: compat.pid, spec: spec('/limited/peer') },
    ]
    const summaries = await interleave(contenders, {
      rounds: quick ? 1 : 8,
      warmupSec: quick ? 0.5 : 2,
      label: 'rate-limit',
      redisUrl: services.redisUrl,
    })
    const byName = new Map(summaries.map((s) => [s.name, s]))
    // The headline ratio again with wrk as the load generator: same placement, connections and rounds.
    const headline = contenders.filter((c) => c.name === 'fixed-window' || c.name === FASTIFY)
    const wrkSummaries = wrkAvailable
      ? await interleave(headline, {
          rounds: quick ? 1 : 8,
          warmupSec: quick ? 0.5 : 2,
          label: 'rate-limit (wrk)',
          measure: measureWrk,
          redisUrl: services.redisUrl,
        })
      : null
    const generators = wrkSummaries
      ? [
          compareGenerators(
            `fixed-window / ${FASTIFY}`,
            ratio(byName.get('fixed-window')!, byName.get(FASTIFY)!),
            ratio(wrkSummaries[0]!, wrkSummaries[1]!),
          ),
        ]
      : []
    const trips = new Map<string, Awaited<ReturnType<typeof roundTrips>>>()
    for (const c of contenders) {
      trips.set(
        c.name,
        await roundTrips(services.redisUrl, c.url, { ...c.spec, durationSec: quick ? 0.5 : 2 }),
      )
    }
    const memory = await keyMemory(services.redisUrl)

    const failures = summaries.reduce(
      (n, s) => n + s.samples.reduce((m, x) => m + x.non2xx + x.errors + x.timeouts, 0),
      0,
    )
    const rows = summaries.map((s) => {
      const target = TARGETS[s.name]
      const vs = (peer: string) => ratio(s, byName.get(peer)!)
      const cell = (peer: string, min?: number) => {
        if (!target) return '–'
        const r = vs(peer)
        const verdict = min === undefined ? '' : r.median >= min ? ` ≥ ${min} ✓` : ` < ${min} ✗`
        return `${fmt(r.median)} (${fmt(r.min)}–${fmt(r.max)})${verdict}`
      }
      const t = trips.get(s.name)!
      return [
        target ? `ours: ${s.name}` : s.name,
        `${Math.round(s.rps.median)} (${Math.round(s.rps.min)}–${Math.round(s.rps.max)})`,
        cpuCell(s.serverCpuMicros, 1),
        cpuCell(s.redisCpuMicros, 1),
        s.p99.median,
        cell(FASTIFY, target?.fastify),
        cell(FLEXIBLE, target?.flexible),
        fmt(t.redisSent),
        fmt(t.redisExecuted),
      ]
    })
    const enforcing = byName.get('fixed-window')!
    const shadowed = byName.get(SHADOW)!
    const over = (a?: { median: number }, b?: { median: number }) =>
      a && b ? a.median / b.median : Number.NaN
    const shadowCost = {
      redisCpu: over(shadowed.redisCpuMicros, enforcing.redisCpuMicros),
      serverCpu: over(shadowed.serverCpuMicros, enforcing.serverCpuMicros),
      redisCommands: trips.get(SHADOW)!.redisExecuted / trips.get('fixed-window')!.redisExecuted,
    }
    const bucket = byName.get('token-bucket')!
    const slots = byName.get(CONCURRENCY)!
    const concurrencyCost = {
      redisCpu: over(slots.redisCpuMicros, bucket.redisCpuMicros),
      redisCommands: trips.get(CONCURRENCY)!.redisExecuted / trips.get('token-bucket')!.redisExecuted,
    }
    const markdown = [
      formatTable(
        [
          'contender',
          'req/s median (min–max)',
          'server CPU µs/req',
          'Redis CPU µs/req',
          'p99 ms',
          `ratio vs ${FASTIFY}`,
          `ratio vs ${FLEXIBLE}`,
          'Redis round trips / req',
          'Redis commands executed / req',
        ],
        rows,
      ),
      '',
      `${quick ? 'Quick run: 1 round of 1 s' : '8 interleaved rounds of 3 s'}, 50 connections, one client IP, limit 10^9 per 10 s (nothing rejected; non-2xx/errors in the throughput runs: ${failures}). Ratios are the median over rounds of each round's ratio (min–max over rounds); round trips are commands the server sent (MONITOR), commands executed include those the scripts call. ${CPU_PER_REQUEST_NOTE}`,
      '',
      `Shadow mode against enforcing (fixed window, one policy, medians): Redis CPU per request ${fmt(shadowCost.redisCpu)}x, server CPU ${fmt(shadowCost.serverCpu)}x, Redis commands ${fmt(shadowCost.redisCommands)}x (target: Redis CPU and commands at most 1x, ${shadowCost.redisCpu <= 1.05 && shadowCost.redisCommands <= 1.01 ? '✓' : '✗'}; within 5 % of CPU and 1 % of commands, MONITOR's sampling, is noise).`,
      '',
      `Concurrency (a slot taken and given back per request) against the token bucket, medians: Redis CPU per request ${fmt(concurrencyCost.redisCpu)}x, Redis commands ${fmt(concurrencyCost.redisCommands)}x (target: Redis CPU at most 1x, ${concurrencyCost.redisCpu <= 1.05 ? '✓' : '✗'}; within 5 % is noise).`,
      '',
      formatTable(
        ['algorithm', 'MEMORY USAGE of one key after 100 requests at limit 100 (bytes)'],
        ALGORITHMS.map((a) => [a, memory[a]!]),
      ),
      '',
      wrkSummaries
        ? [
            formatTable(
              ['measured with wrk', 'req/s median (min–max)', 'p99 ms', 'non-2xx or errors'],
              wrkSummaries.map((s) => [
                s.name,
                `${Math.round(s.rps.median)} (${Math.round(s.rps.min)}–${Math.round(s.rps.max)})`,
                s.p99.median,
                s.samples.reduce((n, x) => n + x.non2xx + x.errors + x.timeouts, 0),
              ]),
            ),
            '',
            generatorReport(generators),
            `fixed-window / ${FASTIFY} with wrk: ${generators[0]!.wrk.median >= TARGETS['fixed-window']!.fastify ? `≥ ${TARGETS['fixed-window']!.fastify} ✓` : `< ${TARGETS['fixed-window']!.fastify} ✗`}.`,
          ].join('\n')
        : WRK_MISSING,
    ].join('\n')
    return {
      title: 'Rate limiting: our algorithms vs @fastify/rate-limit and rate-limiter-flexible',
      markdown,
      data: {
        summaries,
        roundTrips: Object.fromEntries(trips),
        memory,
        shadowCost,
        concurrencyCost,
        failures,
        wrk: wrkSummaries ? { summaries: wrkSummaries, generators } : { skipped: WRK_MISSING },
      },
    }
  } finally {
    for (const s of servers) await s.stop()
    await services.stop()
  }
}

export default rateLimitScenario
