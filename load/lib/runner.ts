import { type ChildProcess, spawn } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import autocannon from 'autocannon'
import { Redis } from 'ioredis'
import { RUN_TYPESCRIPT } from '../../test/helpers/tsx.ts'
import { processCpuSeconds, redisCpuSeconds } from './cpu-time.ts'
import { pinUnderTest } from './cpus.ts'

/** A server under test, in its own process so that it and autocannon each get a core. */
export interface ServerHandle {
  url: string
  pid: number
  stop(): Promise<void>
}

const running = new Set<ChildProcess>()
// However the suite ends (a crash included), no server under test outlives it.
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL')
})

/** Stops every server still running (a scenario that threw, or Ctrl-C): none outlives the suite. */
export async function stopAllServers(): Promise<void> {
  await Promise.all(
    [...running].map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) return resolve()
          child.once('exit', () => resolve())
          child.kill('SIGTERM')
        }),
    ),
  )
}

const START_TIMEOUT_MS = 120_000

/**
 * Starts `node --conditions=fastify-redis-gateway:source --import tsx <entry>`; the entry must print `LISTENING <url>` on stdout when ready.
 * Its stderr is passed through, so a crash is visible in the benchmark output.
 */
export function startServer(entry: string, env: Record<string, string> = {}): Promise<ServerHandle> {
  // BENCH_NODE_ARGS='--cpu-prof --cpu-prof-dir=prof' profiles every server under test.
  const nodeArgs = (process.env.BENCH_NODE_ARGS ?? '').split(/\s+/).filter(Boolean)
  const child: ChildProcess = spawn(process.execPath, [...nodeArgs, ...RUN_TYPESCRIPT, entry], {
    env: { ...process.env, NODE_ENV: 'production', LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  running.add(child)
  if (child.pid !== undefined) pinUnderTest(child.pid)
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  child.once('exit', () => running.delete(child))
  return new Promise((resolve, reject) => {
    let buffered = ''
    // Starting is not measured: on a loaded machine (a CI run beside other work) a server under
    // test can take a minute to load its sources. One that never listens is stopped.
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`${entry} did not print LISTENING within ${START_TIMEOUT_MS / 1000} s`))
    }, START_TIMEOUT_MS)
    child.once('exit', (code) => reject(new Error(`${entry} exited with ${code} before listening`)))
    child.stdout!.on('data', (chunk: Buffer) => {
      buffered += chunk.toString()
      const match = /LISTENING (\S+)/.exec(buffered)
      if (!match) return
      clearTimeout(timer)
      resolve({
        url: match[1]!,
        pid: child.pid!,
        async stop() {
          if (child.exitCode === null) child.kill('SIGTERM')
          await exited
        },
      })
    })
  })
}

export interface LoadSpec {
  method?: 'GET' | 'POST' | 'PUT' | 'DELETE'
  path: string
  headers?: Record<string, string>
  body?: string
  /** Per-request variation (unique Idempotency-Keys, say): returns the request to send. */
  setupRequest?: (request: autocannon.Request, context: object) => autocannon.Request
  connections?: number
  durationSec?: number
}

export interface Sample {
  rps: number
  p50: number
  p99: number
  requests: number
  non2xx: number
  errors: number
  timeouts: number
  /** CPU µs of the server process (all threads) per request served, over this run's window. */
  serverCpuMicros?: number
  /** CPU µs of redis-server per request served, over this run's window (INFO cpu). */
  redisCpuMicros?: number
}

export async function measure(url: string, spec: LoadSpec): Promise<Sample> {
  const result = await autocannon({
    url: url + spec.path,
    method: spec.method ?? 'GET',
    headers: spec.headers,
    body: spec.body,
    connections: spec.connections ?? 50,
    duration: spec.durationSec ?? 5,
    requests: spec.setupRequest ? [{ setupRequest: spec.setupRequest }] : undefined,
  })
  return {
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    requests: result.requests.total,
    non2xx: result.non2xx,
    errors: result.errors,
    timeouts: result.timeouts,
  }
}

export interface Contender {
  name: string
  url: string
  spec: LoadSpec
  /** The server process, whose CPU per request `interleave` records in each run. */
  pid?: number
}

