import { Counter, Gauge } from 'prom-client'
import { exemplarOf } from '../common/otel.ts'
import { type HistogramSeries, TalliedHistogram } from '../common/tallied-histogram.ts'

/**
 * The plugin's instruments (created unregistered; the metrics plugin adopts them when the app is
 * ready, see `pluginMetrics`) and the calls the engine counts through.
 */
export interface RateLimitMetrics {
  readonly decisions: Counter<'policy' | 'outcome'>
  readonly scriptDuration: TalliedHistogram
  readonly redisUnavailable: Counter
  /**
   * Counts one decision; cheap enough for every request (see `decisionsCounter`). A shadow
   * policy's rejection counts as `would_reject`.
   */
  decision(policy: { name: string; shadow: object | null }, outcome: string): void
  /** The script round-trip histogram of one algorithm. */
  scriptSeconds(algorithm: string): HistogramSeries
  /** Counts one group of policies decided without Redis. */
  unavailable(): void
  readonly leaseCalls: Counter<'call'>
  /** Counts one Redis call of buffered mode: a lease acquired, a lease returned, or a heartbeat. */
  leaseCall(call: 'acquire' | 'return' | 'heartbeat'): void
  readonly overrides: Gauge<'policy'>
  /** Each plugin instance's overrides in force, per policy (summed when a scrape collects them). */
  readonly overrideSources: Set<() => Map<string, number>>
  readonly overrideChanges: Counter<'action'>
  /** Counts an override set or removed by this process. */
  overrideChanged(action: 'set' | 'remove'): void
  readonly settlements: Counter<'policy' | 'outcome'>
  /** Counts a reservation reconciled: given back, charged more, or exact. */
  settled(policy: string, outcome: 'refunded' | 'charged' | 'exact'): void
}

interface Tally {
  labels: { policy: string; outcome: string }
  n: number
  /** The trace of the latest refusal counted here, when OpenTelemetry traces it. */
  exemplar?: Record<string, string> | undefined
}
type Tallies = Map<string, Map<string, Tally>>

/**
 * Decisions are tallied in plain numbers and handed to prom-client when it collects (a scrape):
 * `inc({ labels })` hashes its labels on every call, which was a measurable share of a request's
 * CPU.
 */
function decisionsCounter(tallies: Tallies): Counter<'policy' | 'outcome'> {
  const counter: Counter<'policy' | 'outcome'> = new Counter({
    name: 'rate_limit_decisions_total',
    help: 'Rate limit decisions by policy and outcome (allowed, delayed, rejected, rejected_cached, would_reject, degraded_*, error)',
    labelNames: ['policy', 'outcome'] as const,
    registers: [],
    // A refusal's exemplar names its trace (shown to OpenMetrics scrapers).
    enableExemplars: true,
    collect() {
      for (const outcomes of tallies.values()) {
        for (const cell of outcomes.values()) {
          if (cell.n === 0) continue
          const { exemplar } = cell
          if (!exemplar) counter.inc({ labels: cell.labels, value: cell.n })
          else {
            if (cell.n > 1) counter.inc({ labels: cell.labels, value: cell.n - 1 })
            counter.inc({ labels: cell.labels, value: 1, exemplarLabels: exemplar })
          }
          cell.n = 0
          cell.exemplar = undefined
        }
      }
    },
  })
  return counter
}

/** The instruments of the plugin in one app (its instances share them through `pluginMetrics`). */
export function createRateLimitMetrics(): RateLimitMetrics {
  const byPolicy: Tallies = new Map()
  const scriptDuration = new TalliedHistogram(
    'rate_limit_script_duration_seconds',
    'Round trip of one rate limit script call, by algorithm',
    [0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
  )
  const redisUnavailable = new Counter({
    name: 'rate_limit_redis_unavailable_total',
    help: 'Rate limit checks decided without Redis (not connected, failed or timed out), by each policy onRedisError',
    registers: [],
  })
  // Tallied like the decisions: buffered mode exists to keep per-request work low.
  const leaseCounts = { acquire: 0, return: 0, heartbeat: 0 }
  const leaseCalls: Counter<'call'> = new Counter({
    name: 'rate_limit_lease_calls_total',
    help: 'Redis calls of buffered policies: leases acquired and returned, and heartbeats',
    labelNames: ['call'] as const,
    registers: [],
    collect() {
      for (const call of ['acquire', 'return', 'heartbeat'] as const) {
        if (leaseCounts[call] > 0) leaseCalls.inc({ call }, leaseCounts[call])
        leaseCounts[call] = 0
      }
    },
  })
  const overrideSources = new Set<() => Map<string, number>>()
  const overrides: Gauge<'policy'> = new Gauge({
    name: 'rate_limit_overrides',
    help: 'Rate limit overrides in force in this process, by policy',
    labelNames: ['policy'] as const,
    registers: [],
    collect() {
      overrides.reset()
      const sums = new Map<string, number>()
      for (const source of overrideSources)
        for (const [policy, n] of source()) sums.set(policy, (sums.get(policy) ?? 0) + n)
      for (const [policy, n] of sums) overrides.set({ policy }, n)
    },
  })
  const overrideChanges = new Counter({
    name: 'rate_limit_override_changes_total',
    help: 'Rate limit overrides set or removed by this process',
    labelNames: ['action'] as const,
    registers: [],
  })
  const settlements = new Counter({
    name: 'rate_limit_settlements_total',
    help: 'Reserved costs reconciled with the actual cost, by policy and outcome (refunded, charged, exact)',
    labelNames: ['policy', 'outcome'] as const,
    registers: [],
  })
  const scriptSeries = new Map<string, HistogramSeries>()
  return {
    settlements,
    settled: (policy, outcome) => settlements.inc({ policy, outcome }),
    overrides,
    overrideSources,
    overrideChanges,
    overrideChanged: (action) => overrideChanges.inc({ action }),
    leaseCalls,
    leaseCall: (call) => void leaseCounts[call]++,
    decisions: decisionsCounter(byPolicy),
    scriptDuration,
    redisUnavailable,
    unavailable: () => redisUnavailable.inc(),
    decision({ name, shadow }, outcome) {
      if (shadow && (outcome === 'rejected' || outcome === 'rejected_cached')) outcome = 'would_reject'
      let outcomes = byPolicy.get(name)
      if (!outcomes) {
        outcomes = new Map()
        byPolicy.set(name, outcomes)
      }
      let cell = outcomes.get(outcome)
      if (cell) cell.n++
      else {
        cell = { labels: { policy: name, outcome }, n: 1 }
        outcomes.set(outcome, cell)
      }
      if (outcome === 'rejected' || outcome === 'rejected_cached')
        cell.exemplar = exemplarOf() ?? cell.exemplar
    },
    scriptSeconds(algorithm) {
      let series = scriptSeries.get(algorithm)
      if (!series) {
        series = scriptDuration.series({ algorithm })
        scriptSeries.set(algorithm, series)
      }
      return series
    },
  }
}
