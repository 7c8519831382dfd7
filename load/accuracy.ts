// The accuracy curve of buffered rate limiting: `npm run bench:accuracy [-- --quick]`
// (docs/rate-limit.md, "Buffered mode"). On a private redis-server (so INFO commandstats counts only
// this run), N instances (load/servers/rate-limit-accuracy.ts, each its own process and client, one
// key prefix per group) share ONE key with a limit of 200 per 1000 ms. The driver sends a known
// demand, 2.5x the limit, open loop and round-robin over the instances: steady (one request every
// 2 ms) or bursty (50 at once every 100 ms). Per fixed window (grouped by the window each admission
// was counted in), admitted vs limit: over-admission max(0, admitted - limit) / limit, and, when the
// demand in the window exceeded the limit, under-admission max(0, limit - admitted) / limit. Redis
// commands per request: CONFIG RESETSTAT before a run, INFO commandstats after it (every command
// Redis executed, scripts' inner calls included, INFO and CONFIG excluded; the driver sends nothing
// else), over the requests sent. Settings: exact, and sync 100 ms / batch 50, 250 ms / 100 and
// 1000 ms / 500, at 1, 2, 4 and 8 instances. Faults at 4 instances: a fifth instance joining mid-run
// and one instance SIGKILLed mid-window. Token bucket and GCRA at 4 instances: admitted vs what the
// refill allows over the run, and commands per request. Writes load/results/accuracy.{json,md,svg}
// (--quick: fewer settings, shorter runs, to load/results/quick/). Exits 1 when an invariant fails:
// any answer other than 200/429 (or a degraded one, or no answer outside a killed instance), a
// fixed-window row without fault over its limit by more than 0.5 %, or a run with no whole window.
import { writeFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { Redis } from 'ioredis'
import { startRedisServer } from '../src/embedded/redis-server.ts'
import {
  drive,
  fixedWindows,
  type RunEvent,
  type Shot,
  type Target,
  type Traffic,
  target,
  type WindowRow,
} from './lib/accuracy-load.ts'
import { type LineSeries, lineCharts } from './lib/chart.ts'
import { pinLoadGenerator, placement } from './lib/cpus.ts'
import {
  formatTable,
  resultsDir,
  type ServerHandle,
  startServer,
  stopAllServers,
  writeResults,
} from './lib/runner.ts'

const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false } } })
const quick = values.quick

const LIMIT = 200
const WINDOW_MS = 1000
const DEMAND = 2.5
const RATE = (DEMAND * LIMIT * 1000) / WINDOW_MS
const BURST_EVERY_MS = 100
const RUN_MS = quick ? 2_200 : 6_000
const FAULT_RUN_MS = quick ? 3_500 : 8_000
/**
 * When the fault is injected: 150 ms into a window (windows start about every WINDOW_MS from the
 * run's start). At 2.5x demand the limit is reached 400 ms into each window: a fault later than
 * that finds every lease spent, and shows nothing.
 */
const FAULT_AT_MS = quick ? 1_150 : 3_150
/** Over-admission a fixed-window row without fault may show (one request in 200). */
const OVER_TOLERANCE_PCT = 0.5

type Algorithm = 'fixed-window' | 'token-bucket' | 'gcra'
interface Setting {
  name: string
  /** ACC_SYNC: 'off', or '<intervalMs>:<batch>'. */
  sync: string
}
const SETTINGS: Setting[] = [
  { name: 'exact', sync: 'off' },
  { name: 'sync 100 ms / batch 50', sync: '100:50' },
  { name: 'sync 250 ms / batch 100', sync: '250:100' },
  { name: 'sync 1000 ms / batch 500', sync: '1000:500' },
]
const QUICK_SETTINGS = [SETTINGS[0]!, SETTINGS[2]!]
const settings = quick ? QUICK_SETTINGS : SETTINGS
const INSTANCE_COUNTS = quick ? [2] : [1, 2, 4, 8]
const FAULT_INSTANCES = 4
const TRAFFICS: Traffic[] = ['steady', 'bursty']

type Fault = 'join' | 'kill'

