import { randomBytes } from 'node:crypto'
import type { FastifyBaseLogger, FastifyRequest } from 'fastify'
import { type RedisClient, runScript } from '../../lua/index.ts'
import type { PrincipalFunction } from '../shared/principal.ts'
import { identityTag, MAX_KEY_INPUT } from './keys.ts'
import { LocalLimiter } from './local.ts'
import type { RateLimitMetrics } from './metrics.ts'
import type { Policy } from './policy.ts'

export interface Decision {
  policy: Policy
  allowed: boolean
  /** Null when nothing true can be said (Redis down, policy open). */
  remaining: number | null
  resetMs: number
  retryMs: number
  /** The RateLimit-Policy item actually enforced (a local limiter advertises its share). */
  header: string
}

/** What undoes a consume for a count-only-failures policy when the response is a success. */
export interface Refund {
  policy: Policy
  key: string
  cost: number
  tag: number
  nonce: string
}

export interface Outcome {
  decisions: Decision[]
  /** The first violated policy, when the request is rejected. */
  rejected: Decision | null
  /** A closed policy could not be checked: answer 503. */
  unavailable: Policy | null
  delayMs: number
  refunds: Refund[]
}

interface Group {
  id: string
  policies: Policy[]
  costs: number[]
  keys: string[]
}

const cacheKey = (group: Group) => group.id + group.policies.map((p) => p.name).join(',')

export interface EngineOptions {
  keyPrefix: string
  overLimitCacheKeys: number
  retryRedisAfterMs: number
  timeoutMs: number
  log: FastifyBaseLogger
}

/** Decisions taken without Redis are logged at most this often per engine (each one is counted). */
const UNAVAILABLE_LOG_INTERVAL_MS = 10_000

/**
 * Sliding-log members are `<nonce><sequence>:<n>`. Both are per process (per copy of this module),
 * not per engine: two plugin instances sharing a key space must never write the same member, or
 * one request's entry overwrites another's and the log undercounts.
 */
const PROCESS_NONCE = randomBytes(6).toString('base64url')
let sequence = 0

/**
 * Local limiters are per process for one quota (key prefix, policy and its settings): two plugin
 * instances sharing a key space share one Redis counter, so in local mode they share the process's
 * share of it too. Released when the last engine using one closes.
 */
const sharedLocals = new Map<string, { limiter: LocalLimiter; users: number }>()

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
 * mean Redis is down. Any other reply (a script error, a key of another type) is about this call.
 */
function redisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error) || err.name !== 'ReplyError') return true
  const space = err.message.indexOf(' ')
  return UNAVAILABLE_REPLIES.has(space < 0 ? err.message : err.message.slice(0, space))
}

/**
 * A policy could not be applied to one request: one of its functions threw or returned what
 * cannot be counted, or Redis refused the script call. The route's bug, answered 500 for that
 * request only; never taken for a Redis outage.
 */
export class RateLimitError extends Error {
  readonly policies: string[]

  constructor(policies: string[], message: string, cause?: unknown) {
    super(`rate limit: policy '${policies.join("', '")}': ${message}`, { cause })
    this.name = 'RateLimitError'
    this.policies = policies
  }
}

/** A returned or thrown value in an error message, without calling anything of it. */
const shown = (value: unknown) => (typeof value === 'number' ? String(value) : `a ${typeof value}`)

/** Decides requests against policies: one script call per key identity, with fallbacks. */
export class RateLimitEngine {
  private readonly redis: RedisClient
  private readonly options: EngineOptions
  private readonly locals = new Map<string, LocalLimiter>()
  private readonly localIds: string[] = []
  /** Groups already over their limit, answered without Redis until their retry time. */
  private readonly overLimit = new Map<string, { until: number; cost: number; decision: Decision }>()
  private readonly ownTimeout: boolean
  private redisDownUntil = 0
  private readonly tags = new Map<string, string>()
  private lastUnavailableLog = 0
  /** Replaced once the app is ready: the metrics plugin's registry and the resolved principal. */
  metrics: RateLimitMetrics
  principal: PrincipalFunction = () => null

  constructor(redis: RedisClient, options: EngineOptions, metrics: RateLimitMetrics) {
    this.redis = redis
    this.options = options
    this.metrics = metrics
    const o = redis.options as { commandTimeout?: number; redisOptions?: { commandTimeout?: number } }
    // Without a command timeout on the client, a stalled Redis would hold requests: bound it here.
    this.ownTimeout = !(o.commandTimeout ?? o.redisOptions?.commandTimeout)
  }

  keyOf(tag: string, policy: Policy): string {
    return `${this.options.keyPrefix}{${tag}}:${policy.name}`
  }

