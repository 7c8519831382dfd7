import { readdirSync } from 'node:fs'
import type { RatioBar } from './chart.ts'

/** What every load/scenarios/<name>.ts exports as default; load/run.ts runs them by name. */
export interface ScenarioOptions {
  /** Short runs for `npm run bench:quick` (the whole quick suite must finish in under three minutes). */
  quick: boolean
}

export interface ScenarioResult {
  title: string
  /** A Markdown table (or a few) ready to paste into the README. */
  markdown: string
  /** Everything measured, for load/results/<name>.json. */
  data: unknown
  /**
   * Optional: the throughput ratios to chart in the run's summary SVG. Without it, load/run.ts
   * charts every `{median, min, max}` it finds under a key containing "ratio" in `data`.
   */
  ratios?: RatioBar[]
}

export type Scenario = (options: ScenarioOptions) => Promise<ScenarioResult>

/** The scenarios load/run.ts can run: the files of load/scenarios/, by name, sorted. */
export const scenarioNames = (): string[] =>
  readdirSync(new URL('../scenarios/', import.meta.url))
    .filter((file) => file.endsWith('.ts'))
    .map((file) => file.replace(/\.ts$/, ''))
    .sort()
