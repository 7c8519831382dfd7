import { Counter } from 'prom-client'

/** The plugin's counters, created unregistered: the metrics plugin adopts them once the app is ready (see pluginMetrics). */
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