interface RunResult {
  algorithm: Algorithm
  setting: string
  instances: number
  traffic: Traffic
  fault?: Fault
  requests: number
  admitted: number
  refused: number
  /** Answers other than 200/429, degraded answers, and requests with no answer (a killed instance's excepted). */
  failures: number
  /** Requests to the killed instance left without an answer. */
  lost: number
  /** Admissions answered with resetMs 0 (their window had ended when decided). */
  admittedAtWindowEnd: number
  commandsPerRequest: number
  scriptCallsPerRequest: number
  commands: Record<string, number>
  /** Fixed window: whole windows of the run, and the worst and mean over/under-admission (%). */
  windows?: WindowRow[]
  overMaxPct?: number
  underMaxPct?: number
  overMeanPct?: number
  underMeanPct?: number
  /** The same grouping by decision time (an independent check, ±1 ms at the window edges). */
  overByDecisionMaxPct?: number
  /** Fault runs: the worst in the windows from the fault to three heartbeats (3 s) after it. */
  affected?: { windows: number; overMaxPct: number; underMaxPct: number }
  /** Token bucket, GCRA: admitted over limit + refill over the run's span. */
  expected?: number
  admittedVsExpected?: number
}

const round = (x: number, digits = 2) => Math.round(x * 10 ** digits) / 10 ** digits

async function commandStats(redis: Redis): Promise<Record<string, number>> {
  const info = await redis.info('commandstats')
  const calls: Record<string, number> = {}
  for (const match of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm))
    if (match[1] !== 'info' && match[1] !== 'config' && !match[1]!.startsWith('config|'))
      calls[match[1]!] = Number(match[2])
  return calls
}

const SCRIPT_CALLS = new Set(['evalsha', 'eval', 'evalsha_ro', 'eval_ro', 'fcall', 'fcall_ro'])

interface Group {
  servers: ServerHandle[]
  targets: Target[]
  env: Record<string, string>
  instances: number
}

let groupCount = 0
async function startGroup(
  redisUrl: string,
  algorithm: Algorithm,
  setting: Setting,
  n: number,
): Promise<Group> {
  const env = {
    REDIS_URL: redisUrl,
    ACC_KEY_PREFIX: `acc:${groupCount++}:`,
    ACC_ALGORITHM: algorithm,
    ACC_LIMIT: String(LIMIT),
    ACC_WINDOW_MS: String(WINDOW_MS),
    ACC_SYNC: setting.sync,
  }
  const servers = await Promise.all(
    Array.from({ length: n }, () => startServer('load/servers/rate-limit-accuracy.ts', env)),
  )
  const group = { servers, targets: servers.map((s) => target(s.url)), env, instances: n }
  // Warm-up (scripts loaded, connections open) on a key of its own, before any count.
  await Promise.all(group.targets.map((t) => drive(() => [t], 'warm', warmSchedule)))
  await heartbeats(group, n)
  return group
}
const warmSchedule = { traffic: 'steady' as const, rate: 500, durationMs: 40, burstEveryMs: 0 }

