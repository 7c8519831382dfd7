import { randomBytes } from 'node:crypto'
import type { FastifyBaseLogger, FastifyRequest } from 'fastify'
import { runScript } from '../../lua/index.ts'
import type { PrincipalFunction } from '../common/principal.ts'
import { commandTimeoutOf, type RedisClient } from '../common/redis.ts'
import { withTimeout } from '../common/timeout.ts'
import { RateLimitArgumentError, RateLimitError } from './errors.ts'
import { identityTag, MAX_KEY_INPUT } from './keys.ts'
import { MemoryStore } from './memory.ts'
import type { RateLimitMetrics } from './metrics.ts'
import { checkDynamic, type Policy, type Resolved, resolve, shown } from './policy.ts'

export interface Decision {
  policy: Policy
  allowed: boolean
  /** Null when nothing true can be said (Redis down, policy open). */
  remaining: number | null
  resetMs: number
  retryMs: number
  /** The limit applied to this request (per-request limits; the local share when decided locally). */
  limit: number
  /** The RateLimit-Policy item actually enforced (a local limiter advertises its share). */
  header: string
  /** The policy's `ban` applies: the key is rejected with 403 until its window ends. */
  isBanned: boolean
}

/** What undoes a consume for a count-only-failures policy when the response is a success. */
export interface Refund {
  policy: Policy
  key: string
  cost: number
  tag: number
  nonce: string
  args: readonly [number, number]
}

export interface Outcome {
  decisions: Decision[]
  /** The first violated policy, when the request is rejected. */
  rejected: Decision | null
  /** A closed policy could not be checked: answer 503. */
  unavailable: Policy | null
  delayMs: number
  refunds: Refund[]
  /** Decided without Redis (by the policies' onRedisError). */
  degraded: boolean
  /** The rejected decision's key (its identity) when this request began its ban: onBanReach is due. */
  banReached: string | null
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

interface Group {
  id: string
  tag: string
  policies: Policy[]
  costs: number[]
  keys: string[]
  /** Per-request limits and windows, by policy index; null when every policy is static. */
  resolved: Array<Resolved | undefined> | null
  /** Some policy has blockMs: its block key goes with the call. */
  blocks: boolean
  /** Some fixed-window policy has ban, exponentialBackoff or continueExceeding: its rejections key goes too. */
  penalties: boolean
  /** The identity every policy of the group keys on. */
  identity: string
}

const cacheKey = (group: Group) => group.id + group.policies.map((p) => p.name).join(',')

export interface EngineOptions {
  keyPrefix: string
  overLimitCacheKeys: number
  retryRedisAfterMs: number
  timeoutMs: number
  log: FastifyBaseLogger
  /** `store: 'memory'`: every decision in this process, with at most this many keys. */
  memoryMaxKeys?: number
}

/** Decisions taken without Redis are logged at most this often per engine (each one is counted). */
const UNAVAILABLE_LOG_INTERVAL_MS = 10_000

/** Keys of the in-process limiter that stands in while Redis is down. */
const FALLBACK_MAX_KEYS = 10_000

/**
 * Sliding-log members are `<nonce><sequence>:<n>`. Both are per process (per copy of this module),
 * not per engine: two plugin instances sharing a key space must never write the same member, or
 * one request's entry overwrites another's and the log undercounts.
 */
const PROCESS_NONCE = randomBytes(6).toString('base64url')
let sequence = 0

/**
 * In-process stores are per process for one key space (kind and key prefix): two plugin instances
 * sharing a key prefix share one Redis counter, so they share the in-process one too (the memory
 * store, and the local fallback's share). Released when the last engine using one closes.
 */
const sharedStores = new Map<string, { store: MemoryStore; users: number }>()

function acquireStore(id: string, maxKeys: number): MemoryStore {
  let shared = sharedStores.get(id)
  if (!shared) {
    shared = { store: new MemoryStore(maxKeys), users: 0 }
    sharedStores.set(id, shared)
  }
  shared.users++
  shared.store.maxKeys = Math.max(shared.store.maxKeys, maxKeys)
  return shared.store
}

/** The memory store of a key prefix while an engine uses it (tests look into it as into Redis). */
export function memoryStoreOf(keyPrefix: string): MemoryStore | undefined {
  return sharedStores.get(`memory\0${keyPrefix}`)?.store
}

function releaseStore(id: string): void {
  const shared = sharedStores.get(id)
  if (shared && --shared.users === 0) {
    shared.store.close()
    sharedStores.delete(id)
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
function redisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error) || err.name !== 'ReplyError') return true
  const space = err.message.indexOf(' ')
  return UNAVAILABLE_REPLIES.has(space < 0 ? err.message : err.message.slice(0, space))
}

