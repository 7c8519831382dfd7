import type { FastifyRequest } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'
import { commandTimeoutOf } from '../../redis/command-bounds.ts'
import { withTimeout } from '../../redis/timeout.ts'
import type { PrincipalFunction } from '../common/principal.ts'
import { type Asked, askPolicies, capCost, overridden, resolveFor } from './asked.ts'
import { BufferedPolicies, type ExactPath, type Taken } from './buffered.ts'
import type { EngineOptions } from './engine-options.ts'
import { RateLimitError } from './errors.ts'
import { FALLBACK_MAX_KEYS, RedisFallback, RedisTroubleNotes, redisUnavailable } from './fallback.ts'
import { addToGroup, callOf, type Group, GroupsOfOne, nonceFor } from './groups.ts'
import { IdentityTags } from './keys.ts'
import { leaseClock } from './leases.ts'
import { acquireStore, type MemoryStore, memoryStoreId, releaseStore } from './memory.ts'
import type { RateLimitMetrics } from './metrics.ts'
import {
  addDecision,
  addShadow,
  emptyOutcome,
  inFlight,
  type Outcome,
  type RateLimitResult,
  type Refund,
  type RequestOperation,
  resultOf,
  settleRejection,
} from './outcome.ts'
import type { OverrideBook } from './overrides.ts'
import { decodeReply, encodeCall, runEncoded, type ScriptCall, type ScriptReply } from './protocol.ts'
import { SlotReturns } from './slot-returns.ts'
import type { Decision, Policy, Resolved } from './types.ts'

export { memoryStoreOf } from './memory.ts'

const cacheKey = (group: Group) => group.id + group.policies.map((p) => p.name).join(',')

/** Decides requests against policies: one script call per key identity, with fallbacks. */
export class RateLimitEngine implements ExactPath {
  private readonly redis: RedisClient | null
  private readonly options: EngineOptions
  /** `store: 'memory'`: the store every decision is made in. */
  private readonly memory: MemoryStore | null
  private readonly memoryId: string
  /** Decides while Redis cannot, by the policies' onRedisError. */
  private readonly fallback: RedisFallback
  /** Groups already over their limit, answered without Redis until their retry time. */
  private readonly overLimit = new Map<string, { until: number; cost: number; decision: Decision }>()
  private readonly ownTimeout: boolean
  private readonly now: () => number
  private redisDownUntil = 0
  private readonly tags = new IdentityTags()
  private readonly groupsOfOne = new GroupsOfOne()
  private readonly notes: RedisTroubleNotes
  private readonly metrics: RateLimitMetrics
  private readonly principal: PrincipalFunction
  /** Buffered policies' leases (Redis store only: in memory every decision is exact and as cheap). */
  readonly buffered: BufferedPolicies | null
  readonly overrides: OverrideBook | null
  /** Concurrency slots on their way back to Redis (Redis store only). */
  private readonly slotReturns: SlotReturns | null

  constructor(redis: RedisClient | null, options: EngineOptions) {
    this.redis = redis
    this.options = options
    this.metrics = options.metrics
    this.principal = options.principal ?? (() => null)
    this.overrides = options.overrides ?? null
    this.memoryId = memoryStoreId(options.keyPrefix)
    this.now = options.now ?? Date.now
    this.fallback = new RedisFallback(options.keyPrefix, () => this.buffered?.instances ?? 1, this.now)
    this.notes = new RedisTroubleNotes(options.log, this.metrics, options.keyPrefix, this.now)
    this.memory = redis
      ? null
      : acquireStore(this.memoryId, options.memoryMaxKeys ?? FALLBACK_MAX_KEYS, this.now)
    this.buffered = redis
      ? new BufferedPolicies(
          this,
          this.metrics,
          redis,
          options.keyPrefix,
          leaseClock(options.now),
          options.log,
        )
      : null
    this.slotReturns = redis ? new SlotReturns(redis) : null
    // Without a command timeout on the client, a stalled Redis would hold requests: bound it here.
    this.ownTimeout = redis !== null && !commandTimeoutOf(redis)
  }

