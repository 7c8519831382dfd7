import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { type RatioBar, ratioChart } from './chart.ts'
import { headlineRows, headlineTable, type StoredResult } from './headline.ts'
import { resultsDir } from './runner.ts'
import type { ScenarioResult } from './scenario.ts'

export interface ScenarioOutcome {
  name: string
  /** Absent when the scenario threw; `error` says why. */
  result?: ScenarioResult
  error?: string
  seconds: number
}

const isSpread = (v: unknown): v is { median: number; min: number; max: number } =>
  typeof v === 'object' &&
  v !== null &&
  ['median', 'min', 'max'].every((k) => typeof (v as Record<string, unknown>)[k] === 'number')

/**
 * Scenarios written before `ratios` existed still chart: every `{median, min, max}` found under a
 * key containing "ratio" (the shape `ratio()` in runner.ts returns), labelled by its path.
 */
export function findRatios(data: unknown, path: string[] = [], inRatio = false): RatioBar[] {
  if (typeof data !== 'object' || data === null) return []
  if (inRatio && isSpread(data)) {
    const target = (data as { target?: unknown }).target
    return [
      {
        label: path.join(' / '),
        median: data.median,
        min: data.min,
        max: data.max,
        ...(typeof target === 'number' ? { target } : {}),
      },
    ]
  }
  return Object.entries(data).flatMap(([key, value]) => {
    const label = (value as { label?: unknown })?.label ?? (value as { name?: unknown })?.name
    const step = Array.isArray(data) ? String(label ?? key) : key
    return findRatios(value, [...path, step], inRatio || /ratio/i.test(key))
  })
}

/** The bars a result charts: its own `ratios`, or every ratio found in its data. */
export function ratiosOf(result: StoredResult): RatioBar[] {
  const bars = (result.ratios as RatioBar[] | undefined) ?? findRatios(result.data)
  return bars.map((b) => ({ ...b, label: `${result.scenario}: ${b.label}` }))
}

/** The latest stored result of each of `scenarios` in resultsDir(quick), those that have one. */
export function storedResults(scenarios: string[], quick: boolean): StoredResult[] {
  const dir = resultsDir(quick)
  return scenarios.flatMap((scenario) => {
    const file = new URL(`${scenario}.json`, dir)
    if (!existsSync(file)) return []
    return [{ scenario, ...JSON.parse(readFileSync(file, 'utf8')) } as StoredResult]
  })
}

/**
 * The suite's report, rebuilt from the latest result of every scenario (not only those of this
 * run): summary.md (the headline rows, the chart, every scenario's tables with the time of its run)
 * and ratios.svg, in resultsDir(quick). Scenarios that failed in this run are listed first; their
 * last result, if any, stays below.
 */
export function writeSummary(
  scenarios: string[],
  options: { quick: boolean; failed?: ScenarioOutcome[] },
): { md: string; svg: string } {
  const dir = resultsDir(options.quick)
  mkdirSync(dir, { recursive: true })
  const results = storedResults(scenarios, options.quick)
  const svgName = 'ratios.svg'
  const title = `Throughput ratios (median, min-max)${options.quick ? ', quick runs' : ''}`
  writeFileSync(new URL(svgName, dir), ratioChart(results.flatMap(ratiosOf), title))
  const failures = (options.failed ?? []).map(
    (o) => `## ${o.name}: failed in the last run\n\n\`\`\`\n${o.error}\n\`\`\``,
  )
  const sections = results.map(
    (r) =>
      `## ${r.title}\n\n${r.markdown}\n\n_(scenario \`${r.scenario}\`, run of ${r.at}${r.quick ? ', quick' : ''}${r.placement ? `; CPU placement: ${r.placement}` : ''})_`,
  )
  const markdown = [
    `# Benchmark summary${options.quick ? ' of quick runs (short runs, fewer rounds: a smoke test, not for claims)' : ''}`,
    '',
    "The latest run of each scenario. Every comparison is interleaved within its run; ratios are the median over rounds of each round's ratio, with the lowest and highest round. " +
      "CPU per request is the server process's (all threads) and redis-server's over the same measured runs as req/s, divided by the requests served.",
    '',
    headlineTable(headlineRows(results), (scenario) => `${scenario}.md`),
    '',
    `![Throughput ratios](${svgName})`,
    '',
    ...[...failures, ...sections].flatMap((s) => [s, '']),
  ].join('\n')
  const md = new URL('summary.md', dir)
  writeFileSync(md, markdown)
  return { md: md.pathname, svg: new URL(svgName, dir).pathname }
}