  /** Consumes ('c') or only checks ('p') every applicable policy; null when none applies. */
  async evaluate(
    request: FastifyRequest,
    policies: readonly Policy[],
    op: 'c' | 'p',
  ): Promise<Outcome | null> {
    const groups = new Map<string, Group>()
    for (const policy of policies) {
      let identity: unknown
      let cost: unknown
      try {
        if (policy.allow?.(request)) continue
        identity = policy.key(request, this.principal)
        if (identity === null || identity === undefined) continue
        cost = typeof policy.cost === 'number' ? policy.cost : policy.cost(request)
      } catch (err) {
        throw new RateLimitError(
          [policy.name],
          `its allowList, key or cost function threw: ${err instanceof Error ? err.message : shown(err)}`,
          err,
        )
      }
      if (typeof identity !== 'string')
        throw new RateLimitError([policy.name], `its key function returned ${shown(identity)}, not a string`)
      // A constant cost was checked at boot. A computed one reaches Lua only as a whole number of
      // units: a fraction or a huge number breaks the script, a negative one would hand quota back.
      if (typeof policy.cost !== 'number') {
        if (!Number.isSafeInteger(cost) || (cost as number) < 0)
          throw new RateLimitError(
            [policy.name],
            `its cost function returned ${shown(cost)}, not a whole number of units (0 or more)`,
          )
        // Costs nothing: the policy has nothing to decide for this request.
        if (cost === 0) continue
        // It can never pass; limit + 1 says so to every script with small, exact numbers.
        if ((cost as number) > policy.limit) cost = policy.limit + 1
      }
      const tag = this.tagOf(identity)
      const id = `${policy.script}${tag}`
      const group = groups.get(id) ?? { id, policies: [], costs: [], keys: [] }
      if (!groups.has(id)) groups.set(id, group)
      group.policies.push(policy)
      group.costs.push(cost as number)
      group.keys.push(this.keyOf(tag, policy))
    }
    if (groups.size === 0) return null
    const outcome: Outcome = { decisions: [], rejected: null, unavailable: null, delayMs: 0, refunds: [] }
    for (const group of groups.values()) {
      await this.decideGroup(group, op, outcome)
      if (outcome.rejected || outcome.unavailable) break
    }
    return outcome
  }

  private async decideGroup(group: Group, op: 'c' | 'p', outcome: Outcome): Promise<void> {
    const { metrics } = this
    const cached = op === 'c' && this.overLimit.size > 0 ? this.overLimit.get(cacheKey(group)) : undefined
    if (cached) {
      const now = Date.now()
      if (now < cached.until && Math.max(...group.costs) >= cached.cost) {
        const left = cached.until - now
        outcome.rejected = { ...cached.decision, resetMs: left, retryMs: left }
        outcome.decisions.push(outcome.rejected)
        metrics.decision(cached.decision.policy.name, 'rejected_cached')
        return
      }
      this.overLimit.delete(cacheKey(group))
    }
    if (this.redis.status !== 'ready') {
      this.noteUnavailable(`Redis connection is ${this.redis.status}`)
      return this.degraded(group, op, outcome)
    }
    if (Date.now() < this.redisDownUntil) {
      this.noteUnavailable('Redis failed within retryRedisAfterMs')
      return this.degraded(group, op, outcome)
    }
    const script = group.policies[0]!.script
    // Only the sliding log stores members; the other scripts ignore the nonce slot.
    const nonce =
      group.policies[0]!.algorithm === 'sliding-log' ? `${PROCESS_NONCE}${(++sequence).toString(36)}` : ''
    const argv: Array<string | number> = [op, nonce]
    group.policies.forEach((p, i) => {
      argv.push(p.args[0], p.args[1], group.costs[i]!, p.maxDelayMs)
    })
    let reply: number[]
    const started = performance.now()
    try {
      const call = runScript<number[]>(this.redis, script, group.keys, argv)
      reply = await (this.ownTimeout ? withTimeout(call, this.options.timeoutMs) : call)
    } catch (err) {
      if (!redisUnavailable(err)) {
        throw new RateLimitError(
          group.policies.map((p) => p.name),
          `Redis refused the script call: ${(err as Error).message}`,
          err,
        )
      }
      this.redisDownUntil = Date.now() + this.options.retryRedisAfterMs
      this.noteUnavailable((err as Error).message, err)
      return this.degraded(group, op, outcome)
    }
    metrics.scriptSeconds(group.policies[0]!.algorithm).observe((performance.now() - started) / 1000)
    const allowed = reply[0] === 1
    const delayed = allowed && reply[1]! > 0
    if (delayed) outcome.delayMs = Math.max(outcome.delayMs, reply[1]!)
    group.policies.forEach((policy, i) => {
      const at = 2 + i * 4
      const decision: Decision = {
        policy,
        allowed,
        remaining: reply[at]!,
        resetMs: reply[at + 1]!,
        retryMs: reply[at + 2]!,
        header: policy.header,
      }
      outcome.decisions.push(decision)
      if (!allowed && decision.retryMs > 0 && !outcome.rejected) outcome.rejected = decision
      if (op === 'c') {
        metrics.decision(policy.name, allowed ? (delayed ? 'delayed' : 'allowed') : 'rejected')
      }
      if (allowed && op === 'c' && policy.isFailure) {
        outcome.refunds.push({
          policy,
          key: group.keys[i]!,
          cost: group.costs[i]!,
          tag: reply[at + 3]!,
          nonce,
        })
      }
    })
    // Every policy rejected only as a sibling of the violated one keeps its full quota.
    if (!allowed && !outcome.rejected) outcome.rejected = outcome.decisions[outcome.decisions.length - 1]!
    if (!allowed && op === 'c' && this.cacheable(group)) this.remember(group, outcome.rejected!)
  }