  /**
   * The algorithm is part of the key: one name reused for another algorithm (a new deploy, another
   * app on the same prefix) gets keys of its own instead of the other script's data.
   */
  keyOf(tag: string, policy: Policy): string {
    return `${this.options.keyPrefix}{${tag}}:${policy.name}:${policy.algorithm}`
  }

  /**
   * A per-request window is part of the key, and so is every sliding counter's window: its state
   * is window indexes, which mean other times under another window length (a deploy that changes
   * it, or two instances with different settings during a rolling deploy), so each length counts
   * on its own key.
   */
  counterKey(tag: string, policy: Policy, resolved: Resolved | undefined): string {
    const key = this.keyOf(tag, policy)
    if (policy.windowFn) return `${key}:${resolved!.quota.windowMs}`
    return policy.algorithm === 'sliding-counter' ? `${key}:${policy.windowMs}` : key
  }

  /**
   * Consumes or only checks every applicable policy; null when none applies. Answered at once,
   * without a promise, when nothing asks Redis or waits (a lease's units, the memory store).
   */
  evaluate(
    request: FastifyRequest,
    policies: readonly Policy[],
    operation: RequestOperation,
  ): Outcome | null | Promise<Outcome | null> {
    const asked = askPolicies(request, policies, this.principal, this.overrides)
    if (asked instanceof Promise) return asked.then((a) => this.decideAsked(a, operation))
    return this.decideAsked(asked, operation)
  }

  private decideAsked(asked: Asked[], operation: RequestOperation): Outcome | null | Promise<Outcome | null> {
    if (asked.length === 1 && asked[0]!.policy.shadow === null) return this.decideOne(asked[0]!, operation)
    const groups = new Map<string, Group>()
    // Each shadow policy is a group of its own (see addToGroup), kept apart from the enforced ones.
    const shadows = new Map<string, Group>()
    for (const one of asked)
      addToGroup(one.policy.shadow ? shadows : groups, one, this.tags.of(one.identity), this)
    if (groups.size === 0 && shadows.size === 0) return null
    return this.decideAll(groups, shadows, operation)
  }

  /** One enforced policy (a route's IP limit, say): no grouping, and no promise when none is needed. */
  private decideOne(asked: Asked, operation: RequestOperation): Outcome | Promise<Outcome> {
    const outcome = emptyOutcome()
    const group = this.groupsOfOne.of(asked, this.tags, this)
    const decided = this.decideGroup(group, operation, outcome, null)
    return decided ? decided.then(() => outcome) : outcome
  }

  private async decideAll(groups: Map<string, Group>, shadows: Map<string, Group>, op: RequestOperation) {
    const outcome = emptyOutcome()
    // Shadow policies are decided beside the enforced ones (their script calls go out together),
    // each as if it were the route's only policy.
    const shadowed =
      shadows.size > 0
        ? Promise.all([...shadows.values()].map((group) => this.decideShadow(group, op)))
        : null
    if (groups.size === 1) await this.decideGroup(groups.values().next().value!, op, outcome, null)
    else if (groups.size > 1) await this.decideEnforced(groups, op, outcome)
    if (shadowed) for (const shadow of await shadowed) addShadow(outcome, shadow)
    return outcome
  }

  private async decideEnforced(
    groups: Map<string, Group>,
    operation: RequestOperation,
    outcome: Outcome,
  ): Promise<void> {
    // Buffered groups first: decided in this process, they refuse without a Redis call, and what
    // they took goes back to the lease when an exact policy after them refuses. Then concurrency:
    // its slots go back at once when a policy after it refuses (the hooks give back `releases`).
    const order = (group: Group) =>
      this.isBuffered(group) ? 2 : group.policies.some((p) => p.algorithm === 'concurrency') ? 1 : 0
    const ordered = [...groups.values()].sort((a, b) => order(b) - order(a))
    const taken: Taken[] = []
    for (const group of ordered) {
      await this.decideGroup(group, operation, outcome, taken)
      if (outcome.rejected || outcome.unavailable) {
        this.buffered?.giveBack(taken)
        return
      }
    }
  }

