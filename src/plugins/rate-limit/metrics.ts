import { Counter, Histogram, type Registry } from 'prom-client'

export interface RateLimitMetrics {
  decisions: Counter<'policy' | 'outcome'>
  scriptSeconds: Histogram<'algorithm'>
}

/**
 * Registered in the app's registry when the metrics plugin is there (reused if a second rate-limit
 * instance registers in the same app); otherwise counted in metrics that nothing exports.
 */
export function createMetrics(registry: Registry | undefined): RateLimitMetrics {
  const registers = registry ? [registry] : []
  const existing = (name: string) => registry?.getSingleMetric(name)
  return {
    decisions:
      (existing('rate_limit_decisions_total') as Counter<'policy' | 'outcome'>) ??
      new Counter({
        name: 'rate_limit_decisions_total',
        help: 'Rate limit decisions by policy and outcome (allowed, delayed, rejected, rejected_cached, degraded_*)',
        labelNames: ['policy', 'outcome'] as const,
        registers,
      }),
    scriptSeconds:
      (existing('rate_limit_script_duration_seconds') as Histogram<'algorithm'>) ??
      new Histogram({
        name: 'rate_limit_script_duration_seconds',
        help: 'Round trip of one rate limit script call, by algorithm',
        labelNames: ['algorithm'] as const,
        buckets: [0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
        registers,
      }),
  }
}
