import { Counter } from 'prom-client'

type Inc = (labels?: unknown, value?: number) => void

/**
 * A prom-client Counter of one label for the hot path: `inc({ label: value })` adds to a plain
 * number kept per value, handed to prom-client when it collects (a scrape, `get()`). prom-client's
 * own `inc(labels)` validates and hashes the label object on every call, a measurable share of a
 * cached read's CPU when several counters count every request. Any other call (a value, several
 * labels) goes to prom-client as it is. Created unregistered, like every plugin instrument.
 */
export function talliedCounter<T extends string>(config: {
  name: string
  help: string
  labelNames: readonly [T]
}): Counter<T> {
  const label = config.labelNames[0]
  const tallies = new Map<string, { labels: Record<string, string>; n: number }>()
  // prom-client sets `inc` on the instance in its constructor: replaced below, kept here.
  let counted: Inc = () => {}
  const counter = new Counter<T>({
    ...config,
    registers: [],
    collect() {
      for (const cell of tallies.values()) {
        if (cell.n === 0) continue
        counted(cell.labels, cell.n)
        cell.n = 0
      }
    },
  })
  counted = counter.inc.bind(counter) as Inc
  const tallied: Inc = (labels, value) => {
    if (value === undefined && typeof labels === 'object' && labels !== null) {
      const of = (labels as Record<string, unknown>)[label]
      const cell = typeof of === 'string' ? tallies.get(of) : undefined
      if (cell) {
        cell.n++
        return
      }
      if (typeof of === 'string' && Object.keys(labels).length === 1) {
        tallies.set(of, { labels: { [label]: of }, n: 1 })
        return
      }
    }
    counted(labels, value)
  }
  counter.inc = tallied as Counter<T>['inc']
  const reset = counter.reset.bind(counter)
  counter.reset = () => {
    for (const cell of tallies.values()) cell.n = 0
    reset()
  }
  return counter
}
