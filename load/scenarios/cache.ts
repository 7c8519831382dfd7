// GET /accounts/:id/balance through the gateway with the cache on against the same gateway with
// CACHE=off, interleaved; then a stampede: four gateway processes, each with 250 simultaneous reads
// of one cold balance, with the Postgres loads it caused across all of them and its p99.
import {
  type Contender,
  CPU_PER_REQUEST_NOTE,
  commandsPerRequest,
  cpuCell,
  formatTable,
  interleave,
  type LoadSpec,
  ratio,
  type ServerHandle,
  type Summary,
  startServer,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'
import {
  BENCH_SECRET,
  GATEWAY_ENTRY,
  loginDemo,
  stampede,
  startGateways,
  sumMetric,
} from '../servers/cache-cluster.ts'

const TARGET = 3

const cache: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  const servers: ServerHandle[] = []
  try {
    const env = {
      REDIS_URL: services.redisUrl,
      DATABASE_URL: services.databaseUrl,
      SESSION_SECRET: BENCH_SECRET,
      RATE_LIMITS: 'off',
    }
    // The first server migrates and seeds; the second starts on the same database after it.
    const cached = await startServer(GATEWAY_ENTRY, { ...env, CACHE: 'on' })
    servers.push(cached)
    const uncached = await startServer(GATEWAY_ENTRY, { ...env, CACHE: 'off' })
    servers.push(uncached)

    const durationSec = quick ? 1 : 5
    const balanceSpec = async (url: string): Promise<LoadSpec> => {
      const { cookie, accountId } = await loginDemo(url, 'alice')
      return { path: `/accounts/${accountId}/balance`, headers: { cookie }, connections: 50, durationSec }
    }
    const contenders: Contender[] = [
      { name: 'cache on', url: cached.url, pid: cached.pid, spec: await balanceSpec(cached.url) },
      { name: 'CACHE=off', url: uncached.url, pid: uncached.pid, spec: await balanceSpec(uncached.url) },
    ]
    const [on, off] = (await interleave(contenders, {
      rounds: quick ? 2 : 5,
      warmupSec: quick ? 1 : 2,
      label: 'cache',
      redisUrl: services.redisUrl,
    })) as [Summary, Summary]
    const balanceRatio = ratio(on, off)
    const redisPerRead = [
      await commandsPerRequest(services.redisUrl, cached.url, { ...contenders[0]!.spec, durationSec: 1 }),
      await commandsPerRequest(services.redisUrl, uncached.url, { ...contenders[1]!.spec, durationSec: 1 }),
    ]
    const loadsDuringRun = await sumMetric([cached.url], 'cache_loads_total{name="account"}')
    await Promise.all(servers.splice(0).map((s) => s.stop()))

    // Stampede on bob's balance, which nothing above has read: cold in Redis and in every process.
    const processes = 4
    const perProcess = 250
    const gateways = await startGateways(processes, { ...env, CACHE: 'on' })
    let storm: Awaited<ReturnType<typeof stampede>>
    let misses: number
    let waits: number
    try {
      const { cookie, accountId } = await loginDemo(gateways.urls[0]!, 'bob')
      storm = await stampede(gateways.urls, cookie, accountId, perProcess)
      misses = await sumMetric(gateways.urls, 'cache_misses_total{name="account"}')
      waits = await sumMetric(gateways.urls, 'cache_lease_waits_total{name="account"}')
    } finally {
      await gateways.stop()
    }

    const cell = (s: { median: number; min: number; max: number }, digits = 0) =>
      `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})`
    const bad = (s: Summary) => s.samples.reduce((n, x) => n + x.non2xx + x.errors + x.timeouts, 0)
    const markdown = [
      formatTable(
        [
          'GET /accounts/:id/balance',
          'req/s median (min-max)',
          'server CPU µs/req',
          'Redis CPU µs/req',
          'p99 ms median (min-max)',
          'Redis commands executed/req',
          'non-2xx or errors',
        ],
        [on, off].map((s, i) => [
          s.name,
          cell(s.rps),
          cpuCell(s.serverCpuMicros),
          cpuCell(s.redisCpuMicros),
          cell(s.p99),
          redisPerRead[i]!.toFixed(2),
          bad(s),
        ]),
      ),
      '',
      CPU_PER_REQUEST_NOTE,
      '',
      `Cache on / CACHE=off: **${balanceRatio.median.toFixed(2)}x** (min-max ${balanceRatio.min.toFixed(2)}-${balanceRatio.max.toFixed(2)}; target >= ${TARGET}x), medians of ${on.samples.length} interleaved pairs of ${durationSec} s, 50 connections. Balance loads from Postgres during the cached runs: ${loadsDuringRun}.`,
      '',
      formatTable(
        [
          'Stampede: one cold balance',
          'requests',
          'failed',
          'Postgres loads of the key',
          'processes that missed',
          'lease waits',
          'p99 ms',
        ],
        [
          [
            `${processes} processes x ${perProcess} simultaneous reads`,
            storm.requests,
            storm.failed,
            storm.loads,
            misses,
            waits,
            storm.p99Ms,
          ],
        ],
      ),
    ].join('\n')
    return {
      title: 'Cache-aside balance reads',
      markdown,
      data: {
        balance: { on, off, ratio: balanceRatio, target: TARGET, redisPerRead, loadsDuringRun },
        stampede: { processes, perProcess, ...storm, misses, waits },
      },
      ratios: [{ label: 'balance reads, cache on / off', ...balanceRatio, target: TARGET }],
    }
  } finally {
    await Promise.all(servers.map((s) => s.stop()))
    await services.stop()
  }
}

export default cache
