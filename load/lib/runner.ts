import { type ChildProcess, spawn } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import autocannon from 'autocannon'
import { Redis } from 'ioredis'
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

/**
 * Starts `node --import tsx <entry>`; the entry must print `LISTENING <url>` on stdout when ready.
 * Its stderr is passed through, so a crash is visible in the benchmark output.
 */
export function startServer(entry: string, env: Record<string, string> = {}): Promise<ServerHandle> {
  // BENCH_NODE_ARGS='--cpu-prof --cpu-prof-dir=prof' profiles every server under test.
  const nodeArgs = (process.env.BENCH_NODE_ARGS ?? '').split(/\s+/).filter(Boolean)
  const child: ChildProcess = spawn(process.execPath, [...nodeArgs, '--import', 'tsx', entry], {
    env: { ...process.env, NODE_ENV: 'production', LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  running.add(child)
  if (child.pid !== undefined) pinUnderTest(child.pid)
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  child.once('exit', () => running.delete(child))
  return new Promise((resolve, reject) => {
    let buffered = ''
    const timer = setTimeout(() => reject(new Error(`${entry} did not print LISTENING within 30s`)), 30_000)
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
}

export interface Summary {
  name: string
  rps: { median: number; min: number; max: number }
  p99: { median: number; min: number; max: number }
  samples: Sample[]
}

export const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Median, lowest and highest of some per-round figures. */
export const spread = (values: number[]) => ({
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
  } = {},
): Promise<Summary[]> {
  const rounds = options.rounds ?? 5
  const run = options.measure ?? measure
  for (const c of contenders) await run(c.url, { ...c.spec, durationSec: options.warmupSec ?? 1 })
  const samples = new Map<string, Sample[]>(contenders.map((c) => [c.name, []]))
  for (let round = 0; round < rounds; round++) {
    const order = options.sameOrder || round % 2 === 0 ? contenders : [...contenders].reverse()
    for (const c of order) {
      await options.beforeRun?.()
      const sample = await run(c.url, c.spec)
      samples.get(c.name)!.push(sample)
      const bad = sample.non2xx + sample.errors + sample.timeouts
      console.error(
        `${options.label ?? ''} round ${round + 1}/${rounds} ${c.name}: ${Math.round(sample.rps)} req/s, p99 ${sample.p99} ms${bad ? `, ${bad} non-2xx/errors` : ''}`,
      )
    }
  }
  return contenders.map((c) => summarize(c.name, samples.get(c.name)!))
}

/** One contender's rounds: median, lowest and highest req/s and p99. */
export const summarize = (name: string, samples: Sample[]): Summary => ({
  name,
  rps: spread(samples.map((s) => s.rps)),
  p99: spread(samples.map((s) => s.p99)),
  samples,
})

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

export function formatTable(headers: string[], rows: Array<Array<string | number>>): string {
  const lines = [headers, headers.map(() => '---'), ...rows.map((r) => r.map(String))]
  return lines.map((cells) => `| ${cells.join(' | ')} |`).join('\n')
}

/** Writes load/results/<date>-<name>.json and .md; returns the paths. */
export function writeResults(name: string, data: unknown, markdown: string): { json: string; md: string } {
  const dir = new URL('../results/', import.meta.url)
  mkdirSync(dir, { recursive: true })
  const stem = `${new Date().toISOString().slice(0, 10)}-${name}`
  const json = new URL(`${stem}.json`, dir)
  const md = new URL(`${stem}.md`, dir)
  writeFileSync(json, `${JSON.stringify(data, null, 2)}\n`)
  writeFileSync(md, `${markdown}\n`)
  return { json: json.pathname, md: md.pathname }
}
