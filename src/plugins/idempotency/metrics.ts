import { Counter, type Registry } from 'prom-client'
import { adoptMetric } from '../common/metrics.ts'

/** The plugin's counters, created unregistered and exported once the metrics plugin adopts them. */
export function createIdempotencyMetrics() {
  return {
    requests: new Counter({
      name: 'idempotency_requests_total',
      help: 'Requests on idempotent routes by outcome',
      labelNames: ['outcome'] as const,
      registers: [],
    }),
    responses: new Counter({
      name: 'idempotency_responses_total',
      help: 'What happened to the responses of claimed requests',
      labelNames: ['result'] as const,
      registers: [],
    }),
    storedBytes: new Counter({
      name: 'idempotency_stored_bytes_total',
      help: 'Response body bytes written to idempotency records',
      registers: [],
    }),
  }
}

export type IdempotencyMetrics = ReturnType<typeof createIdempotencyMetrics>

export function adoptIdempotencyMetrics(registry: Registry, metrics: IdempotencyMetrics): IdempotencyMetrics {
  return {
    requests: adoptMetric(registry, metrics.requests),
    responses: adoptMetric(registry, metrics.responses),
    storedBytes: adoptMetric(registry, metrics.storedBytes),
  }
}
