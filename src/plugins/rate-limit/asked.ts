import type { FastifyRequest } from 'fastify'
import type { PrincipalFunction } from '../common/principal.ts'
import { RateLimitArgumentError, RateLimitError } from './errors.ts'
import type { OverrideBook } from './overrides.ts'
import { checkDynamic, resolve, shown } from './policy.ts'
import type { Policy, Resolved } from './types.ts'

/**
 * What a request asks of each policy that applies to it: whose quota (the identity), how many
 * units, and for a per-request limit or window the quota resolved. Every function a policy has
 * (allowList, key, cost, limit, windowMs) runs here, and what it returns is checked here.
 */
export interface Asked {
  policy: Policy
  identity: string
  /** Whole units, at most limit + 1 (it can never pass; small, exact numbers for every script). */
  cost: number
  /** Per-request limit and window; undefined for a static policy. */
  resolved: Resolved | undefined
}

/** What a policy's functions returned for a request, before it is checked. */
interface Returned {
  policy: Policy
  identity: unknown
  cost: unknown
  limit: unknown
  windowMs: unknown
}

/**
 * The applicable policies of a request, in order; async key and limit functions awaited together.
 * Answered at once, without a promise, when none of them returned one.
 */
export function askPolicies(
  request: FastifyRequest,
  policies: readonly Policy[],
  principal: PrincipalFunction,
  overrides: Pick<OverrideBook, 'limitOf'> | null,
): Asked[] | Promise<Asked[]> {
  const returned: Returned[] = []
  const pending: Array<Promise<void>> = []
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
      item.identity = policy.key(request, principal)
      if (item.identity === null || item.identity === undefined) continue
      item.cost = typeof policy.cost === 'number' ? policy.cost : policy.cost(request)
      if (policy.dynamic) {
        item.limit = policy.limitFn ? policy.limitFn(request) : policy.limit
        item.windowMs = policy.windowFn ? policy.windowFn(request) : policy.windowMs
      }
    } catch (err) {
      throw functionThrew(policy, err)
    }
    // Named fields, not a loop over their names: a keyed read here cost more than the rest of the check.
    if (isThenable(item.identity)) pending.push(settled(item, 'identity'))
    if (isThenable(item.limit)) pending.push(settled(item, 'limit'))
    returned.push(item)
  }
  return pending.length
    ? Promise.all(pending).then(() => checkAsked(returned, overrides))
    : checkAsked(returned, overrides)
}

/** Waits for an async key or limit function's answer and puts it in place of its promise. */
function settled(item: Returned, field: 'identity' | 'limit'): Promise<void> {
  return Promise.resolve(item[field]).then(
    (value) => {
      item[field] = value
    },
    (err) => {
      throw functionThrew(item.policy, err)
    },
  )
}

/** What the policies' functions returned, checked, with overrides applied. */
function checkAsked(returned: Returned[], overrides: Pick<OverrideBook, 'limitOf'> | null): Asked[] {
  const asked: Asked[] = []
  for (const item of returned) {
    const { policy, identity, cost } = item
    if (identity === null || identity === undefined) continue
    if (typeof identity !== 'string')
      throw new RateLimitError([policy.name], `its key function returned ${shown(identity)}, not a string`)
    // An override of this identity's limit replaces the policy's (its limit function's too).
    const override = overrides?.limitOf(policy.name, identity)
    const resolved = policy.dynamic
      ? checkDynamic(policy, override ?? item.limit, item.windowMs)
      : override !== undefined
        ? resolve(policy, override, policy.windowMs, 1)
        : undefined
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
    asked.push({ policy, identity, cost: capCost(policy, cost as number, resolved), resolved })
  }
  return asked
}

/** A cost over the limit can never pass; limit + 1 says so to every script with small, exact numbers. */
export function capCost(policy: Policy, cost: number, resolved: Resolved | undefined): number {
  const limit = resolved ? resolved.quota.limit : policy.limit
  return cost > limit ? limit + 1 : cost
}

/** `resolved` (a per-request quota, or none) with an override's limit in place of the policy's. */
export function overridden(
  policy: Policy,
  limit: number | undefined,
  resolved: Resolved | undefined,
): Resolved | undefined {
  if (limit === undefined) return resolved
  const checked = checkDynamic(policy, limit, resolved ? resolved.quota.windowMs : policy.windowMs)
  if (typeof checked === 'string') throw new RateLimitError([policy.name], checked)
  return checked
}

/** Resolves a policy's per-request limit and window for a programmatic call (needs the request). */
export async function resolveFor(
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
    resolved = checkDynamic(policy, limit, windowMs)
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

function functionThrew(policy: Policy, err: unknown): RateLimitError {
  return new RateLimitError(
    [policy.name],
    `its allowList, key, cost, limit or windowMs function threw: ${err instanceof Error ? err.message : shown(err)}`,
    err,
  )
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | null)?.then === 'function'
}
