/** What every load/scenarios/<name>.ts exports as default; load/run.ts runs them by name. */
export interface ScenarioOptions {
  /** Short runs for `npm run bench:quick` (the whole quick suite must finish in under three minutes). */
  quick: boolean
}

export interface ScenarioResult {
  title: string
  /** A Markdown table (or a few) ready to paste into the README. */
  markdown: string
  /** Everything measured, for load/results/<date>-<name>.json. */
  data: unknown
}

export type Scenario = (options: ScenarioOptions) => Promise<ScenarioResult>
