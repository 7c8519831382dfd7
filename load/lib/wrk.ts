// wrk (a C load generator, Debian package `wrk`) as a second load generator for the headline
// ratios. autocannon runs in Node and spends about as much CPU per request as a lean server; if it,
// not the server, were the limit for the fastest contender, its ratios would shrink towards 1.
// wrk spends a fraction of that, so the same ratios measured with both show whether they depend
// on the generator. Same placement as autocannon (CPU 0 when pinned), same connections and duration.
import { execFileSync, spawn } from 'node:child_process'
import { onLoadGeneratorCpu } from './cpus.ts'
import type { LoadSpec, Sample } from './runner.ts'

/** Whether `wrk` is on PATH (`apt-get install wrk`); scenarios skip their wrk part without it. */
export const wrkAvailable: boolean = (() => {
  try {
    execFileSync('wrk', ['--version'], { stdio: 'ignore' })
    return true
  } catch (err) {
    // `wrk --version` prints its usage and exits 1: installed all the same.
    return (err as NodeJS.ErrnoException).code !== 'ENOENT'
  }
})()

/** What a scenario prints when wrk is absent. */
export const WRK_MISSING =
  'wrk is not installed (`sudo apt-get install -y wrk`): the ratios were measured with autocannon only.'

const UNIT_MS: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000, h: 3_600_000 }

/** `3.21ms`, `850.00us`, `1.02s` in milliseconds. */
function milliseconds(text: string): number {
  const match = /^([0-9.]+)([a-z]+)$/.exec(text)
  if (!match || UNIT_MS[match[2]!] === undefined) throw new Error(`wrk: unreadable latency ${text}`)
  return Number(match[1]) * UNIT_MS[match[2]!]!
}

/** wrk's report (with --latency) as the Sample autocannon's runs give. */
export function parseWrk(output: string): Sample {
  const field = (pattern: RegExp) => pattern.exec(output)?.[1]
  const rps = field(/^Requests\/sec:\s+([0-9.]+)/m)
  const requests = field(/^\s*(\d+) requests in /m)
  if (rps === undefined || requests === undefined) throw new Error(`wrk: unreadable output:\n${output}`)
  const socket = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(output)
  return {
    rps: Number(rps),
    p50: milliseconds(field(/^\s+50%\s+(\S+)/m) ?? 'NaNms'),
    p99: milliseconds(field(/^\s+99%\s+(\S+)/m) ?? 'NaNms'),
    requests: Number(requests),
    non2xx: Number(field(/Non-2xx or 3xx responses: (\d+)/) ?? 0),
    errors: socket ? Number(socket[1]) + Number(socket[2]) + Number(socket[3]) : 0,
    timeouts: socket ? Number(socket[4]) : 0,
  }
}

/** wrk's options for one thread, like autocannon: connections and whole seconds (at least 1). */
const wrkOptions = (spec: { connections?: number; durationSec?: number }) => [
  '-t1',
  `-c${spec.connections ?? 50}`,
  `-d${Math.max(1, Math.round(spec.durationSec ?? 5))}s`,
  '--latency',
]

/** One run of wrk against `url + spec.path`: GET with the spec's headers. */
export function measureWrk(url: string, spec: LoadSpec): Promise<Sample> {
  if ((spec.method ?? 'GET') !== 'GET' || spec.body !== undefined || spec.setupRequest)
    throw new Error('measureWrk runs plain GETs only')
  return runWrk([
    ...wrkOptions(spec),
    ...Object.entries(spec.headers ?? {}).flatMap(([name, value]) => ['-H', `${name}: ${value}`]),
    url + spec.path,
  ])
}

const TRANSFERS_SCRIPT = new URL('./wrk-transfers.lua', import.meta.url).pathname
let wrkRuns = 0

/**
 * One run of wrk sending POST /transfers of 1 VND (load/lib/wrk-transfers.lua): `cookieFile` holds
 * one Cookie header per account index, the account ids start at `firstAccountId`; `pair` as the
 * transfers scenario's phases. Every request has a new Idempotency-Key.
 */
export function measureWrkTransfers(
  url: string,
  options: {
    cookieFile: string
    firstAccountId: number
    pair: 'random' | 'hot'
    connections: number
    durationSec: number
  },
): Promise<Sample> {
  const keyPrefix = `wrk-${process.pid}-${Date.now()}-${++wrkRuns}`
  return runWrk([
    ...wrkOptions(options),
    '-s',
    TRANSFERS_SCRIPT,
    url,
    '--',
    options.cookieFile,
    String(options.firstAccountId),
    options.pair,
    keyPrefix,
  ])
}

/** Runs wrk on the load generator's CPU and parses its report. */
function runWrk(args: string[]): Promise<Sample> {
  const [command, commandArgs] = onLoadGeneratorCpu('wrk', args)
  return new Promise((resolve, reject) => {
    const child = spawn(command, commandArgs, { stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString()
    })
    child.stderr.on('data', (chunk: Buffer) => {
      output += chunk.toString()
    })
    child.once('error', reject)
    child.once('exit', (code) => {
      if (code !== 0) return reject(new Error(`wrk exited with ${code}:\n${output}`))
      try {
        resolve(parseWrk(output))
      } catch (err) {
        reject(err)
      }
    })
  })
}

/**
 * Per-round ratios on this shared machine range about 15 % either side of their median: a wrk
 * median within that of autocannon's is the same ratio.
 */
export const GENERATOR_TOLERANCE = 0.15

export interface GeneratorComparison {
  label: string
  autocannon: { median: number; min: number; max: number }
  wrk: { median: number; min: number; max: number }
  /** wrk's median over autocannon's, minus 1. */
  difference: number
  agree: boolean
}

export function compareGenerators(
  label: string,
  autocannon: GeneratorComparison['autocannon'],
  wrk: GeneratorComparison['wrk'],
): GeneratorComparison {
  const difference = wrk.median / autocannon.median - 1
  return { label, autocannon, wrk, difference, agree: Math.abs(difference) <= GENERATOR_TOLERANCE }
}

const spread = (r: { median: number; min: number; max: number }) =>
  `${r.median.toFixed(2)}x (${r.min.toFixed(2)}-${r.max.toFixed(2)})`

/** The comparison as Markdown: a table of both generators' ratios and the verdict line. */
export function generatorReport(comparisons: GeneratorComparison[]): string {
  const lines = [
    '| ratio of req/s | autocannon median (min-max) | wrk median (min-max) | wrk vs autocannon |',
    '| --- | --- | --- | --- |',
    ...comparisons.map(
      (c) =>
        `| ${c.label} | ${spread(c.autocannon)} | ${spread(c.wrk)} | ${c.difference >= 0 ? '+' : ''}${(c.difference * 100).toFixed(0)} % |`,
    ),
  ]
  const agree = comparisons.every((c) => c.agree)
  lines.push(
    '',
    `Ratios do not depend on the generator (every wrk median within ${GENERATOR_TOLERANCE * 100} % of autocannon's): ${agree ? 'met' : 'NOT met'}.`,
  )
  return lines.join('\n')
}
