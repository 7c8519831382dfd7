import type { FastifyBaseLogger } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'
import { callOf, type Group, type KeyNames, quotaOf } from './groups.ts'
import { type Lease, LeaseBook, type LeaseReport } from './leases.ts'
import type { RateLimitMetrics } from './metrics.ts'
import { addDecision, type Outcome, type RequestOperation } from './outcome.ts'
import type { Quota, ScriptCall, ScriptReply } from './protocol.ts'
import type { Decision, Policy } from './types.ts'

/** What a request took of a lease, given back if a later policy refuses it. */
export interface Taken {
  lease: Lease
  cost: number
}

/** The engine's exact path, which buffered decisions fall back on: one script call, the fallback, a reply applied. */
export interface ExactPath extends KeyNames {
  /** The script call's reply, or null when Redis cannot answer (the fallback must decide). */
  send(group: Group, call: ScriptCall): Promise<{ reply: ScriptReply; call: ScriptCall } | null>
  /** Rejects the group when this process remembers it over its limit. */
  rejectedFromCache(group: Group, outcome: Outcome): boolean
  /** Decides the group by its policies' onRedisError. */
  fallBack(group: Group, outcome: Outcome): void
  /** Decisions from a reply, as for any exact call (a refusal is cached as over-limit). */
  apply(
    group: Group,
    operation: RequestOperation,
    outcome: Outcome,
    reply: ScriptReply,
    call: ScriptCall,
  ): void
}

/**
 * Buffered policies on Redis: requests admitted from this instance's leases (leases.ts), a lease
 * taken through the engine's exact path when one runs out. Each buffered policy is a group of its own.
 */
export class BufferedPolicies {
  private readonly book: LeaseBook

  constructor(
    private readonly exact: ExactPath,
    private readonly metrics: RateLimitMetrics,
    redis: RedisClient,
    keyPrefix: string,
    private readonly now: () => number,
    log: FastifyBaseLogger,
  ) {
    this.book = new LeaseBook(redis, keyPrefix, now, log, metrics)
  }

  /**
   * A buffered policy (one per group): admitted from this instance's lease when it has the units;
   * else one call takes a new lease, this request's cost included, while requests of the same key
   * arriving meanwhile wait for it. A refusal is the exact decision (and is cached as over-limit).
   * Decided at once, without a promise, when this process's lease holds the cost.
   */
  decide(group: Group, outcome: Outcome, taken: Taken[] | null): void | Promise<void> {
    const book = this.bookFor(group.policies[0]!)
    const lease = book.take(group.keys[0]!, group.costs[0]!)
    if (!lease) return this.decideLeasing(book, group, outcome, taken)
    taken?.push({ lease, cost: group.costs[0]! })
    this.admitFromLease(group, outcome, lease)
  }

  /** The lease is short: waits for one in flight, or asks Redis for a new one. */
  private async decideLeasing(
    book: LeaseBook,
    group: Group,
    outcome: Outcome,
    taken: Taken[] | null,
  ): Promise<void> {
    const key = group.keys[0]!
    const cost = group.costs[0]!
    for (let pending = book.pending.get(key); pending; pending = book.pending.get(key)) {
      await pending
      // The lease it waited for was refused: the key is over its limit, and this request too.
      if (this.exact.rejectedFromCache(group, outcome)) return
      const lease = book.take(key, cost)
      if (lease) {
        taken?.push({ lease, cost })
        return this.admitFromLease(group, outcome, lease)
      }
    }
    const acquired = this.acquire(book, group, cost, outcome, taken)
    book.pending.set(key, acquired)
    try {
      await acquired
    } finally {
      book.pending.delete(key)
    }
  }

