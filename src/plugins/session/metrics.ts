import { Counter } from 'prom-client'
import { talliedCounter } from '../common/tallied-counter.ts'
import type { L1Counters } from './l1.ts'

/** The session plugin's instruments, created unregistered; the metrics plugin adopts them at ready. */
export function createSessionMetrics() {
  return {
    /** Every request the plugin saw, by what it decided about its session (`request.sessionDecision`). */
    decisions: talliedCounter({
      name: 'session_decisions_total',
      help: 'Requests by what the session plugin decided about their session: none, anonymous, found, slid, forged, ended, expired, unavailable',
      labelNames: ['decision'] as const,
    }),
    /** Presented sessions looked up in the L1: answered from it (hit) or not (miss: Redis answered). */
    l1Lookups: talliedCounter({
      name: 'session_l1_lookups_total',
      help: 'Presented sessions looked up in the L1, by result: hit (no Redis read) or miss',
      labelNames: ['result'] as const,
    }),
    /** Session ids received on the invalidation channel (each dropped from the L1 if it held it). */
    l1Invalidations: new Counter({
      name: 'session_l1_invalidations_total',
      help: 'Session ids received on the invalidation channel',
      registers: [],
    }),
  }
}

/** The L1's counters over the plugin's instruments. */
export function l1Counters(metrics: SessionMetrics): L1Counters {
  return {
    hit: () => metrics.l1Lookups.inc({ result: 'hit' }),
    miss: () => metrics.l1Lookups.inc({ result: 'miss' }),
    invalidated: (count) => metrics.l1Invalidations.inc(count),
  }
}

export type SessionMetrics = ReturnType<typeof createSessionMetrics>
