import { RateLimitError } from './errors.ts'
import { callOf, type Group, type KeyNames, localResolvedOf, nonceFor } from './groups.ts'
import { acquireStore, type MemoryStore, releaseStore } from './memory.ts'
import type { RateLimitMetrics } from './metrics.ts'
import { addDecision, type Outcome, type RequestOperation, settleRejection } from './outcome.ts'
import type { ScriptReply } from './protocol.ts'

/** Keys of the in-process limiter that stands in while Redis is down. */
export const FALLBACK_MAX_KEYS = 10_000

/**
 * Decides a group while Redis cannot: each policy by its onRedisError. A 'closed' policy makes the
 * request unavailable (503); 'local' policies are decided in this process with their `localShare`
 * of the quota, a buffered policy without one with 1 / the live instances it last counted (a
 * memory store shared by the engines of one key prefix, acquired on first use); 'open' ones allow,
 * saying nothing of the quota.
 */
export class RedisFallback {
  private store: MemoryStore | null = null
  private readonly storeId: string
  private readonly now: () => number
  /** The live instances buffered mode last counted (1 without buffered policies). */
  private readonly instances: () => number

  constructor(keyPrefix: string, instances: () => number, now: () => number = Date.now) {
    this.storeId = `local\0${keyPrefix}`
    this.instances = instances
    this.now = now
  }

  decide(
    group: Group,
    operation: RequestOperation,
    outcome: Outcome,
    metrics: RateLimitMetrics,
    names: KeyNames,
  ): void {
    outcome.degraded = true
    const closed = group.policies.find((p) => p.onRedisError === 'closed')
    if (closed) {
      outcome.unavailable = closed
      for (const p of group.policies) metrics.decision(p, 'degraded_closed')
      return
    }
    const local: number[] = []
    group.policies.forEach((p, i) => {
      if (p.onRedisError === 'local') local.push(i)
    })
    let reply: ScriptReply | null = null
    const instances = this.instances()
    if (local.length > 0) {
      this.store ??= acquireStore(this.storeId, FALLBACK_MAX_KEYS, this.now)
      const call = callOf(group, operation, nonceFor(group), names, local, instances)
      try {
        reply = this.store.answer(group.policies[0]!.algorithm, call)
      } catch (err) {
        throw new RateLimitError(
          local.map((i) => group.policies[i]!.name),
          `the local limiter refused the call: ${(err as Error).message}`,
          err,
        )
      }
    }
    const allowed = reply === null || reply.allowed
    if (allowed && reply && reply.delayMs > 0) outcome.delayMs = Math.max(outcome.delayMs, reply.delayMs)
    group.policies.forEach((policy, i) => {
      const position = local.indexOf(i)
      if (position < 0) {
        const resolved = group.resolved?.[i]
        // Open: nothing is known about the quota, so only the policy itself is advertised.
        outcome.decisions.push({
          policy,
          allowed: true,
          remaining: null,
          resetMs: 0,
          retryMs: 0,
          limit: resolved ? resolved.quota.limit : policy.limit,
          header: resolved ? resolved.header : policy.header,
          isBanned: false,
        })
        if (operation === 'consume') metrics.decision(policy, 'degraded_open')
        return
      }
      const answer = reply!.policies[position]!
      // This process's share, as the local limiter enforces and advertises it.
      const shared = localResolvedOf(group, i, instances)
      const decision = {
        policy,
        allowed,
        remaining: answer.remaining,
        resetMs: answer.resetMs,
        retryMs: answer.retryMs,
        limit: shared.quota.limit,
        header: shared.header,
        isBanned: answer.ban !== 'none',
      }
      addDecision(outcome, decision, answer.ban, group.identity)
      if (operation === 'consume')
        metrics.decision(policy, allowed ? 'degraded_local_allowed' : 'degraded_local_rejected')
    })
    settleRejection(outcome, allowed)
  }

  /** `reset`: what this process counted for the keys goes too. */
  delete(keys: readonly string[]): void {
    this.store?.delete(keys)
  }

  close(): void {
    if (this.store) releaseStore(this.storeId)
    this.store = null
  }
}

/**
 * Redis error replies that say the server cannot serve anyone right now (loading, a busy script,
 * a failover in progress, out of memory, refused credentials), not that this call was wrong.
 */
const UNAVAILABLE_REPLIES = new Set([
  'LOADING',
  'BUSY',
  'MASTERDOWN',
  'CLUSTERDOWN',
  'TRYAGAIN',
  'READONLY',
  'NOREPLICAS',
  'MISCONF',
  'OOM',
  'NOAUTH',
  'NOPERM',
])

/**
 * Connection failures and timeouts (any error that is not a Redis reply) and the replies above
 * mean Redis is down. Any other reply (a script error, a key of another type) is about the keys
 * of this call: their policies follow their onRedisError, and Redis stays in use for the others.
 */
export function redisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error) || err.name !== 'ReplyError') return true
  const space = err.message.indexOf(' ')
  return UNAVAILABLE_REPLIES.has(space < 0 ? err.message : err.message.slice(0, space))
}