/** Waits until every instance of a buffered group counts `n` live instances (exact: at once). */
async function heartbeats(group: Group, n: number): Promise<void> {
  if (group.env.ACC_SYNC === 'off') return
  const deadline = Date.now() + 10_000
  for (;;) {
    const counts = await Promise.all(
      group.targets.map(async (t) => {
        const res = await fetch(new URL('/leases', t.url))
        return ((await res.json()) as { instances: number }).instances
      }),
    )
    if (counts.every((c) => c === n)) return
    if (Date.now() > deadline) throw new Error(`instances count ${counts.join(', ')}, expected ${n}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

async function stopGroup(group: Group): Promise<void> {
  await Promise.all(group.servers.map((s) => s.stop()))
  for (const t of group.targets) t.agent.destroy()
}

/** Time for the previous key's leases to end or go back before the next run counts commands. */
const settleMs = (setting: Setting) =>
  setting.sync === 'off' ? 200 : Math.max(WINDOW_MS + 200, 2 * Number(setting.sync.split(':')[0]) + 300)

let runCount = 0
async function measureRun(
  redis: Redis,
  group: Group,
  algorithm: Algorithm,
  setting: Setting,
  traffic: Traffic,
  fault?: Fault,
): Promise<RunResult> {
  const durationMs = fault ? FAULT_RUN_MS : RUN_MS
  const faultAt = FAULT_AT_MS
  const list = [...group.targets]
  const events: RunEvent[] = []
  let faultStartedAt = 0
  if (fault === 'join')
    events.push({
      atMs: faultAt,
      run: async () => {
        faultStartedAt = Date.now()
        const server = await startServer('load/servers/rate-limit-accuracy.ts', group.env)
        group.servers.push(server)
        const joined = target(server.url)
        group.targets.push(joined)
        list.push(joined)
      },
    })
  if (fault === 'kill')
    events.push({
      atMs: faultAt,
      run: async () => {
        faultStartedAt = Date.now()
        const victim = list.length - 1
        list[victim]!.killedAt = faultStartedAt
        process.kill(group.servers[victim]!.pid, 'SIGKILL')
        list.splice(victim, 1)
      },
    })
  const key = `run${runCount++}`
  await redis.config('RESETSTAT')
  const { shots, startedAt, endedAt } = await drive(
    () => list,
    key,
    { traffic, rate: RATE, durationMs, burstEveryMs: BURST_EVERY_MS },
    events,
  )
  const commands = await commandStats(redis)
  await new Promise((resolve) => setTimeout(resolve, settleMs(setting)))

  // The killed instance was the last of the list: its requests left without an answer are lost.
  const isLost = (s: Shot) => fault === 'kill' && s.status === 0 && s.instance === group.instances - 1
  const lost = shots.filter(isLost).length
  const failures = shots.filter(
    (s) => (s.status !== 200 && s.status !== 429 && !isLost(s)) || s.degraded,
  ).length
  const totalCommands = Object.values(commands).reduce((a, b) => a + b, 0)
  const scriptCalls = Object.entries(commands)
    .filter(([name]) => SCRIPT_CALLS.has(name))
    .reduce((a, [, b]) => a + b, 0)
  const admitted = shots.filter((s) => s.status === 200)
  const result: RunResult = {
    algorithm,
    setting: setting.name,
    instances: group.instances,
    traffic,
    ...(fault ? { fault } : {}),
    requests: shots.length,
    admitted: admitted.length,
    refused: shots.filter((s) => s.status === 429).length,
    failures,
    lost,
    admittedAtWindowEnd: admitted.filter((s) => s.resetMs === 0).length,
    commandsPerRequest: round(totalCommands / shots.length, 4),
    scriptCallsPerRequest: round(scriptCalls / shots.length, 4),
    commands,
  }
  if (algorithm === 'fixed-window') {
    const windows = fixedWindows(shots, LIMIT, WINDOW_MS, { startedAt, endedAt })
    const max = (xs: number[]) => round(Math.max(0, ...xs))
    const mean = (xs: number[]) => round(xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length))
    Object.assign(result, {
      windows,
      overMaxPct: max(windows.map((w) => w.overPct)),
      underMaxPct: max(windows.map((w) => w.underPct)),
      overMeanPct: mean(windows.map((w) => w.overPct)),
      underMeanPct: mean(windows.map((w) => w.underPct)),
      overByDecisionMaxPct: max(
        windows.map((w) => (Math.max(0, w.admittedByDecision - LIMIT) / LIMIT) * 100),
      ),
    })
    if (fault) {
      const hit = windows.filter((w) => w.end > faultStartedAt && w.start < faultStartedAt + 3000)
      result.affected = {
        windows: hit.length,
        overMaxPct: max(hit.map((w) => w.overPct)),
        underMaxPct: max(hit.map((w) => w.underPct)),
      }
    }
  } else {
    // Tokens at the start (the limit) plus the refill over the span the requests were sent in.
    const first = Math.min(...shots.map((s) => s.sentAt))
    const last = Math.max(...shots.map((s) => s.sentAt))
    const expected = LIMIT + (LIMIT * (last - first)) / WINDOW_MS
    result.expected = Math.round(expected)
    result.admittedVsExpected = round(admitted.length / expected, 4)
  }
  const line =
    algorithm === 'fixed-window'
      ? `over max ${result.overMaxPct}% under max ${result.underMaxPct}% (${result.windows!.length} windows)${result.affected ? `, affected windows over ${result.affected.overMaxPct}% under ${result.affected.underMaxPct}%` : ''}`
      : `admitted/expected ${result.admittedVsExpected}`
  console.log(
    `${algorithm} ${setting.name} x${group.instances} ${traffic}${fault ? ` ${fault}` : ''}: ${shots.length} sent, ${admitted.length} admitted, ${line}, ${result.commandsPerRequest} commands/req (${result.scriptCallsPerRequest} script calls)${failures ? `, ${failures} FAILURES` : ''}${lost ? `, ${lost} lost to the kill` : ''}`,
  )
  return result
}

pinLoadGenerator()
const started = performance.now()
const redisServer = await startRedisServer()
const redis = new Redis(redisServer.url)
const runs: RunResult[] = []
try {
  for (const setting of settings)
    for (const n of INSTANCE_COUNTS) {
      const group = await startGroup(redisServer.url, 'fixed-window', setting, n)
      for (const traffic of TRAFFICS)
        runs.push(await measureRun(redis, group, 'fixed-window', setting, traffic))
      await stopGroup(group)
    }
  const faults: Fault[] = ['join', 'kill']
  for (const setting of quick ? [SETTINGS[2]!] : settings)
    for (const fault of quick ? (['kill'] as Fault[]) : faults) {
      const group = await startGroup(redisServer.url, 'fixed-window', setting, FAULT_INSTANCES)
      runs.push(await measureRun(redis, group, 'fixed-window', setting, 'steady', fault))
      await stopGroup(group)
    }
  for (const algorithm of quick
    ? (['token-bucket'] as Algorithm[])
    : (['token-bucket', 'gcra'] as Algorithm[]))
    for (const setting of settings) {
      const group = await startGroup(redisServer.url, algorithm, setting, quick ? 2 : FAULT_INSTANCES)
      runs.push(await measureRun(redis, group, algorithm, setting, 'steady'))
      await stopGroup(group)
    }
} finally {
  await stopAllServers()
  redis.disconnect()
  await redisServer.stop()
}

// Invariants.
const problems: string[] = []
for (const r of runs) {
  const name = `${r.algorithm} ${r.setting} x${r.instances} ${r.traffic}${r.fault ? ` ${r.fault}` : ''}`
  if (r.failures) problems.push(`${name}: ${r.failures} answers other than 200/429 (or degraded, or none)`)
  if (r.algorithm === 'fixed-window') {
    if (!r.windows!.length) problems.push(`${name}: no whole window measured`)
    if (!r.fault && r.overMaxPct! > OVER_TOLERANCE_PCT)
      problems.push(
        `${name}: over-admission ${r.overMaxPct}% of the limit in a window (at most ${OVER_TOLERANCE_PCT}%)`,
      )
  }
}

// Report.
const exactOf = (r: RunResult) =>
  runs.find(
    (e) =>
      e.algorithm === r.algorithm &&
      e.setting === 'exact' &&
      e.instances === r.instances &&
      e.traffic === r.traffic &&
      e.fault === r.fault,
  )
const ratioVsExact = (r: RunResult) => {
  const exact = exactOf(r)
  return exact ? round(r.commandsPerRequest / exact.commandsPerRequest, 3) : undefined
}
const pct = (x: number | undefined) => (x === undefined ? 'n/a' : x.toFixed(2))
const fixed = runs.filter((r) => r.algorithm === 'fixed-window' && !r.fault)
const faultRuns = runs.filter((r) => r.fault)
const buckets = runs.filter((r) => r.algorithm !== 'fixed-window')
const mainTable = formatTable(
  [
    'setting',
    'instances',
    'traffic',
    'windows',
    'over % (max / mean)',
    'under % (max / mean)',
    'over % by decision time (max)',
    'Redis commands / req',
    'script calls / req',
    'commands vs exact',
  ],
  fixed.map((r) => [
    r.setting,
    r.instances,
    r.traffic,
    r.windows!.length,
    `${pct(r.overMaxPct)} / ${pct(r.overMeanPct)}`,
    `${pct(r.underMaxPct)} / ${pct(r.underMeanPct)}`,
    pct(r.overByDecisionMaxPct),
    r.commandsPerRequest.toFixed(3),
    r.scriptCallsPerRequest.toFixed(3),
    r.setting === 'exact' ? '1 (reference)' : `${ratioVsExact(r)}`,
  ]),
)
const faultTable = formatTable(
  [
    'setting',
    'fault',
    'windows (affected)',
    'over % max (affected)',
    'under % max (affected)',
    'over % max (run)',
    'under % max (run)',
    'lost to the kill',
    'Redis commands / req',
  ],
  faultRuns.map((r) => [
    r.setting,
    r.fault === 'join' ? `a 5th instance joins at ${FAULT_INSTANCES}` : `1 of ${FAULT_INSTANCES} SIGKILLed`,
    `${r.windows!.length} (${r.affected!.windows})`,
    pct(r.affected!.overMaxPct),
    pct(r.affected!.underMaxPct),
    pct(r.overMaxPct),
    pct(r.underMaxPct),
    r.lost,
    r.commandsPerRequest.toFixed(3),
  ]),
)
const bucketTable = formatTable(
  [
    'algorithm',
    'setting',
    'instances',
    'admitted',
    'expected (limit + refill)',
    'admitted / expected',
    'Redis commands / req',
    'commands vs exact',
  ],
  buckets.map((r) => [
    r.algorithm,
    r.setting,
    r.instances,
    r.admitted,
    r.expected!,
    r.admittedVsExpected!.toFixed(4),
    r.commandsPerRequest.toFixed(3),
    r.setting === 'exact' ? '1 (reference)' : `${ratioVsExact(r)}`,
  ]),
)
const seconds = Math.round((performance.now() - started) / 1000)
const markdown = [
  '## Buffered rate limiting: accuracy and Redis commands',
  '',
  `One key, limit ${LIMIT} per ${WINDOW_MS} ms, demand ${DEMAND}x the limit (${RATE} req/s) sent open loop by the driver, round-robin over N instances (separate processes, each with its own ioredis client, one private redis-server): steady (one request every ${1000 / RATE} ms) or bursty (${(RATE * BURST_EVERY_MS) / 1000} at once every ${BURST_EVERY_MS} ms), ${RUN_MS / 1000} s per run. Admissions are grouped by the fixed window they were counted in (the window end each answer carries); only whole windows inside the run count. Over-admission: max(0, admitted - limit) / limit per window; under-admission: max(0, limit - admitted) / limit in a window whose demand exceeded the limit. "By decision time" groups the same admissions by when they were decided (an independent check that no lease admits past its window; ±1 ms at the edges). Redis commands / req: every command Redis executed during the run (INFO commandstats after CONFIG RESETSTAT; scripts' inner calls included, heartbeats and lease returns included, INFO/CONFIG excluded) over the requests sent; script calls / req: EVALSHA/EVAL only (round trips of the limiter). "commands vs exact": buffered over exact at the same instance count and traffic.`,
  '',
  '### Fixed window',
  '',
  mainTable,
  '',
  '### Faults (fixed window, steady)',
  '',
  `${FAULT_INSTANCES} instances, ${FAULT_RUN_MS / 1000} s runs; the fault at ${FAULT_AT_MS / 1000} s, 150 ms into a window, while the leases still hold units (the limit is reached 400 ms into each window). Join: a fifth process is started then and gets its share of the round robin once listening. Kill: the last instance is SIGKILLed and leaves the round robin; its requests in flight are lost. Affected windows: those overlapping the fault and the 3 s after it (three heartbeats).`,
  '',
  faultTable,
  '',
  '### Token bucket and GCRA (steady)',
  '',
  `Admitted over the run vs what the algorithm allows: the limit (a full bucket at the start) plus the refill (${LIMIT} per ${WINDOW_MS} ms) over the span the requests were sent in.`,
  '',
  bucketTable,
  '',
  `Invariants: ${problems.length ? `FAILED: ${problems.join('; ')}` : 'held (no answer other than 200/429, no fixed-window row without fault over its limit by more than 0.5 %)'}. ${placement()}. Whole run: ${seconds} s.`,
  '',
  'Command: `npm run bench:accuracy`. Chart: accuracy.svg.',
].join('\n')

const curve = (metric: (r: RunResult) => number): LineSeries[] =>
  settings.flatMap((setting, i) =>
    TRAFFICS.map((traffic) => ({
      label: `${setting.name}, ${traffic}`,
      colorIndex: i,
      dashed: traffic === 'bursty',
      points: fixed
        .filter((r) => r.setting === setting.name && r.traffic === traffic)
        .map((r) => [r.instances, metric(r)] as [number, number]),
    })),
  )
const svg = lineCharts(
  [
    { title: 'over-admission, worst window (% of limit)', series: curve((r) => r.overMaxPct!) },
    { title: 'under-admission, worst window (% of limit)', series: curve((r) => r.underMaxPct!) },
    { title: 'Redis commands per request', series: curve((r) => r.commandsPerRequest) },
  ],
  `Buffered fixed window: limit ${LIMIT}/${WINDOW_MS} ms, demand ${DEMAND}x, one key (dashed: bursty)`,
  'instances',
)
const paths = writeResults(
  'accuracy',
  {
    limit: LIMIT,
    windowMs: WINDOW_MS,
    demand: DEMAND,
    runMs: RUN_MS,
    faultRunMs: FAULT_RUN_MS,
    burstEveryMs: BURST_EVERY_MS,
    placement: placement(),
    problems,
    runs,
  },
  markdown,
  { quick },
)
writeFileSync(new URL('accuracy.svg', resultsDir(quick)), svg)
console.log(`wrote ${paths.md} (${seconds} s)`)
if (problems.length) {
  console.error(`accuracy invariants FAILED: ${problems.join('; ')}`)
  process.exit(1)
}
