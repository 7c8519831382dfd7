import { Counter } from 'prom-client'

/** The session plugin's instruments, created unregistered; the metrics plugin adopts them at ready. */
export function createSessionMetrics() {
  return {
    /** Every request the plugin saw, by what it decided about its session (`request.sessionDecision`). */
    decisions: new Counter({
      name: 'session_decisions_total',
      help: 'Requests by what the session plugin decided about their session: none, anonymous, found, slid, forged, ended, expired, unavailable',
      labelNames: ['decision'] as const,
      registers: [],
    }),
  }
}

export type SessionMetrics = ReturnType<typeof createSessionMetrics>
