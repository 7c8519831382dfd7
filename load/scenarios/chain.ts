// Balance reads through the gateway's whole chain (IP rate limit, session, cache hit) and through
// the three plugins alone on the bare route (load/servers/plugin-chain.ts) against the gateway's
// chain with the cache off, THE PEER STACK (load/peer/server.ts), a bare route returning the
// same JSON and that route with one Redis GET (the most a chain waiting on Redis once can reach),
// interleaved in one run; then Redis round trips and Postgres work per request for each,
// and for a transfer with a unique Idempotency-Key.
import { randomUUID } from 'node:crypto'
import type { RatioBar } from '../lib/chart.ts'
import { mib, processMemory } from '../lib/memory.ts'
import { perRequest, type RoundTrips, roundTrips } from '../lib/roundtrips.ts'
import {
  type Contender,
  CPU_PER_REQUEST_NOTE,
  cpuCell,
  formatTable,
  interleave,
  type LoadSpec,
  measure,
  median,
  ratio,
  type ServerHandle,
  type Summary,
  startServer,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'
import { compareGenerators, generatorReport, measureWrk, WRK_MISSING, wrkAvailable } from '../lib/wrk.ts'

const SECRET = 'bench-secret-0123456789-abcdefghijklmnop'
/** Throughput target of the chain over the peer stack. */
const PEER_TARGET = 2.5
/**
 * The chain's throughput over the bare route's, and its CPU per request (server and Redis) at most
 * 0.8x the one-GET route's. The bare route is bounded by the load generator, which shares the two
 * CPUs, so ratios to it move with the generator; the CPU per request beside them does not. Both
 * are judged on the gateway's chain and on the plugins alone on the bare route (what a user of the
 * plugins pays, without the gateway's metrics, parameter validation and logger).
 */
const BARE_TARGET = 0.6
const CPU_TARGET = 1 / 0.8
/** The session, buffered IP limit and cache plugins alone on the bare route. */
const PLUGINS = 'plugin chain, bare route'
/** The chain with the OpenTelemetry SDK and @fastify/otel on (load/lib/otel-sdk.ts). */
const OTEL = 'gateway chain, OpenTelemetry SDK on'
/** The chain with every decision on Redis (the IP bucket exact, no L1s), as before buffered mode. */
const EXACT_ENV = { RATE_LIMIT_IP_SYNC: 'exact', CACHE_L1_TTL: '0s', SESSION_L1_TTL: '0s' }

/** Per round, `a`'s CPU per request over `b`'s (server and Redis together). */
function cpuRatio(a: Summary, b: Summary) {
  const cpu = (s: Summary['samples'][number]) => (s.serverCpuMicros ?? 0) + (s.redisCpuMicros ?? 0)
  const ratios = a.samples.map((sample, i) => cpu(sample) / Math.max(1e-9, cpu(b.samples[i]!)))
  return { median: median(ratios), min: Math.min(...ratios), max: Math.max(...ratios), ratios }
}
/**
 * The gateway chain's environment, as `npm start` reads it: every limit active (its Redis work is
 * what is measured) but never rejecting, no background work.
 */
export const chainEnv = (services: { redisUrl: string; databaseUrl: string }): Record<string, string> => ({
  REDIS_URL: services.redisUrl,
  DATABASE_URL: services.databaseUrl,
  SESSION_SECRET: SECRET,
  RATE_LIMITS: 'on',
  // Every limit stays active (its Redis work is what we measure) but high enough never to reject.
  RATE_LIMIT_IP: '1000000000,1000000000',
  RATE_LIMIT_TRANSFERS: '1000000000/60s',
  RATE_LIMIT_LOGIN: '1000000/60s',
  // The transfer's outbox row is written; its relay and consumers (docs/demo/events.md, measured by the
  // events scenario) run elsewhere, so the counts below are the request's own.
  EVENT_WORKERS: 'off',
  // Nor do the scheduled-transfer workers poll in the background.
  SCHEDULER: 'off',
  // e.g. BENCH_GATEWAY_ENV='CACHE_L1_TTL=1s' to measure another gateway configuration.
  ...Object.fromEntries(
    (process.env.BENCH_GATEWAY_ENV ?? '')
      .split(/\s+/)
      .filter(Boolean)
      .map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]),
  ),
})

const entry = (path: string) => new URL(path, import.meta.url).pathname

