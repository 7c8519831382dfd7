import { Counter, type Registry } from 'prom-client'
import { adoptMetric } from '../common/metrics.ts'
import { type HistogramSeries, TalliedHistogram } from '../common/tallied-histogram.ts'

export interface RateLimitMetrics {
  /** Counts one decision; cheap enough for every request (see `tallies`). */
  decision(policy: string, outcome: string): void
  /** The script round-trip histogram of one algorithm (keep it; observe per call). */
  scriptSeconds(algorithm: string): HistogramSeries
  /** Counts one group of policies decided without Redis. */
  unavailable(): void
  /**
   * Counts in the app's registry from now on (the metrics plugin is ready); a second rate-limit
   * instance in the same app shares the first one's metrics.
   */
  adopt(registry: Registry): void
}

type Tallies = Map<string, Map<string, { labels: { policy: string; outcome: string }; n: number }>>

/**
 * Decisions are tallied in plain numbers and handed to prom-client when it collects (a scrape):
 * `inc({ labels })` hashes its labels on every call, which was a measurable share of a request's
 * CPU. One tally per counter object, so two plugin instances sharing the counter share it too.
 */
const tallies = new WeakMap<Counter<'policy' | 'outcome'>, Tallies>()

function decisionsCounter(): Counter<'policy' | 'outcome'> {
  const counter: Counter<'policy' | 'outcome'> = new Counter({
    name: 'rate_limit_decisions_total',
    help: 'Rate limit decisions by policy and outcome (allowed, delayed, rejected, rejected_cached, degraded_*, error)',
    labelNames: ['policy', 'outcome'] as const,
    registers: [],
    collect() {
      for (const outcomes of tallies.get(counter)!.values()) {
        for (const cell of outcomes.values()) {
          if (cell.n > 0) counter.inc(cell.labels, cell.n)
          cell.n = 0
        }
      }
    },
  })
  tallies.set(counter, new Map())
  return counter
}

/**
 * The plugin's metrics, counted in metrics that nothing exports until `adopt` hands them to the
 * app's registry (the metrics plugin is registered, before or after this plugin): the object stays
 * the same, what it counts in changes once.
 */
export function createMetrics(): RateLimitMetrics {
  let counted = metricsIn(undefined)
  return {
    decision: (policy, outcome) => counted.decision(policy, outcome),
    scriptSeconds: (algorithm) => counted.scriptSeconds(algorithm),
    unavailable: () => counted.unavailable(),
    adopt(registry) {
      counted = metricsIn(registry)
    },
  }
}

/** The metrics in `registry` (the ones already there, if another instance registered them). */
function metricsIn(registry: Registry | undefined): Omit<RateLimitMetrics, 'adopt'> {
  const adopt = <T>(metric: T): T => (registry ? adoptMetric(registry, metric) : metric)
  const byPolicy = tallies.get(adopt(decisionsCounter()))!
  const scriptHistogram = adopt(
    new TalliedHistogram(
      'rate_limit_script_duration_seconds',
      'Round trip of one rate limit script call, by algorithm',
      [0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
    ),
  )
  const unavailable = adopt(
    new Counter({
      name: 'rate_limit_redis_unavailable_total',
      help: 'Rate limit checks decided without Redis (not connected, failed or timed out), by each policy onRedisError',
      registers: [],
    }),
  )
  const scriptSeries = new Map<string, HistogramSeries>()
  return {
    unavailable: () => unavailable.inc(),
    decision(policy, outcome) {
      let outcomes = byPolicy.get(policy)
      if (!outcomes) {
        outcomes = new Map()
        byPolicy.set(policy, outcomes)
      }
      const cell = outcomes.get(outcome)
      if (cell) cell.n++
      else outcomes.set(outcome, { labels: { policy, outcome }, n: 1 })
    },
    scriptSeconds(algorithm) {
      let series = scriptSeries.get(algorithm)
      if (!series) {
        series = scriptHistogram.series({ algorithm })
        scriptSeries.set(algorithm, series)
      }
      return series
    },
  }
}