export interface Spread {
  median: number
  min: number
  max: number
}

export interface Summary {
  name: string
  rps: Spread
  p99: Spread
  /** Over rounds, when the runs recorded it (the contender's pid was given). */
  serverCpuMicros?: Spread
  /** Over rounds, when the runs recorded it (interleave's redisUrl was given). */
  redisCpuMicros?: Spread
  samples: Sample[]
}

export const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Median, lowest and highest of some per-round figures. */
export const spread = (values: number[]): Spread => ({
  median: median(values),
  min: Math.min(...values),
  max: Math.max(...values),
})

/**
 * Runs the contenders in rounds (A B C, then C B A, ...) so drift on a shared machine hits every
 * contender alike; `rounds` of at least five give the medians the design asks for.
 */
export async function interleave(
  contenders: Contender[],
  options: {
    rounds?: number
    warmupSec?: number
    label?: string
    /** The load generator: autocannon (`measure`) unless given, e.g. wrk (load/lib/wrk.ts). */
    measure?: (url: string, spec: LoadSpec) => Promise<Sample>
    /** Runs before each measured run, outside it (e.g. vacuumTransferTables). */
    beforeRun?: () => Promise<void>
    /**
     * The same order every round instead of alternating (A B, A B instead of A B, B A): every run
     * then follows the other contenders' runs. Alternating, half of a contender's runs follow its
     * own and half follow an idle stretch of two runs, long enough for a Postgres pool (10 s idle
     * timeout) to close its connections and open new ones on the next run: the per-round ratios
     * split into two groups by order, and their median lands on the boundary.
     */
    sameOrder?: boolean
    /** The redis-server the contenders use: its CPU per request is recorded in each run. */
    redisUrl?: string
  } = {},
): Promise<Summary[]> {
  const rounds = options.rounds ?? 5
  const run = options.measure ?? measure
  const redis = options.redisUrl ? new Redis(options.redisUrl) : undefined
  try {
    for (const c of contenders) await run(c.url, { ...c.spec, durationSec: options.warmupSec ?? 1 })
    const samples = new Map<string, Sample[]>(contenders.map((c) => [c.name, []]))
    for (let round = 0; round < rounds; round++) {
      const order = options.sameOrder || round % 2 === 0 ? contenders : [...contenders].reverse()
      for (const c of order) {
        await options.beforeRun?.()
        const sample = await withCpu(() => run(c.url, c.spec), c.pid, redis)
        samples.get(c.name)!.push(sample)
        const bad = sample.non2xx + sample.errors + sample.timeouts
        const cpu =
          sample.serverCpuMicros === undefined ? '' : `, server ${sample.serverCpuMicros.toFixed(0)} µs/req`
        console.error(
          `${options.label ?? ''} round ${round + 1}/${rounds} ${c.name}: ${Math.round(sample.rps)} req/s, p99 ${sample.p99} ms${cpu}${bad ? `, ${bad} non-2xx/errors` : ''}`,
        )
      }
    }
    return contenders.map((c) => summarize(c.name, samples.get(c.name)!))
  } finally {
    redis?.disconnect()
  }
}

/**
 * One measured run with the CPU the server process and redis-server spent in its window, per
 * request served: throughput and CPU per request come from the same requests. Requests still in
 * flight when the load generator stops are not counted, nor is their CPU after the window closes.
 */
async function withCpu(run: () => Promise<Sample>, pid?: number, redis?: Redis): Promise<Sample> {
  const serverBefore = pid === undefined ? undefined : processCpuSeconds(pid)
  const redisBefore = redis ? await redisCpuSeconds(redis) : undefined
  const sample = await run()
  const serverAfter = pid === undefined ? undefined : processCpuSeconds(pid)
  const redisAfter = redis ? await redisCpuSeconds(redis) : undefined
  const perRequest = (seconds: number) => (seconds * 1e6) / Math.max(1, sample.requests)
  return {
    ...sample,
    ...(serverBefore !== undefined && serverAfter !== undefined
      ? { serverCpuMicros: perRequest(serverAfter - serverBefore) }
      : {}),
    ...(redisBefore !== undefined && redisAfter !== undefined
      ? { redisCpuMicros: perRequest(redisAfter - redisBefore) }
      : {}),
  }
}

