import { mkdirSync, writeFileSync } from 'node:fs'
import { type RatioBar, ratioChart } from './chart.ts'
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

export function ratiosOf(outcome: ScenarioOutcome): RatioBar[] {
  const result = outcome.result
  if (!result) return []
  const bars = result.ratios ?? findRatios(result.data)
  return bars.map((b) => ({ ...b, label: `${outcome.name}: ${b.label}` }))
}

/**
 * The run's combined report: load/results/<date>.json (every scenario's data), <date>-summary.md
 * (every table, the chart, the command) and <date>-ratios.svg.
 */
export function writeSummary(
  outcomes: ScenarioOutcome[],
  meta: { quick: boolean; command: string; startedAt: string; placement: string },
): { json: string; md: string; svg: string } {
  const dir = new URL('../results/', import.meta.url)
  mkdirSync(dir, { recursive: true })
  const date = meta.startedAt.slice(0, 10)
  const bars = outcomes.flatMap(ratiosOf)
  const svgName = `${date}-ratios.svg`
  const title = `Throughput ratios (median, min-max)${meta.quick ? ', quick run' : ''}`
  writeFileSync(new URL(svgName, dir), ratioChart(bars, title))
  const sections = outcomes.map((o) =>
    o.result
      ? `## ${o.result.title}\n\n${o.result.markdown}\n\n_(scenario \`${o.name}\`, ${o.seconds.toFixed(0)} s)_`
      : `## ${o.name}: failed\n\n\`\`\`\n${o.error}\n\`\`\``,
  )
  const markdown = [
    `# Benchmark summary, ${meta.startedAt}`,
    '',
    `Made by \`${meta.command}\`${meta.quick ? ' (quick: short runs, fewer rounds; for a smoke test, not for claims)' : ''}. ` +
      "Every comparison is interleaved in one run; ratios are the median over rounds of each round's ratio, with the lowest and highest round. " +
      `CPU placement: ${meta.placement}.`,
    '',
    `![Throughput ratios](${svgName})`,
    '',
    ...sections.flatMap((s) => [s, '']),
  ].join('\n')
  const md = new URL(`${date}-summary.md`, dir)
  const json = new URL(`${date}.json`, dir)
  writeFileSync(md, markdown)
  writeFileSync(
    json,
    `${JSON.stringify(
      {
        ...meta,
        scenarios: outcomes.map((o) => ({
          name: o.name,
          seconds: o.seconds,
          error: o.error,
          title: o.result?.title,
          data: o.result?.data,
        })),
        ratios: bars,
      },
      null,
      2,
    )}\n`,
  )
  return { json: json.pathname, md: md.pathname, svg: new URL(svgName, dir).pathname }
}