  /**
   * One shadow policy, decided and counted as if it enforced, in an outcome of its own: what it
   * would refuse, delay or ban never reaches the request. A store error is its own too.
   */
  private async decideShadow(group: Group, operation: RequestOperation): Promise<Outcome> {
    const shadow = emptyOutcome()
    try {
      await this.decideGroup(group, operation, shadow, null)
    } catch (err) {
      this.metrics.decision(group.policies[0]!, 'error')
      this.options.log.error({ err, policy: group.policies[0]!.name }, 'shadow rate-limit policy failed')
    }
    if (shadow.rejected && operation === 'consume')
      shadow.wouldReject.push({ decision: shadow.rejected, key: group.identity })
    return shadow
  }

  /** Decided from a lease: a buffered policy on Redis. */
  private isBuffered(group: Group): boolean {
    return this.buffered !== null && group.policies[0]!.sync !== null
  }

  /** A group over its limit until a retry time this process remembers: rejected without Redis (ExactPath). */
  rejectedFromCache(group: Group, outcome: Outcome): boolean {
    const cached = this.overLimit.size > 0 ? this.overLimit.get(cacheKey(group)) : undefined
    if (!cached) return false
    const now = this.now()
    if (now < cached.until && Math.max(...group.costs) >= cached.cost) {
      const left = cached.until - now
      outcome.rejected = { ...cached.decision, resetMs: left, retryMs: left }
      outcome.decisions.push(outcome.rejected)
      this.metrics.decision(cached.decision.policy, 'rejected_cached')
      return true
    }
    this.overLimit.delete(cacheKey(group))
    return false
  }

  /** ExactPath: the fallback, for buffered decisions. */
  fallBack(group: Group, outcome: Outcome): void {
    this.fallback.decide(group, 'consume', outcome, this.metrics, this)
  }

  /** Decided at once, without a promise, when no Redis call or wait is needed. */
  private decideGroup(
    group: Group,
    operation: RequestOperation,
    outcome: Outcome,
    taken: Taken[] | null,
  ): void | Promise<void> {
    if (operation === 'consume' && this.rejectedFromCache(group, outcome)) return
    const algorithm = group.policies[0]!.algorithm
    const nonce = nonceFor(group)
    if (this.memory) {
      const call = callOf(group, operation, nonce, this)
      let reply: ScriptReply
      try {
        reply = this.memory.answer(algorithm, call)
      } catch (err) {
        throw new RateLimitError(
          group.policies.map((p) => p.name),
          `the memory store refused the call: ${(err as Error).message}`,
          err,
        )
      }
      return this.apply(group, operation, outcome, reply, call)
    }
    if (operation === 'consume' && this.isBuffered(group)) return this.buffered!.decide(group, outcome, taken)
    return this.decideOnRedis(group, operation, outcome, nonce)
  }

  private async decideOnRedis(group: Group, operation: RequestOperation, outcome: Outcome, nonce: string) {
    const reply = await this.send(group, callOf(group, operation, nonce, this))
    if (reply === null) return this.fallback.decide(group, operation, outcome, this.metrics, this)
    this.apply(group, operation, outcome, reply.reply, reply.call)
  }