/** One contender's rounds: median, lowest and highest req/s, p99 and CPU per request where recorded. */
export function summarize(name: string, samples: Sample[]): Summary {
  const recorded = (values: Array<number | undefined>) =>
    values.every((v) => v !== undefined) && values.length ? spread(values as number[]) : undefined
  const serverCpuMicros = recorded(samples.map((s) => s.serverCpuMicros))
  const redisCpuMicros = recorded(samples.map((s) => s.redisCpuMicros))
  return {
    name,
    rps: spread(samples.map((s) => s.rps)),
    p99: spread(samples.map((s) => s.p99)),
    ...(serverCpuMicros ? { serverCpuMicros } : {}),
    ...(redisCpuMicros ? { redisCpuMicros } : {}),
    samples,
  }
}

/**
 * The issue's "medians of pairs": each round's ratio of two contenders measured seconds apart, then
 * the median over rounds, with the lowest and highest round. On a shared machine the load drifts
 * between rounds; a ratio of two overall medians would mix rounds run under different loads.
 */
export function ratio(a: Summary, b: Summary) {
  const ratios = a.samples.map((sample, i) => sample.rps / b.samples[i]!.rps)
  return { median: median(ratios), min: Math.min(...ratios), max: Math.max(...ratios), ratios }
}

/** Total commands Redis has executed (INFO commandstats), to count commands per request by delta. */
export async function redisCommandCount(redis: Redis): Promise<number> {
  const info = await redis.info('commandstats')
  let total = 0
  for (const match of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    if (match[1] !== 'info') total += Number(match[2])
  }
  return total
}

/** Commands per request for one short run: a dedicated Redis makes the delta exact. */
export async function commandsPerRequest(redisUrl: string, url: string, spec: LoadSpec): Promise<number> {
  const redis = new Redis(redisUrl)
  try {
    const before = await redisCommandCount(redis)
    const sample = await measure(url, { ...spec, durationSec: spec.durationSec ?? 2 })
    const after = await redisCommandCount(redis)
    return (after - before) / sample.requests
  } finally {
    redis.disconnect()
  }
}

/** What the CPU columns of a throughput table are, for the text under it. */
export const CPU_PER_REQUEST_NOTE =
  'Server and Redis CPU µs/req: CPU time of the server process (all threads, /proc) and of redis-server (INFO cpu) over the same runs as req/s, divided by the requests served; median (min-max) over rounds.'

/** A CPU-per-request spread as a table cell, µs: median (min-max over rounds). */
export const cpuCell = (micros: Spread | undefined, digits = 0): string =>
  micros
    ? `${micros.median.toFixed(digits)} (${micros.min.toFixed(digits)}-${micros.max.toFixed(digits)})`
    : 'n/a'

export function formatTable(headers: string[], rows: Array<Array<string | number>>): string {
  const lines = [headers, headers.map(() => '---'), ...rows.map((r) => r.map(String))]
  return lines.map((cells) => `| ${cells.join(' | ')} |`).join('\n')
}

/**
 * Where results go: load/results/ holds the latest full run of each scenario (tracked; history is in
 * git), load/results/quick/ the quick and smoke runs (git-ignored), so that a smoke test never
 * overwrites a result the docs cite.
 */
export const resultsDir = (quick: boolean): URL =>
  new URL(quick ? '../results/quick/' : '../results/', import.meta.url)

/**
 * Writes <name>.json (the data, with the run's time as `at`) and <name>.md (ending with the run's
 * date) into resultsDir(quick); returns the paths.
 */
export function writeResults(
  name: string,
  data: object,
  markdown: string,
  run: { quick: boolean; at?: string },
): { json: string; md: string } {
  const dir = resultsDir(run.quick)
  mkdirSync(dir, { recursive: true })
  const at = run.at ?? new Date().toISOString()
  const json = new URL(`${name}.json`, dir)
  const md = new URL(`${name}.md`, dir)
  writeFileSync(json, `${JSON.stringify({ at, ...data }, null, 2)}\n`)
  writeFileSync(md, `${markdown}\n\nRun of ${at}${run.quick ? ' (quick: not for claims)' : ''}.\n`)
  return { json: json.pathname, md: md.pathname }
}