  /** Count-only-failures and delaying policies change state outside this cache's view: never cached. */
  private cacheable(group: Group): boolean {
    return (
      this.options.overLimitCacheKeys > 0 && group.policies.every((p) => !p.isFailure && p.maxDelayMs === 0)
    )
  }

  private remember(group: Group, decision: Decision): void {
    if (this.overLimit.size >= this.options.overLimitCacheKeys)
      this.overLimit.delete(this.overLimit.keys().next().value!)
    const cost = Math.min(...group.costs)
    this.overLimit.set(cacheKey(group), { until: Date.now() + decision.retryMs, cost, decision })
  }

  /** Fail-open is a policy, not a silence: counted every time, logged at most every 10 s. */
  private noteUnavailable(reason: string, err?: unknown): void {
    this.metrics.unavailable()
    const now = Date.now()
    if (now - this.lastUnavailableLog < UNAVAILABLE_LOG_INTERVAL_MS) return
    this.lastUnavailableLog = now
    this.options.log.warn(
      { err, reason },
      'rate limit: Redis unavailable, policies decide by their onRedisError (open, closed or local)',
    )
  }

  private degraded(group: Group, op: 'c' | 'p', outcome: Outcome): void {
    const { metrics } = this
    const closed = group.policies.find((p) => p.onRedisError === 'closed')
    if (closed) {
      outcome.unavailable = closed
      for (const p of group.policies) metrics.decision(p.name, 'degraded_closed')
      return
    }
    const now = Date.now()
    const locals = group.policies.map((p) => (p.onRedisError === 'local' ? this.local(p) : null))
    const verdicts = locals.map((l, i) => l?.decide(group.keys[i]!, group.costs[i]!, now, false))
    const allowed = verdicts.every((v) => !v || v.allowed)
    group.policies.forEach((policy, i) => {
      const local = locals[i]
      if (!local) {
        // Open: nothing is known about the quota, so only the policy itself is advertised.
        outcome.decisions.push({
          policy,
          allowed: true,
          remaining: null,
          resetMs: 0,
          retryMs: 0,
          header: policy.header,
        })
        if (op === 'c') metrics.decision(policy.name, 'degraded_open')
        return
      }
      const v =
        allowed && op === 'c' ? local.decide(group.keys[i]!, group.costs[i]!, now, true) : verdicts[i]!
      const decision: Decision = {
        policy,
        allowed,
        remaining: v.remaining,
        resetMs: v.resetMs,
        retryMs: v.retryMs,
        header: local.header,
      }
      outcome.decisions.push(decision)
      if (!allowed && !v.allowed && !outcome.rejected) outcome.rejected = decision
      if (op === 'c')
        metrics.decision(policy.name, allowed ? 'degraded_local_allowed' : 'degraded_local_rejected')
    })
  }

  private local(policy: Policy): LocalLimiter {
    let limiter = this.locals.get(policy.name)
    if (!limiter) {
      const id = `${this.options.keyPrefix}\0${policy.header}\0${policy.algorithm}\0${policy.args}\0${policy.localShare}`
      let shared = sharedLocals.get(id)
      if (!shared) {
        shared = { limiter: new LocalLimiter(policy), users: 0 }
        sharedLocals.set(id, shared)
      }
      shared.users++
      limiter = shared.limiter
      this.locals.set(policy.name, limiter)
      this.localIds.push(id)
    }
    return limiter
  }

  /** Lets go of the shared local limiters this engine used (the app is closing). */
  close(): void {
    for (const id of this.localIds) {
      const shared = sharedLocals.get(id)
      if (shared && --shared.users === 0) sharedLocals.delete(id)
    }
    this.localIds.length = 0
    this.locals.clear()
  }

  /**
   * Hashing is most of the per-request CPU outside Redis: recent identities keep their tag. Only
   * identities up to the hashed length are remembered: 10000 long client-supplied strings (a
   * body field can be a megabyte) would otherwise be held here.
   */
  private tagOf(identity: string): string {
    if (identity.length > MAX_KEY_INPUT) return identityTag(identity)
    let tag = this.tags.get(identity)
    if (tag === undefined) {
      if (this.tags.size >= 10_000) this.tags.clear()
      tag = identityTag(identity)
      this.tags.set(identity, tag)
    }
    return tag
  }

  /** Gives back what a successful request consumed under a count-only-failures policy. */
  async refund(refund: Refund): Promise<void> {
    const { policy } = refund
    const fourth =
      policy.algorithm === 'fixed-window' || policy.algorithm === 'sliding-counter' ? refund.tag : 0
    const argv = ['r', refund.nonce, policy.args[0], policy.args[1], refund.cost, fourth]
    await runScript(this.redis, policy.script, [refund.key], argv)
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`Redis did not answer within ${ms} ms`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}
