/** An OpenMetrics exemplar: the trace an observation belonged to (prom-client's shape). */
export interface Exemplar {
  labelSet: Record<string, string>
  value: number
  /** Seconds since the epoch. */
  timestamp: number
}

/** One label set's buckets; `observe` is a bucket search and three additions. */
export class HistogramSeries {
  readonly counts: number[]
  /** The latest exemplar per bucket (the last one is `+Inf`'s), kept only when traces are on. */
  exemplars: Array<Exemplar | undefined> | null = null
  sum = 0
  count = 0

  constructor(
    readonly labels: Record<string, string>,
    private readonly bounds: readonly number[],
  ) {
    this.counts = new Array(bounds.length).fill(0)
  }

  /** Counts `value`; returns its bucket's index (`bounds.length` for `+Inf`). */
  observe(value: number): number {
    const { bounds } = this
    let i = 0
    while (i < bounds.length && value > bounds[i]!) i++
    if (i < bounds.length) this.counts[i]!++
    this.sum += value
    this.count++
    return i
  }

  /** `observe`, and the value's trace kept as its bucket's exemplar. */
  observeWithExemplar(value: number, labelSet: Record<string, string>): void {
    const i = this.observe(value)
    this.exemplars ??= new Array(this.bounds.length + 1)
    this.exemplars[i] = { labelSet, value, timestamp: Date.now() / 1000 }
  }
}

/**
 * A Prometheus histogram for the hot path, registered like a prom-client metric (`adoptMetric`) and
 * scraped the same way. prom-client's `observe(labels, v)` (and its `labels()` children) validate and hash the
 * label object on every call; several histograms are observed per request (HTTP, each Redis
 * command, each rate-limit script), which was a measurable share of a cached read's CPU. Here the
 * caller looks its series up once (`series(labels)`, keep the result) and observes plain numbers.
 */
export class TalliedHistogram {
  readonly type = 'histogram'
  readonly aggregator = 'sum'
  private readonly all = new Map<string, HistogramSeries>()

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly bounds: readonly number[],
  ) {}

  /** The series of this label set, created on first use; keep it instead of calling per event. */
  series(labels: Record<string, string>): HistogramSeries {
    const id = JSON.stringify(labels)
    let found = this.all.get(id)
    if (!found) {
      found = new HistogramSeries(labels, this.bounds)
      this.all.set(id, found)
    }
    return found
  }

  /**
   * prom-client's metric shape: cumulative `_bucket`s with `le` (and their exemplars, shown in the
   * OpenMetrics format only), then `_sum` and `_count`.
   */
  async get() {
    const values: Array<{
      labels: Record<string, string | number>
      value: number
      metricName: string
      exemplar?: Exemplar
    }> = []
    for (const s of this.all.values()) {
      let cumulative = 0
      this.bounds.forEach((bound, i) => {
        cumulative += s.counts[i]!
        values.push({
          labels: { ...s.labels, le: bound },
          value: cumulative,
          metricName: `${this.name}_bucket`,
          ...(s.exemplars?.[i] ? { exemplar: s.exemplars[i] } : {}),
        })
      })
      const inf = s.exemplars?.[this.bounds.length]
      values.push({
        labels: { ...s.labels, le: '+Inf' },
        value: s.count,
        metricName: `${this.name}_bucket`,
        ...(inf ? { exemplar: inf } : {}),
      })
      values.push({ labels: s.labels, value: s.sum, metricName: `${this.name}_sum` })
      values.push({ labels: s.labels, value: s.count, metricName: `${this.name}_count` })
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator }
  }

  /** Zeroes every series in place: callers keep the series they hold. */
  reset(): void {
    for (const s of this.all.values()) {
      s.counts.fill(0)
      s.exemplars = null
      s.sum = 0
      s.count = 0
    }
  }
}