  /**
   * One script call to Redis for a group: its reply, or null when Redis cannot answer (down,
   * failed within retryRedisAfterMs, or refusing the script), and the group's policies must be
   * decided by their onRedisError.
   */
  async send(group: Group, call: ScriptCall): Promise<{ reply: ScriptReply; call: ScriptCall } | null> {
    const redis = this.redis!
    if (redis.status !== 'ready') {
      this.notes.unavailable(`Redis connection is ${redis.status}`)
      return null
    }
    if (this.now() < this.redisDownUntil) {
      this.notes.unavailable('Redis failed within retryRedisAfterMs')
      return null
    }
    const algorithm = group.policies[0]!.algorithm
    const encoded = encodeCall(algorithm, call)
    let wire: number[]
    const started = performance.now()
    try {
      const sent = runEncoded(redis, algorithm, encoded)
      wire = await (this.ownTimeout ? answeredWithin(sent, this.options.timeoutMs) : sent)
    } catch (err) {
      if (!redisUnavailable(err)) {
        this.notes.scriptError(group, encoded.keys, err as Error)
        return null
      }
      this.redisDownUntil = this.now() + this.options.retryRedisAfterMs
      this.notes.unavailable((err as Error).message, err)
      return null
    }
    this.metrics.scriptSeconds(algorithm).observe((performance.now() - started) / 1000)
    return { reply: decodeReply(wire, call.policies.length), call }
  }

  /** Turns a script reply into decisions, refunds and the over-limit cache entry. */
  apply(
    group: Group,
    operation: RequestOperation,
    outcome: Outcome,
    reply: ScriptReply,
    call: ScriptCall,
  ): void {
    const { metrics } = this
    const { allowed } = reply
    const delayed = allowed && reply.delayMs > 0
    if (delayed) outcome.delayMs = Math.max(outcome.delayMs, reply.delayMs)
    group.policies.forEach((policy, i) => {
      const answer = reply.policies[i]!
      const resolved = group.resolved?.[i]
      const decision: Decision = {
        policy,
        allowed,
        remaining: answer.remaining,
        resetMs: answer.resetMs,
        retryMs: answer.retryMs,
        limit: resolved ? resolved.quota.limit : policy.limit,
        header: resolved ? resolved.header : policy.header,
        isBanned: answer.ban !== 'none',
      }
      if (policy.algorithm === 'concurrency') inFlight(decision)
      addDecision(outcome, decision, answer.ban, group.identity)
      if (operation === 'consume') {
        metrics.decision(policy, allowed ? (delayed ? 'delayed' : 'allowed') : 'rejected')
      }
      if (allowed && operation === 'consume') {
        const pending = policy.isFailure
          ? outcome.refunds
          : policy.algorithm === 'concurrency'
            ? outcome.releases
            : policy.settle
              ? outcome.settlements
              : null
        pending?.push({
          policy,
          nonce: call.nonce,
          call: { ...call.policies[i]!, maxDelayMs: 0, refundWindow: answer.refundWindow },
        })
      }
    })
    settleRejection(outcome, allowed)
    if (!allowed && operation === 'consume' && this.cacheable(group)) this.remember(group, outcome.rejected!)
  }

  /**
   * Count-only-failures, settled and delaying policies change state outside this cache's view (a
   * refund, a settlement), and a per-request limit may differ on the next request: never cached.
   */
  private cacheable(group: Group): boolean {
    return (
      this.options.overLimitCacheKeys > 0 &&
      group.resolved === null &&
      // A slot frees whenever a request ends: a refusal says nothing of the next request.
      group.policies.every(
        (p) =>
          !p.penalised && !p.isFailure && !p.settle && p.maxDelayMs === 0 && p.algorithm !== 'concurrency',
      )
    )
  }

  private remember(group: Group, decision: Decision): void {
    if (this.overLimit.size >= this.options.overLimitCacheKeys)
      this.overLimit.delete(this.overLimit.keys().next().value!)
    const cost = Math.min(...group.costs)
    this.overLimit.set(cacheKey(group), { until: this.now() + decision.retryMs, cost, decision })
  }

  /** Lets go of the in-process stores this engine used, and gives back its leases (the app is closing). */
  async close(): Promise<void> {
    await this.overrides?.close()
    if (this.memory) releaseStore(this.memoryId)
    this.fallback.close()
    await this.buffered?.close()
    await this.slotReturns?.flush()
  }