async function login(url: string, username: string): Promise<{ cookie: string; customerId: number }> {
  const response = await fetch(`${url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username, password: 'demo-password' }),
  })
  const cookie = response.headers.getSetCookie()[0]?.split(';')[0]
  if (response.status !== 200 || !cookie) throw new Error(`login to ${url} failed: ${response.status}`)
  const { customerId } = (await response.json()) as { customerId: number }
  return { cookie, customerId }
}

async function firstAccountId(url: string, cookie: string): Promise<number> {
  const response = await fetch(`${url}/accounts`, { headers: { cookie } })
  const body = (await response.json()) as { accounts: Array<{ accountId: number }> }
  const id = body.accounts?.[0]?.accountId
  if (!id) throw new Error(`GET /accounts answered ${response.status}: ${JSON.stringify(body)}`)
  return id
}

/** A benchmark of 401s or 404s would measure the wrong thing: each target must answer 200 first. */
async function expectOk(contender: Contender): Promise<void> {
  const response = await fetch(contender.url + contender.spec.path, { headers: contender.spec.headers })
  if (response.status !== 200) {
    throw new Error(
      `${contender.name} answered ${response.status} on ${contender.spec.path}: ${await response.text()}`,
    )
  }
}

const spreadCell = (s: { median: number; min: number; max: number }, digits = 0) =>
  `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})`

const chain: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  const servers: ServerHandle[] = []
  try {
    const common = chainEnv(services)
    // The first gateway migrates and seeds; the others start after it, on the same database.
    const gateway = await startServer(entry('../servers/chain.ts'), { ...common, CACHE: 'on' })
    servers.push(gateway)
    const [exact, noCache, peer, bare, oneGet, otel, plugins] = await Promise.all([
      // Every decision on Redis: the IP bucket exact, no L1 for the cache or the sessions.
      startServer(entry('../servers/chain.ts'), { ...common, ...EXACT_ENV, CACHE: 'on' }),
      startServer(entry('../servers/chain.ts'), { ...common, CACHE: 'off' }),
      startServer(entry('../peer/server.ts'), common),
      startServer(entry('../servers/bare.ts')),
      startServer(entry('../servers/one-round-trip.ts'), { REDIS_URL: services.redisUrl }),
      // The same chain with the OpenTelemetry SDK and @fastify/otel: what tracing costs.
      startServer(entry('../servers/chain.ts'), { ...common, CACHE: 'on', OTEL_SDK: 'on' }),
      startServer(entry('../servers/plugin-chain.ts'), { REDIS_URL: services.redisUrl }),
    ])
    servers.push(exact, noCache, peer, bare, oneGet, otel, plugins)

    const alice = await login(gateway.url, 'alice')
    const bob = await login(gateway.url, 'bob')
    const accountId = await firstAccountId(gateway.url, alice.cookie)
    const bobAccountId = await firstAccountId(gateway.url, bob.cookie)
    const noCacheLogin = await login(noCache.url, 'alice')
    const exactLogin = await login(exact.url, 'alice')
    const peerLogin = await login(peer.url, 'alice')
    const otelLogin = await login(otel.url, 'alice')
    const pluginsCookie = (await fetch(`${plugins.url}/login`, { method: 'POST' })).headers
      .getSetCookie()[0]
      ?.split(';')[0]
    if (!pluginsCookie) throw new Error('the plugin chain gave no session cookie')
    const path = `/accounts/${accountId}/balance`
    const durationSec = quick ? 1 : 5
    const contenders: Contender[] = [
      {
        name: 'gateway chain',
        url: gateway.url,
        pid: gateway.pid,
        spec: { path, headers: { cookie: alice.cookie }, durationSec },
      },
      {
        name: 'gateway chain, exact',
        url: exact.url,
        pid: exact.pid,
        spec: { path, headers: { cookie: exactLogin.cookie }, durationSec },
      },
      {
        name: 'peer stack',
        url: peer.url,
        pid: peer.pid,
        spec: { path, headers: { cookie: peerLogin.cookie }, durationSec },
      },
      {
        name: 'gateway, cache off',
        url: noCache.url,
        pid: noCache.pid,
        spec: { path, headers: { cookie: noCacheLogin.cookie }, durationSec },
      },
      {
        name: PLUGINS,
        url: plugins.url,
        pid: plugins.pid,
        spec: { path: '/accounts/1/balance', headers: { cookie: pluginsCookie }, durationSec },
      },
      { name: 'bare route', url: bare.url, pid: bare.pid, spec: { path, durationSec } },
      { name: 'bare route + one Redis GET', url: oneGet.url, pid: oneGet.pid, spec: { path, durationSec } },
      {
        name: OTEL,
        url: otel.url,
        pid: otel.pid,
        spec: { path, headers: { cookie: otelLogin.cookie }, durationSec },
      },
    ]
    for (const c of contenders) await expectOk(c)

    const summaries = await interleave(contenders, {
      rounds: quick ? 2 : 5,
      warmupSec: quick ? 1 : 2,
      label: 'chain',
      redisUrl: services.redisUrl,
    })
    const by = (name: string) => summaries.find((s) => s.name === name) as Summary
    const [ours, allExact, theirs, uncached, floor, oneTrip] = [
      by('gateway chain'),
      by('gateway chain, exact'),
      by('peer stack'),
      by('gateway, cache off'),
      by('bare route'),
      by('bare route + one Redis GET'),
    ]
    // The headline ratios again with wrk as the load generator: same placement, connections and rounds.
    const wrkSummaries = wrkAvailable
      ? await interleave(
          contenders.filter((c) => c.name !== 'gateway, cache off' && c.name !== OTEL),
          {
            rounds: quick ? 2 : 5,
            warmupSec: quick ? 1 : 2,
            label: 'chain (wrk)',
            measure: measureWrk,
            redisUrl: services.redisUrl,
          },
        )
      : null
    const byWrk = (name: string) => wrkSummaries!.find((s) => s.name === name) as Summary

    const transferSpec: LoadSpec = {
      method: 'POST',
      path: '/transfers',
      headers: { cookie: alice.cookie, 'content-type': 'application/json' },
      body: JSON.stringify({
        fromAccountId: accountId,
        toAccountId: bobAccountId,
        amount: 1,
        currency: 'VND',
      }),
      setupRequest: (request) => ({
        ...request,
        headers: { ...request.headers, 'idempotency-key': randomUUID() },
      }),
      connections: 10,
      durationSec: quick ? 1 : 2,
    }
    const tripSpec = (c: Contender): LoadSpec => ({ ...c.spec, connections: 10, durationSec: quick ? 1 : 2 })
    const trips: Array<{ label: string; trips: RoundTrips; target?: string; met?: boolean }> = []
    const pids = new Map(servers.map((s) => [s.url, s.pid]))
    const countTrips = async (label: string, url: string, spec: LoadSpec) => {
      const counted = await roundTrips(services.redisUrl, url, spec, { pid: pids.get(url) })
      console.error(
        `chain work, ${label}: ${perRequest(counted.redisRoundTrips)} Redis round trips, ${perRequest(counted.redisSent)} commands sent, ${perRequest(counted.dbQueries)} SQL per request over ${counted.requests} requests`,
      )
      trips.push({ label, trips: counted })
    }
    for (const c of contenders) await countTrips(`balance, ${c.name}`, c.url, tripSpec(c))
    // The transfer path has not run yet: compile and warm it before its work is counted.
    await measure(gateway.url, { ...transferSpec, durationSec: 1 })
    await countTrips('transfer, gateway chain (unique keys)', gateway.url, transferSpec)
    // In steady state the chain sends nothing: a lease of the IP bucket now and then, and the
    // heartbeat; the exact chain waits on Redis once.
    const tripTarget = (label: string, most: number) => {
      const row = trips.find((t) => t.label === label)!
      row.target = `<= ${most} round trips, 0 Postgres statements`
      row.met =
        (row.trips.redisRoundTrips ?? Number.POSITIVE_INFINITY) <= most + 0.005 &&
        (row.trips.dbQueries ?? Number.POSITIVE_INFINITY) <= 0.005
    }
    tripTarget('balance, gateway chain', 0.05)
    // The plugin chain's server counts no round trips: judged on the commands it sent.
    const pluginTrips = trips.find((t) => t.label === `balance, ${PLUGINS}`)!
    pluginTrips.target = '<= 0.05 Redis commands sent'
    pluginTrips.met = pluginTrips.trips.redisSent <= 0.055
    tripTarget('balance, gateway chain, exact', 1)
    const transferTrips = trips[trips.length - 1]!
    transferTrips.target = '<= 4 round trips, 1 Postgres statement'
    transferTrips.met =
      (transferTrips.trips.redisRoundTrips ?? Number.POSITIVE_INFINITY) <= 4.05 &&
      (transferTrips.trips.dbQueries ?? 2) <= 1.01

    // Every server's resident memory after all of its runs (balance reads, then transfers on the gateway).
    const serverMemory = [
      { name: 'gateway chain', memory: processMemory(gateway.pid) },
      { name: 'gateway chain, exact', memory: processMemory(exact.pid) },
      { name: PLUGINS, memory: processMemory(plugins.pid) },
      { name: 'gateway, cache off', memory: processMemory(noCache.pid) },
      { name: 'peer stack', memory: processMemory(peer.pid) },
      { name: 'bare route', memory: processMemory(bare.pid) },
      { name: 'bare route + one Redis GET', memory: processMemory(oneGet.pid) },
    ]

    const ratios: RatioBar[] = [
      { label: 'gateway chain / peer stack', ...ratio(ours, theirs), target: PEER_TARGET },
      { label: 'gateway chain / cache off', ...ratio(ours, uncached) },
      { label: 'gateway chain / bare route', ...ratio(ours, floor), target: BARE_TARGET },
      { label: 'gateway chain, exact / peer stack', ...ratio(allExact, theirs) },
      // CPU per request, server and Redis together, inverted so that more is better like every bar.
      { label: `one-GET route CPU / ${PLUGINS} CPU`, ...cpuRatio(oneTrip, by(PLUGINS)), target: CPU_TARGET },
      { label: `${PLUGINS} / bare route`, ...ratio(by(PLUGINS), floor), target: BARE_TARGET },
      { label: 'one-GET route CPU / gateway chain CPU', ...cpuRatio(oneTrip, ours), target: CPU_TARGET },
      { label: 'one-GET route CPU / gateway chain, exact CPU', ...cpuRatio(oneTrip, allExact) },
      { label: 'peer stack / bare route', ...ratio(theirs, floor) },
      // The ceiling of chain / bare route on this machine: a route that only waits on Redis once.
      { label: 'bare route + one Redis GET / bare route', ...ratio(oneTrip, floor) },
      { label: 'gateway chain / bare route + one Redis GET', ...ratio(ours, oneTrip) },
      // What tracing costs: the chain with the SDK and @fastify/otel against the same chain without.
      { label: 'gateway chain, OpenTelemetry SDK on / gateway chain', ...ratio(by(OTEL), ours) },
      { label: 'gateway chain CPU / gateway chain, OpenTelemetry SDK on CPU', ...cpuRatio(ours, by(OTEL)) },
    ]
    const generators = wrkSummaries
      ? [
          compareGenerators(
            'gateway chain / peer stack',
            ratio(ours, theirs),
            ratio(byWrk('gateway chain'), byWrk('peer stack')),
          ),
          compareGenerators(
            'gateway chain / bare route',
            ratio(ours, floor),
            ratio(byWrk('gateway chain'), byWrk('bare route')),
          ),
          compareGenerators(
            'peer stack / bare route',
            ratio(theirs, floor),
            ratio(byWrk('peer stack'), byWrk('bare route')),
          ),
          compareGenerators(
            'bare route + one Redis GET / bare route',
            ratio(oneTrip, floor),
            ratio(byWrk('bare route + one Redis GET'), byWrk('bare route')),
          ),
        ]
      : []
    // wrk's ratios are charted and judged beside autocannon's, against the same targets.
    for (const g of generators) {
      const target = ratios.find((r) => r.label === g.label)?.target
      ratios.push({ label: `${g.label} (wrk)`, ...g.wrk, ...(target ? { target } : {}) })
    }
    const p99NoWorse = ours.p99.median <= theirs.p99.median
    const failures = [
      ...summaries,
      ...(wrkSummaries ?? []).map((s) => ({ ...s, name: `${s.name} (wrk)` })),
    ].flatMap((s) => (s.samples.some((x) => x.non2xx + x.errors + x.timeouts) ? [s.name] : []))

    const throughputTable = formatTable(
      [
        'stack',
        'req/s median (min-max)',
        'server CPU µs/req',
        'Redis CPU µs/req',
        'p99 ms median (min-max)',
        'non-2xx or errors',
      ],
      summaries.map((s) => [
        s.name,
        spreadCell(s.rps),
        cpuCell(s.serverCpuMicros),
        cpuCell(s.redisCpuMicros),
        spreadCell(s.p99, 1),
        s.samples.reduce((n, x) => n + x.non2xx + x.errors + x.timeouts, 0),
      ]),
    )
    const ratioTable = formatTable(
      ['ratio of req/s', 'median', 'min', 'max', 'target'],
      ratios.map((r) => [
        r.label,
        `${r.median.toFixed(2)}x`,
        `${r.min.toFixed(2)}x`,
        `${r.max.toFixed(2)}x`,
        r.target ? `>= ${r.target}x: ${r.median >= r.target ? 'met' : 'NOT met'}` : '',
      ]),
    )
    const tripTable = formatTable(
      [
        'request',
        'Redis round trips/req (1 connection)',
        'Redis commands sent/req',
        'Redis commands executed/req',
        'Redis CPU µs/req',
        'server CPU µs/req',
        'Postgres statements/req',
        'Postgres transactions/req',
        'requests (non-2xx)',
        'target',
      ],
      trips.map((t) => [
        t.label,
        perRequest(t.trips.redisRoundTrips),
        perRequest(t.trips.redisSent),
        perRequest(t.trips.redisExecuted),
        perRequest(t.trips.redisCpuMicros, 0),
        perRequest(t.trips.serverCpuMicros, 0),
        perRequest(t.trips.dbQueries),
        perRequest(t.trips.dbTransactions),
        `${t.trips.requests} (${t.trips.failures})`,
        t.target ? `${t.target}: ${t.met ? 'met' : 'NOT met'}` : '',
      ]),
    )
    const wrkTable = wrkSummaries
      ? formatTable(
          [
            'stack, measured with wrk',
            'req/s median (min-max)',
            'server CPU µs/req',
            'Redis CPU µs/req',
            'p99 ms median (min-max)',
            'non-2xx or errors',
          ],
          wrkSummaries.map((s) => [
            s.name,
            spreadCell(s.rps),
            cpuCell(s.serverCpuMicros),
            cpuCell(s.redisCpuMicros),
            spreadCell(s.p99, 1),
            s.samples.reduce((n, x) => n + x.non2xx + x.errors + x.timeouts, 0),
          ]),
        )
      : ''
    const memoryTable = formatTable(
      ['server RSS after the runs (VmRSS)', 'RSS', 'peak (VmHWM)'],
      serverMemory.map((m) => [m.name, mib(m.memory?.rssBytes), mib(m.memory?.peakRssBytes)]),
    )
    const markdown = [
      throughputTable,
      '',
      CPU_PER_REQUEST_NOTE,
      '',
      ratioTable,
      '',
      wrkSummaries ? wrkTable : WRK_MISSING,
      '',
      wrkSummaries ? generatorReport(generators) : '',
      '',
      `p99 of the gateway chain ${ours.p99.median} ms vs the peer stack ${theirs.p99.median} ms: ${p99NoWorse ? 'no worse' : 'WORSE'}.`,
      failures.length ? `Non-2xx responses or errors in: ${failures.join(', ')}.` : '',
      '',
      tripTable,
      '',
      'Round trips: sequential waits on Redis per request (commands in flight together count once), counted ' +
        'by the server over a run with one connection (the peer and bare servers do not report them); ' +
        'sent: commands the server sent (Redis MONITOR, commands run inside scripts excluded); ' +
        'executed: everything Redis ran, script-internal calls included (INFO commandstats); ' +
        'CPU: redis-server (INFO cpu) and the server process (/proc) per request, steadier than req/s on a shared machine. ' +
        `From separate ${quick ? 1 : 2} s runs at 10 connections (MONITOR and the one-connection run each on their own).`,
      '',
      memoryTable,
    ]
      .filter((line, i, all) => line !== '' || all[i - 1] !== '')
      .join('\n')
    return {
      title: `Balance reads: the whole chain vs the peer stack${quick ? ' (quick)' : ''}`,
      markdown,
      ratios,
      data: {
        summaries,
        ratios,
        p99NoWorse,
        roundTrips: trips,
        wrk: wrkSummaries ? { summaries: wrkSummaries, generators } : { skipped: WRK_MISSING },
        serverMemory,
        gatewayEnv: process.env.BENCH_GATEWAY_ENV ?? '',
        peerCache: process.env.PEER_CACHE ?? 'multitier',
      },
    }
  } finally {
    await Promise.allSettled(servers.map((s) => s.stop()))
    await services.stop()
  }
}

export default chain