type Arg = string | number

/** Decides requests against policies: one script call per key identity, with fallbacks. */
export class RateLimitEngine {
  private readonly redis: RedisClient | null
  private readonly options: EngineOptions
  /** `store: 'memory'`: the store every decision is made in. */
  private readonly memory: MemoryStore | null
  private readonly memoryId: string
  /** The local fallback (onRedisError 'local'), acquired on first use. */
  private fallback: MemoryStore | null = null
  private readonly fallbackId: string
  /** Groups already over their limit, answered without Redis until their retry time. */
  private readonly overLimit = new Map<string, { until: number; cost: number; decision: Decision }>()
  private readonly ownTimeout: boolean
  private redisDownUntil = 0
  private readonly tags = new Map<string, string>()
  private lastUnavailableLog = 0
  /** Policies whose script call Redis refused, logged once each (every later refusal is counted). */
  private readonly scriptErrorsLogged = new Set<string>()
  /** Replaced once the app is ready: the metrics plugin's registry and the resolved principal. */
  metrics: RateLimitMetrics
  principal: PrincipalFunction = () => null

  constructor(redis: RedisClient | null, options: EngineOptions, metrics: RateLimitMetrics) {
    this.redis = redis
    this.options = options
    this.metrics = metrics
    this.memoryId = `memory\0${options.keyPrefix}`
    this.fallbackId = `local\0${options.keyPrefix}`
    this.memory = redis ? null : acquireStore(this.memoryId, options.memoryMaxKeys ?? FALLBACK_MAX_KEYS)
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

  /** The counter key: a per-request window is part of it (one counter per window length). */
  private counterKey(tag: string, policy: Policy, resolved: Resolved | undefined): string {
    const key = this.keyOf(tag, policy)
    return policy.windowFn ? `${key}:${resolved!.windowMs}` : key
  }

  /** Consumes ('c') or only checks ('p') every applicable policy; null when none applies. */
  async evaluate(
    request: FastifyRequest,
    policies: readonly Policy[],
    op: 'c' | 'p',
  ): Promise<Outcome | null> {
    // Every policy's key, cost, limit and window first; async key and limit functions of all the
    // policies are awaited together, then the script calls are made.
    const asked: Array<{
      policy: Policy
      identity: unknown
      cost: unknown
      limit: unknown
      windowMs: unknown
    }> = []
    let pending: Array<Promise<void>> | null = null
    for (const policy of policies) {
      const item = {
        policy,
        identity: undefined as unknown,
        cost: 1 as unknown,
        limit: 0 as unknown,
        windowMs: 0 as unknown,
      }
      try {
        if (policy.allow?.(request)) continue
        item.identity = policy.key(request, this.principal)
        if (item.identity === null || item.identity === undefined) continue
        item.cost = typeof policy.cost === 'number' ? policy.cost : policy.cost(request)
        if (policy.dynamic) {
          item.limit = policy.limitFn ? policy.limitFn(request) : policy.limit
          item.windowMs = policy.windowFn ? policy.windowFn(request) : policy.windowMs
        }
      } catch (err) {
        throw this.functionThrew(policy, err)
      }
      for (const field of ['identity', 'limit'] as const) {
        const value = item[field]
        if (!isThenable(value)) continue
        pending ??= []
        pending.push(
          Promise.resolve(value).then(
            (settled) => {
              item[field] = settled
            },
            (err) => {
              throw this.functionThrew(policy, err)
            },
          ),
        )
      }
      asked.push(item)
    }
    if (pending) await Promise.all(pending)
    const groups = new Map<string, Group>()
    for (const item of asked) {
      const { policy, identity } = item
      let { cost } = item
      if (identity === null || identity === undefined) continue
      if (typeof identity !== 'string')
        throw new RateLimitError([policy.name], `its key function returned ${shown(identity)}, not a string`)
      const resolved = policy.dynamic ? checkDynamic(policy, item.limit, item.windowMs, false) : undefined
      if (typeof resolved === 'string') throw new RateLimitError([policy.name], resolved)
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
      }
      // It can never pass; limit + 1 says so to every script with small, exact numbers.
      const limit = resolved ? resolved.limit : policy.limit
      if ((cost as number) > limit) cost = limit + 1
      this.addToGroup(groups, identity, policy, cost as number, resolved)
    }
    if (groups.size === 0) return null
    const outcome: Outcome = {
      decisions: [],
      rejected: null,
      unavailable: null,
      delayMs: 0,
      refunds: [],
      degraded: false,
      banReached: null,
    }
    for (const group of groups.values()) {
      await this.decideGroup(group, op, outcome)
      if (outcome.rejected || outcome.unavailable) break
    }
    return outcome
  }