  /**
   * Gives back what a successful request consumed under a count-only-failures policy, or the slot
   * of a request that ended under a concurrency policy (where it was taken: Redis or the local limiter).
   */
  async refund(refund: Refund): Promise<void> {
    const { policy, nonce, call: taken } = refund
    if (policy.algorithm === 'concurrency' && !this.memory && !refund.local) {
      // A slot given back is its fields removed: an HDEL, no script, shared by the turn's returns.
      const slots = Array.from({ length: taken.cost }, (_, k) => `${nonce}:${k + 1}`)
      return this.slotReturns!.giveBack(taken.key, slots)
    }
    const call: ScriptCall = {
      operation: 'refund',
      nonce: refund.nonce,
      policies: [refund.call],
      blocks: [],
      penalties: [],
    }
    await this.run(refund.policy, call, refund.local)
  }

  /** A call of its own (a refund, a charge) where the request was decided: memory, the local limiter or Redis. */
  async run(policy: Policy, call: ScriptCall, local = false): Promise<void> {
    if (this.memory || local) (this.memory ?? this.fallback).answer(policy.algorithm, call)
    else await runEncoded(this.redis!, policy.algorithm, encodeCall(policy.algorithm, call))
  }

  /** `app.rateLimiter.consume`: one policy, one identity, the same keys a route uses. */
  async consume(
    policy: Policy,
    identity: string,
    cost: number,
    request: FastifyRequest | undefined,
  ): Promise<RateLimitResult> {
    const resolved = overridden(
      policy,
      this.overrides?.limitOf(policy.name, identity),
      await resolveFor(policy, request, 'consume()'),
    )
    const groups = new Map<string, Group>()
    const asked = { policy, identity, cost: capCost(policy, cost, resolved), resolved }
    addToGroup(groups, asked, this.tags.of(identity), this)
    const group = groups.values().next().value!
    const outcome = emptyOutcome()
    // Cost 0 asks without consuming: a peek.
    await this.decideGroup(group, cost === 0 ? 'peek' : 'consume', outcome, null)
    return resultOf(outcome, resolved ? resolved.quota.limit : policy.limit)
  }

  /** `app.rateLimiter.reset`: deletes the key's counter and block (and what this process remembers of them). */
  async reset(policy: Policy, identity: string, request: FastifyRequest | undefined): Promise<void> {
    const resolved = await resolveFor(policy, request, 'reset()')
    const tag = this.tags.of(identity)
    const keys = [this.counterKey(tag, policy, resolved)]
    if (policy.penalised) keys.push(`${keys[0]}:rejections`)
    if (policy.blockMs > 0) keys.push(`${this.keyOf(tag, policy)}:block`)
    const prefix = `${policy.script}${tag}`
    for (const id of this.overLimit.keys()) if (id.startsWith(prefix)) this.overLimit.delete(id)
    this.fallback.delete(keys)
    this.buffered?.forget(keys[0]!)
    if (this.memory) return this.memory.delete(keys)
    const call = this.redis!.del(...keys)
    await (this.ownTimeout ? answeredWithin(call, this.options.timeoutMs) : call)
  }

  /** `app.rateLimiter.block`: rejects the key under this policy for `ms` from now. */
  async block(policy: Policy, identity: string, ms: number): Promise<void> {
    const key = `${this.keyOf(this.tags.of(identity), policy)}:block`
    if (this.memory) return this.memory.block(key, ms)
    const call = this.redis!.set(key, '1', 'PX', ms)
    await (this.ownTimeout ? answeredWithin(call, this.options.timeoutMs) : call)
  }
}

/** A script call bounded by the plugin's `timeoutMs`, for a client without a commandTimeout of its own. */
const answeredWithin = <T>(call: Promise<T>, ms: number) =>
  withTimeout(call, ms, () => {
    throw new Error(`Redis did not answer within ${ms} ms`)
  })