  private async acquire(
    book: LeaseBook,
    group: Group,
    cost: number,
    outcome: Outcome,
    taken: Taken[] | null,
  ): Promise<void> {
    const policy = group.policies[0]!
    const key = group.keys[0]!
    const quota = quotaOf(group, 0)
    const sync = policy.sync!
    let size = book.sizeFor(key, quota, sync, cost)
    for (let attempt = 0; ; attempt++) {
      const call = callOf(group, 'consume', '', this.exact)
      call.policies[0]!.cost = size
      const sentAt = this.now()
      const sent = await this.exact.send(group, call)
      if (sent === null) return this.exact.fallBack(group, outcome)
      const { reply } = sent
      const answer = reply.policies[0]!
      book.remember(key, policy, answer.remaining, answer.resetMs, sentAt)
      if (reply.allowed) {
        const resolved = group.resolved?.[0]
        const lease = book.granted({
          policy,
          key,
          quota,
          header: resolved ? resolved.header : policy.header,
          limit: quota.limit,
          size,
          taken: cost,
          remaining: answer.remaining,
          resetMs: answer.resetMs,
          refundWindow: answer.refundWindow,
          sentAt,
        })
        taken?.push({ lease, cost })
        return this.admitFromLease(group, outcome, lease)
      }
      // Refused a lease larger than the request while Redis still has units for it: a smaller share.
      if (size > cost && attempt === 0) {
        size = book.sizeFor(key, quota, sync, cost, answer.remaining)
        continue
      }
      call.policies[0]!.cost = cost
      answer.retryMs = Math.max(answer.retryMs, refusalHoldMs(policy, quota))
      return this.exact.apply(group, 'consume', outcome, reply, call)
    }
  }

  /** A request admitted by a buffered policy: what it says is an estimate (Redis's last word and this lease). */
  private admitFromLease(group: Group, outcome: Outcome, lease: Lease): void {
    const now = this.now()
    const decision: Decision = {
      policy: lease.policy,
      allowed: true,
      remaining: lease.remaining + lease.left,
      resetMs: Math.max(0, lease.resetAt - now),
      retryMs: 0,
      limit: lease.limit,
      header: lease.header,
      isBanned: false,
    }
    addDecision(outcome, decision, 'none', group.identity)
    this.metrics.decision(lease.policy, 'allowed')
  }

  private bookFor(policy: Policy): LeaseBook {
    void this.book.watch(policy.sync!)
    return this.book
  }

  /** At ready: the buffered policies' heartbeat starts, so the first leases know how many instances share them. */
  async startSync(policies: readonly Policy[]): Promise<void> {
    for (const policy of policies) if (policy.sync) await this.book.watch(policy.sync)
  }

  /** A key was reset: its lease is dropped. */
  forget(key: string): void {
    this.book.forget(key)
  }

  /** A request an exact policy refused: what it took of leases goes back. */
  giveBack(taken: readonly Taken[]): void {
    for (const { lease, cost } of taken) this.book.giveBack(lease, cost)
  }

  /** The app is closing: leases go back, the heartbeat leaves. */
  close(): Promise<void> {
    return this.book.close()
  }

  /** `app.rateLimiter.sync()`: the sync tick, now. */
  async sync(): Promise<void> {
    await this.book.tick(true)
  }

  /** Live instances of the key prefix, this one included, as the last heartbeat said. */
  get instances(): number {
    return this.book.instances
  }

  /** `app.rateLimiter.leases()`. */
  leaseReport(): LeaseReport {
    return this.book.report()
  }
}

/**
 * How long a refused lease is answered from the over-limit cache at least. A token bucket or GCRA
 * refills a unit at a time: asked again at every unit, each lease would be one unit and each
 * request a call. Held for a sync interval, the next lease takes what refilled meanwhile; at most
 * half the time it takes to refill from empty, so no unit overflows the bucket while held (the
 * admitted rate stays the refill rate). A fixed window's refusal already lasts until its end.
 */
function refusalHoldMs(policy: Policy, quota: Quota): number {
  if (policy.algorithm === 'fixed-window') return 0
  const fillMs =
    policy.algorithm === 'token-bucket' ? (quota.limit * 1000) / quota.refillPerSecond : quota.windowMs
  return Math.min(policy.sync!.intervalMs, Math.floor(fillMs / 2))
}