  private functionThrew(policy: Policy, err: unknown): RateLimitError {
    return new RateLimitError(
      [policy.name],
      `its allowList, key, cost, limit or windowMs function threw: ${err instanceof Error ? err.message : shown(err)}`,
      err,
    )
  }

  private addToGroup(
    groups: Map<string, Group>,
    identity: string,
    policy: Policy,
    cost: number,
    resolved: Resolved | undefined,
  ): void {
    const tag = this.tagOf(identity)
    const id = `${policy.script}${tag}`
    let group = groups.get(id)
    if (!group) {
      group = {
        id,
        tag,
        policies: [],
        costs: [],
        keys: [],
        resolved: null,
        blocks: false,
        penalties: false,
        identity,
      }
      groups.set(id, group)
    }
    if (policy.penalties > 0) group.penalties = true
    if (resolved) {
      group.resolved ??= []
      group.resolved[group.policies.length] = resolved
    }
    if (policy.blockMs > 0) group.blocks = true
    group.policies.push(policy)
    group.costs.push(cost)
    group.keys.push(this.counterKey(tag, policy, resolved))
  }

  /**
   * KEYS and ARGV of a script call for the policies of a group (`only`: those indexes, for the
   * local fallback), with block keys and their (index, ms) pairs after the policies' own.
   */
  private call(
    group: Group,
    op: string,
    nonce: string,
    local: boolean,
    only: number[] | null,
  ): { keys: readonly string[]; argv: Arg[] } {
    const argv: Arg[] = [op, nonce]
    const indexes = only ?? group.policies.map((_, i) => i)
    for (const i of indexes) {
      const p = group.policies[i]!
      const r = group.resolved?.[i]
      const args = r
        ? local
          ? resolve(p, r.limit, r.windowMs, true).args
          : r.args
        : local
          ? p.localArgs
          : p.args
      argv.push(args[0], args[1], group.costs[i]!, p.maxDelayMs)
    }
    if (!group.blocks && !group.penalties && !only) return { keys: group.keys, argv }
    const keys = indexes.map((i) => group.keys[i]!)
    indexes.forEach((i, position) => {
      const p = group.policies[i]!
      if (p.blockMs > 0) {
        keys.push(`${this.keyOf(group.tag, p)}:block`)
        argv.push(position + 1, p.blockMs)
      }
      // The rejections of the counter's window: a negative index tells it from a block.
      if (p.penalties > 0) {
        keys.push(`${group.keys[i]!}:rejections`)
        argv.push(-(position + 1), p.penalties)
      }
    })
    return { keys, argv }
  }

