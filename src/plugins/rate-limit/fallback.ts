import type { FastifyBaseLogger } from 'fastify'
import { RateLimitError } from './errors.ts'
import { callOf, type Group, type KeyNames, localResolvedOf, nonceFor } from './groups.ts'
import { acquireStore, type MemoryStore, releaseStore } from './memory.ts'
import type { RateLimitMetrics } from './metrics.ts'
import { addDecision, type Outcome, type RequestOperation, settleRejection } from './outcome.ts'
import type { Algorithm, ScriptCall, ScriptReply } from './protocol.ts'

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
    let call: ScriptCall | null = null
    const instances = this.instances()
    if (local.length > 0) {
      this.store ??= acquireStore(this.storeId, FALLBACK_MAX_KEYS, this.now)
      call = callOf(group, operation, nonceFor(group), names, local, instances)
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
      // A slot taken here is given back here when the response ends, a reservation reconciled here.
      const pending =
        policy.algorithm === 'concurrency' ? outcome.releases : policy.settle ? outcome.settlements : null
      if (allowed && operation === 'consume' && pending)
        pending.push({
          policy,
          nonce: call!.nonce,
          call: { ...call!.policies[position]!, maxDelayMs: 0, refundWindow: answer.refundWindow },
          local: true,
        })
    })
    settleRejection(outcome, allowed)
  }

  /** A call on the local limiter: a concurrency slot it gave, given back. */
  answer(algorithm: Algorithm, call: ScriptCall): void {
    this.store?.answer(algorithm, call)
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

/** Decisions taken without Redis are logged at most this often per engine (each one is counted). */
const UNAVAILABLE_LOG_INTERVAL_MS = 10_000

/** What an engine says when Redis cannot decide: counted every time, logged sparingly. */
export class RedisTroubleNotes {
  private lastUnavailableLog = 0
  /** Policies whose script call Redis refused, logged once each (every later refusal is counted). */
  private readonly scriptErrorsLogged = new Set<string>()

  constructor(
    private readonly log: FastifyBaseLogger,
    private readonly metrics: RateLimitMetrics,
    private readonly keyPrefix: string,
    private readonly now: () => number,
  ) {}

  /** Fail-open is a policy, not a silence: counted every time, logged at most every 10 s. */
  unavailable(reason: string, err?: unknown): void {
    this.metrics.unavailable()
    const now = this.now()
    if (now - this.lastUnavailableLog < UNAVAILABLE_LOG_INTERVAL_MS) return
    this.lastUnavailableLog = now
    this.log.warn(
      { err, reason },
      'Redis unavailable, policies decide by their onRedisError (open, closed or local)',
    )
  }

  /**
   * Redis refused a policy's script (WRONGTYPE: a key of another type where the policy keeps its
   * counter; or any other script error): no request can fix it, so it is logged once per policy,
   * with the keys and what to do, at error level; every refusal is counted in
   * rate_limit_redis_unavailable_total and by the decision's degraded outcome.
   */
  scriptError(group: Group, keys: readonly string[], err: Error): void {
    this.metrics.unavailable()
    const names = group.policies.map((p) => p.name)
    if (names.every((name) => this.scriptErrorsLogged.has(name))) return
    for (const name of names) this.scriptErrorsLogged.add(name)
    const modes = group.policies.map((p) => `'${p.name}': ${p.onRedisError}`).join(', ')
    this.log.error(
      { err, policy: names.join(', '), keys },
      `Redis refused the script of policy '${names.join("', '")}' on ${keys.join(', ')} (${err.message}); until fixed it is decided by its onRedisError (${modes}). ` +
        `A key of another type under the key prefix '${this.keyPrefix}' means something else writes there: give this plugin a keyPrefix of its own, or delete those keys (they expire with their TTL)`,
    )
  }
}
