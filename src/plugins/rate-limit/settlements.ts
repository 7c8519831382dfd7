import type { FastifyReply, FastifyRequest } from 'fastify'
import type { RateLimitEngine } from './engine.ts'
import type { RateLimitMetrics } from './metrics.ts'
import type { Refund } from './outcome.ts'
import type { ScriptCall } from './protocol.ts'
import { requestLog } from './responses.ts'

// Reserve, then reconcile: what a request reserved under its `settle` policies, and the one
// reconciliation of each with the actual cost, when the response ends or when the route says.

/** One reservation of a request: reconciled once. */
export interface Reservation {
  reserved: Refund
  settled: boolean
}

/**
 * Keeps a request's reservations, and reconciles those whose policy has a settle function when
 * its response ends ('close': after a streamed body's last byte, or when it is cut); a route that
 * settles them itself (`settle: true`, or earlier through app.rateLimiter.settle) is left alone.
 */
export function keepReservations(
  engine: RateLimitEngine,
  metrics: RateLimitMetrics,
  request: FastifyRequest,
  reply: FastifyReply,
  settlements: Refund[],
): void {
  const kept = settlements.map((reserved) => ({ reserved, settled: false }))
  request.rateLimitReservations = (request.rateLimitReservations ?? []).concat(kept)
  reply.raw.once('close', () => {
    for (const reservation of kept) {
      const { settle, name } = reservation.reserved.policy
      if (reservation.settled || typeof settle !== 'function') continue
      let actual: unknown
      try {
        actual = settle(request, reply)
      } catch (err) {
        // The reservation stands: the estimate is what was charged.
        requestLog(request).error({ err, policy: name }, 'settle threw; the reserved cost stands')
        continue
      }
      if (!Number.isSafeInteger(actual) || (actual as number) < 0) {
        requestLog(request).error(
          { policy: name, actual: String(actual) },
          'settle returned no whole number; the reserved cost stands',
        )
        continue
      }
      void reconcile(engine, metrics, request, reservation, actual as number)
    }
  })
}

/** Reconciles one reservation with the actual cost (once); a failure leaves the reservation charged. */
export async function reconcile(
  engine: RateLimitEngine,
  metrics: RateLimitMetrics,
  request: FastifyRequest,
  reservation: Reservation,
  actual: number,
): Promise<void> {
  reservation.settled = true
  const { policy } = reservation.reserved
  try {
    metrics.settled(policy.name, await settleReservation(engine, reservation.reserved, actual))
  } catch (err) {
    requestLog(request).warn(
      { err, policy: policy.name },
      'rate-limit settlement failed; the reserved cost stands',
    )
  }
}

/** A charge is a consume that waits up to this long (about 24.8 days): in effect, always taken. */
const DEBT_MAX_DELAY_MS = 2 ** 31 - 1

/**
 * Reconciles a reservation with the actual cost: what was not used is given back (a refund of the
 * difference); more is charged, in calls of at most the limit. A token bucket or GCRA takes the
 * charge whatever the wait (its balance goes below zero, or its arrival time ahead: the next
 * requests pay it); a windowed algorithm counts it only if the window has room.
 */
export async function settleReservation(
  engine: RateLimitEngine,
  reserved: Refund,
  actual: number,
): Promise<'refunded' | 'charged' | 'exact'> {
  const diff = actual - reserved.call.cost
  if (diff === 0) return 'exact'
  if (diff < 0) {
    await engine.refund({ ...reserved, call: { ...reserved.call, cost: -diff } })
    return 'refunded'
  }
  const { policy } = reserved
  const debt = policy.algorithm === 'token-bucket' || policy.algorithm === 'gcra'
  for (let left = diff, part = 0; left > 0; part++) {
    const cost = Math.min(left, reserved.call.quota.limit)
    left -= cost
    const call: ScriptCall = {
      operation: 'consume',
      // Sliding-log members of their own: the reservation's stay as they are.
      nonce: `${reserved.nonce}+${part}`,
      policies: [{ ...reserved.call, cost, maxDelayMs: debt ? DEBT_MAX_DELAY_MS : 0, refundWindow: 0 }],
      blocks: [],
      penalties: [],
    }
    await engine.run(policy, call, reserved.local)
  }
  return 'charged'
}
