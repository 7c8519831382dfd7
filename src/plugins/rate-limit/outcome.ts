import type { BanState, Operation, PolicyCall } from './protocol.ts'
import type { Decision, Policy } from './types.ts'

/** What the engine answers about a request: one decision per policy, and what follows from them. */

/** What undoes a consume for a count-only-failures policy when the response is a success. */
export interface Refund {
  policy: Policy
  /** The consume's nonce (the sliding log removes the members added under it). */
  nonce: string
  /** The consume's policy call, with the window it counted in. */
  call: PolicyCall
  /** Decided by the local limiter while Redis was down: given back there. */
  local?: boolean
}

/** A route's request is checked by consuming its cost, or only by peeking at the quota. */
export type RequestOperation = Extract<Operation, 'consume' | 'peek'>

export interface Outcome {
  decisions: Decision[]
  /** The first violated policy, when the request is rejected. */
  rejected: Decision | null
  /** A closed policy could not be checked: answer 503. */
  unavailable: Policy | null
  delayMs: number
  refunds: Refund[]
  /** Concurrency slots taken: given back when the response ends (at once if the request is refused). */
  releases: Refund[]
  /** Reserved costs of `settle` policies: reconciled with the actual cost when the response ends. */
  settlements: Refund[]
  /** Decided without Redis (by the policies' onRedisError). */
  degraded: boolean
  /** The rejected decision's key (its identity) when this request began its ban: onBanReach is due. */
  banReached: string | null
  /** Shadow policies that would have refused this request, with their keys (logged, never enforced). */
  wouldReject: Array<{ decision: Decision; key: string }>
  /** Every shadow policy's decision (those showing headers are in `decisions` too). */
  shadowed: Decision[]
}

/**
 * What `app.rateLimiter.consume` answers: the decision for one key under one policy.
 * `remaining` is null when nothing true can be said (Redis down: onRedisError 'open' or 'closed').
 */
export interface RateLimitResult {
  /** The call's cost was within the quota and has been consumed (false: nothing was consumed). */
  allowed: boolean
  /** Units left after this call; null when decided without Redis by an 'open' or 'closed' policy. */
  remaining: number | null
  /** When not allowed: ms until a call of this cost can pass (a block's end, at least); 0 when allowed. */
  retryAfterMs: number
  /** The limit applied (the local share when decided in process while Redis is down). */
  limit: number
  /** ms until more quota is available, as the RateLimit header's `t` (0 when unknown). */
  resetMs: number
  /** Token bucket and GCRA with maxDelayMs: wait this long before going ahead (the slot is reserved). */
  delayMs: number
  /** Decided without Redis, by the policy's onRedisError. */
  degraded: boolean
  /** The policy's `ban` applies to the key: rejected with 403 until its window ends. */
  banned: boolean
  /** This call began the ban (the policy's `onBanReach` is due). */
  banReached: boolean
}

export function emptyOutcome(): Outcome {
  return {
    decisions: [],
    rejected: null,
    unavailable: null,
    delayMs: 0,
    refunds: [],
    releases: [],
    settlements: [],
    degraded: false,
    banReached: null,
    wouldReject: [],
    shadowed: [],
  }
}

/**
 * Adds a policy's decision: the first one that rejects with a retry time is the request's
 * rejection (a sibling rejected only with it has none), and a ban it began makes onBanReach due.
 */
export function addDecision(outcome: Outcome, decision: Decision, ban: BanState, identity: string): void {
  outcome.decisions.push(decision)
  if (decision.allowed || decision.retryMs <= 0 || outcome.rejected) return
  outcome.rejected = decision
  if (ban === 'began') outcome.banReached = identity
}

/** Every policy rejected only as a sibling of the violated one keeps its full quota. */
export function settleRejection(outcome: Outcome, allowed: boolean): void {
  if (!allowed && !outcome.rejected) outcome.rejected = outcome.decisions[outcome.decisions.length - 1]!
}

/** `app.rateLimiter.consume`'s answer from the outcome of its one policy (`limit`: the policy's, for a 503). */
export function resultOf(outcome: Outcome, limit: number): RateLimitResult {
  if (outcome.unavailable) {
    return {
      allowed: false,
      remaining: null,
      retryAfterMs: 1000,
      limit,
      resetMs: 0,
      delayMs: 0,
      degraded: true,
      banned: false,
      banReached: false,
    }
  }
  const decision = outcome.decisions[0]!
  return {
    allowed: decision.allowed,
    remaining: decision.remaining,
    retryAfterMs: decision.allowed ? 0 : Math.max(1, decision.retryMs),
    limit: decision.limit,
    resetMs: decision.resetMs,
    delayMs: outcome.delayMs,
    degraded: outcome.degraded,
    banned: decision.isBanned,
    banReached: outcome.banReached !== null,
  }
}

/**
 * A shadow policy's part in the request's outcome: its headers when it shows them, what it would
 * refuse, and its refunds (a count-only-failures shadow counts only failures too). Its rejection,
 * delay and ban stay out.
 */
export function addShadow(outcome: Outcome, shadow: Outcome): void {
  for (const decision of shadow.decisions)
    if (decision.policy.shadow!.headers) outcome.decisions.push(decision)
  outcome.shadowed.push(...shadow.decisions)
  outcome.wouldReject.push(...shadow.wouldReject)
  outcome.refunds.push(...shadow.refunds)
  outcome.releases.push(...shadow.releases)
  outcome.settlements.push(...shadow.settlements)
}

/** How long a client refused a concurrency slot is told to wait: a slot frees whenever a request ends. */
const CONCURRENCY_RETRY_MS = 1000

/**
 * A concurrency decision's times: its script's are when the oldest slot's lease ends, the latest a
 * slot frees. Slots usually free sooner (a request ends), so a refusal says retry in at most 1 s,
 * and free slots say nothing to wait for.
 */
export function inFlight(decision: Decision): void {
  decision.retryMs = Math.min(decision.retryMs, CONCURRENCY_RETRY_MS)
  decision.resetMs = decision.remaining === 0 ? Math.min(decision.resetMs, CONCURRENCY_RETRY_MS) : 0
}