  /** The common case, without the general builder: static policies, no blocks. */
  private simpleArgv(group: Group, op: string, nonce: string): Arg[] {
    const argv: Arg[] = [op, nonce]
    group.policies.forEach((p, i) => {
      argv.push(p.args[0], p.args[1], group.costs[i]!, p.maxDelayMs)
    })
    return argv
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
    const algorithm = group.policies[0]!.algorithm
    // Only the sliding log stores members; the other scripts ignore the nonce slot.
    const nonce = algorithm === 'sliding-log' ? `${PROCESS_NONCE}${(++sequence).toString(36)}` : ''
    let keys: readonly string[] = group.keys
    let argv: Arg[]
    if (!group.blocks && !group.penalties && group.resolved === null) argv = this.simpleArgv(group, op, nonce)
    else ({ keys, argv } = this.call(group, op, nonce, false, null))
    if (this.memory) {
      let reply: number[]
      try {
        reply = this.memory.run(algorithm, keys, argv)
      } catch (err) {
        throw new RateLimitError(
          group.policies.map((p) => p.name),
          `the memory store refused the call: ${(err as Error).message}`,
          err,
        )
      }
      return this.apply(group, op, outcome, reply, nonce)
    }
    const redis = this.redis!
    if (redis.status !== 'ready') {
      this.noteUnavailable(`Redis connection is ${redis.status}`)
      return this.degraded(group, op, outcome)
    }
    if (Date.now() < this.redisDownUntil) {
      this.noteUnavailable('Redis failed within retryRedisAfterMs')
      return this.degraded(group, op, outcome)
    }
    let reply: number[]
    const started = performance.now()
    try {
      const call = runScript<number[]>(redis, group.policies[0]!.script, keys, argv)
      reply = await (this.ownTimeout ? answeredWithin(call, this.options.timeoutMs) : call)
    } catch (err) {
      if (!redisUnavailable(err)) {
        this.noteScriptError(group, keys, err as Error)
        return this.degraded(group, op, outcome)
      }
      this.redisDownUntil = Date.now() + this.options.retryRedisAfterMs
      this.noteUnavailable((err as Error).message, err)
      return this.degraded(group, op, outcome)
    }
    metrics.scriptSeconds(algorithm).observe((performance.now() - started) / 1000)
    this.apply(group, op, outcome, reply, nonce)
  }

  /** Turns a script reply into decisions, refunds and the over-limit cache entry. */
  private apply(group: Group, op: 'c' | 'p', outcome: Outcome, reply: number[], nonce: string): void {
    const { metrics } = this
    const allowed = reply[0] === 1
    const delayed = allowed && reply[1]! > 0
    if (delayed) outcome.delayMs = Math.max(outcome.delayMs, reply[1]!)
    // With penalties the fixed window replies each policy's ban state after its four numbers.
    const penalties = reply.length > 2 + 4 * group.policies.length ? 2 + 4 * group.policies.length : 0
    group.policies.forEach((policy, i) => {
      const at = 2 + i * 4
      const resolved = group.resolved?.[i]
      const decision: Decision = {
        policy,
        allowed,
        remaining: reply[at]!,
        resetMs: reply[at + 1]!,
        retryMs: reply[at + 2]!,
        limit: resolved ? resolved.limit : policy.limit,
        header: resolved ? resolved.header : policy.header,
        isBanned: penalties ? reply[penalties + i]! > 0 : false,
      }
      outcome.decisions.push(decision)
      if (!allowed && decision.retryMs > 0 && !outcome.rejected) {
        outcome.rejected = decision
        if (penalties && reply[penalties + i] === 2) outcome.banReached = group.identity
      }
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
          args: resolved ? resolved.args : policy.args,
        })
      }
    })
    // Every policy rejected only as a sibling of the violated one keeps its full quota.
    if (!allowed && !outcome.rejected) outcome.rejected = outcome.decisions[outcome.decisions.length - 1]!
    if (!allowed && op === 'c' && this.cacheable(group)) this.remember(group, outcome.rejected!)
  }

  /**
   * Count-only-failures and delaying policies change state outside this cache's view, and a
   * per-request limit may differ on the next request: never cached.
   */
  private cacheable(group: Group): boolean {
    return (
      this.options.overLimitCacheKeys > 0 &&
      group.resolved === null &&
      !group.penalties &&
      group.policies.every((p) => !p.isFailure && p.maxDelayMs === 0)
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

  /**
   * Redis refused a policy's script (WRONGTYPE: a key of another type where the policy keeps its
   * counter; or any other script error): no request can fix it, so it is logged once per policy,
   * with the keys and what to do, at error level; every refusal is counted in
   * rate_limit_redis_unavailable_total and by the decision's degraded outcome.
   */
  private noteScriptError(group: Group, keys: readonly string[], err: Error): void {
    this.metrics.unavailable()
    const names = group.policies.map((p) => p.name)
    if (names.every((name) => this.scriptErrorsLogged.has(name))) return
    for (const name of names) this.scriptErrorsLogged.add(name)
    const modes = group.policies.map((p) => `'${p.name}': ${p.onRedisError}`).join(', ')
    this.options.log.error(
      { err, policy: names.join(', '), keys },
      `rate limit: Redis refused the script of policy '${names.join("', '")}' on ${keys.join(', ')} (${err.message}); until fixed it is decided by its onRedisError (${modes}). ` +
        `A key of another type under the key prefix '${this.options.keyPrefix}' means something else writes there: give this plugin a keyPrefix of its own, or delete those keys (they expire with their TTL)`,
    )
  }

  private degraded(group: Group, op: 'c' | 'p', outcome: Outcome): void {
    const { metrics } = this
    outcome.degraded = true
    const closed = group.policies.find((p) => p.onRedisError === 'closed')
    if (closed) {
      outcome.unavailable = closed
      for (const p of group.policies) metrics.decision(p.name, 'degraded_closed')
      return
    }
    const local: number[] = []
    group.policies.forEach((p, i) => {
      if (p.onRedisError === 'local') local.push(i)
    })
    let reply: number[] | null = null
    if (local.length > 0) {
      this.fallback ??= acquireStore(this.fallbackId, FALLBACK_MAX_KEYS)
      const algorithm = group.policies[0]!.algorithm
      const nonce = algorithm === 'sliding-log' ? `${PROCESS_NONCE}${(++sequence).toString(36)}` : ''
      const { keys, argv } = this.call(group, op, nonce, true, local)
      try {
        reply = this.fallback.run(algorithm, keys, argv)
      } catch (err) {
        throw new RateLimitError(
          local.map((i) => group.policies[i]!.name),
          `the local limiter refused the call: ${(err as Error).message}`,
          err,
        )
      }
    }
    const allowed = reply === null || reply[0] === 1
    if (allowed && reply && reply[1]! > 0) outcome.delayMs = Math.max(outcome.delayMs, reply[1]!)
    const penalties = reply && reply.length > 2 + 4 * local.length ? 2 + 4 * local.length : 0
    group.policies.forEach((policy, i) => {
      const position = local.indexOf(i)
      if (position < 0) {
        // Open: nothing is known about the quota, so only the policy itself is advertised.
        const resolved = group.resolved?.[i]
        outcome.decisions.push({
          policy,
          allowed: true,
          remaining: null,
          resetMs: 0,
          retryMs: 0,
          limit: resolved ? resolved.limit : policy.limit,
          header: resolved ? resolved.header : policy.header,
          isBanned: false,
        })
        if (op === 'c') metrics.decision(policy.name, 'degraded_open')
        return
      }
      const at = 2 + position * 4
      const r = group.resolved?.[i]
      const shared = r ? resolve(policy, r.limit, r.windowMs, true) : null
      const decision: Decision = {
        policy,
        allowed,
        remaining: reply![at]!,
        resetMs: reply![at + 1]!,
        retryMs: reply![at + 2]!,
        limit: shared ? shared.limit : policy.localArgs[0],
        header: shared ? shared.header : policy.localHeader,
        isBanned: penalties ? reply![penalties + position]! > 0 : false,
      }
      outcome.decisions.push(decision)
      if (!allowed && decision.retryMs > 0 && !outcome.rejected) {
        outcome.rejected = decision
        if (penalties && reply![penalties + position] === 2) outcome.banReached = group.identity
      }
      if (op === 'c')
        metrics.decision(policy.name, allowed ? 'degraded_local_allowed' : 'degraded_local_rejected')
    })
    if (!allowed && !outcome.rejected) outcome.rejected = outcome.decisions[outcome.decisions.length - 1]!
  }

  /** Lets go of the in-process stores this engine used (the app is closing). */
  close(): void {
    if (this.memory) releaseStore(this.memoryId)
    if (this.fallback) releaseStore(this.fallbackId)
    this.fallback = null
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
    const argv = ['r', refund.nonce, refund.args[0], refund.args[1], refund.cost, fourth]
    if (this.memory) {
      this.memory.run(policy.algorithm, [refund.key], argv)
      return
    }
    await runScript(this.redis!, policy.script, [refund.key], argv)
  }

  /** Resolves a policy's per-request limit and window for a programmatic call (needs the request). */
  private async resolveFor(
    policy: Policy,
    request: FastifyRequest | undefined,
    caller: string,
  ): Promise<Resolved | undefined> {
    if (!policy.dynamic) return undefined
    if (!request)
      throw new RateLimitArgumentError(
        `rate-limit plugin: ${caller}: policy '${policy.name}' has a per-request \`limit\` or \`windowMs\`: pass the request`,
      )
    let resolved: Resolved | string
    try {
      const limit = policy.limitFn ? await policy.limitFn(request) : policy.limit
      const windowMs = policy.windowFn ? policy.windowFn(request) : policy.windowMs
      resolved = checkDynamic(policy, limit, windowMs, false)
    } catch (err) {
      throw new RateLimitError(
        [policy.name],
        `its limit or windowMs function threw: ${(err as Error)?.message}`,
        err,
      )
    }
    if (typeof resolved === 'string') throw new RateLimitError([policy.name], resolved)
    return resolved
  }

  /** `app.rateLimiter.consume`: one policy, one identity, the same keys a route uses. */
  async consume(
    policy: Policy,
    identity: string,
    cost: number,
    request: FastifyRequest | undefined,
  ): Promise<RateLimitResult> {
    const resolved = await this.resolveFor(policy, request, 'consume()')
    const limit = resolved ? resolved.limit : policy.limit
    const groups = new Map<string, Group>()
    this.addToGroup(groups, identity, policy, cost > limit ? limit + 1 : cost, resolved)
    const group = groups.values().next().value!
    const outcome: Outcome = {
      decisions: [],
      rejected: null,
      unavailable: null,
      delayMs: 0,
      refunds: [],
      degraded: false,
      banReached: null,
    }
    // Cost 0 asks without consuming: a peek.
    await this.decideGroup(group, cost === 0 ? 'p' : 'c', outcome)
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
    const d = outcome.decisions[0]!
    return {
      allowed: d.allowed,
      remaining: d.remaining,
      retryAfterMs: d.allowed ? 0 : Math.max(1, d.retryMs),
      limit: d.limit,
      resetMs: d.resetMs,
      delayMs: outcome.delayMs,
      degraded: outcome.degraded,
      banned: d.isBanned,
      banReached: outcome.banReached !== null,
    }
  }

  /** `app.rateLimiter.reset`: deletes the key's counter and block (and what this process remembers of them). */
  async reset(policy: Policy, identity: string, request: FastifyRequest | undefined): Promise<void> {
    const resolved = await this.resolveFor(policy, request, 'reset()')
    const tag = this.tagOf(identity)
    const keys = [this.counterKey(tag, policy, resolved)]
    if (policy.penalties > 0) keys.push(`${keys[0]}:rejections`)
    if (policy.blockMs > 0) keys.push(`${this.keyOf(tag, policy)}:block`)
    const prefix = `${policy.script}${tag}`
    for (const id of this.overLimit.keys()) if (id.startsWith(prefix)) this.overLimit.delete(id)
    this.fallback?.delete(keys)
    if (this.memory) return this.memory.delete(keys)
    const call = this.redis!.del(...keys)
    await (this.ownTimeout ? answeredWithin(call, this.options.timeoutMs) : call)
  }

  /** `app.rateLimiter.block`: rejects the key under this policy for `ms` from now. */
  async block(policy: Policy, identity: string, ms: number): Promise<void> {
    const key = `${this.keyOf(this.tagOf(identity), policy)}:block`
    if (this.memory) return this.memory.block(key, ms)
    const call = this.redis!.set(key, '1', 'PX', ms)
    await (this.ownTimeout ? answeredWithin(call, this.options.timeoutMs) : call)
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | null)?.then === 'function'
}

/** A script call bounded by the plugin's `timeoutMs`, for a client without a commandTimeout of its own. */
const answeredWithin = <T>(call: Promise<T>, ms: number) =>
  withTimeout(call, ms, () => {
    throw new Error(`Redis did not answer within ${ms} ms`)
  })
