import { randomBytes } from 'node:crypto'
import type { Asked } from './asked.ts'
import type { IdentityTags } from './keys.ts'
import { localShareOf, resolve } from './policy.ts'
import type { Operation, PolicyCall, Quota, ScriptCall } from './protocol.ts'
import type { Policy, Resolved } from './types.ts'

/**
 * The policies of one request that share a script and a key identity: one script call decides
 * them together, all or nothing (their keys share a hash tag, so one Redis Cluster slot).
 */
export interface Group {
  /** The script and the identity's tag: one group per script call. */
  id: string
  tag: string
  /** The identity every policy of the group keys on. */
  identity: string
  policies: Policy[]
  costs: number[]
  /** Each policy's counter key. */
  keys: string[]
  /** Per-request limits and windows, by policy index; null when every policy is static. */
  resolved: Array<Resolved | undefined> | null
}

/** Where a policy's keys live, given the identity's tag. */
export interface KeyNames {
  /** The key every other key of the policy starts with. */
  keyOf(tag: string, policy: Policy): string
  /** The counter key: a per-request window is part of it (one counter per window length). */
  counterKey(tag: string, policy: Policy, resolved: Resolved | undefined): string
}

/**
 * The script and the identity's tag. A buffered policy leases its own quota, and a shadow policy
 * must not refuse another's request: each is decided alone, never in another policy's call.
 */
function groupId(policy: Policy, tag: string): string {
  const alone = policy.sync !== null || policy.shadow !== null
  return alone ? `${policy.script}${tag}:${policy.name}` : `${policy.script}${tag}`
}

/** The group of a request's only policy: what `addToGroup` builds, without a map to find it in. */
export function groupOfOne(asked: Asked, tag: string, names: KeyNames): Group {
  const { policy, resolved } = asked
  const keys = [names.counterKey(tag, policy, resolved)]
  const id = groupId(policy, tag)
  return {
    id,
    tag,
    identity: asked.identity,
    policies: [policy],
    costs: [asked.cost],
    keys,
    resolved: resolved ? [resolved] : null,
  }
}

/** Identities longer than this are grouped anew on each request, like their tags (IdentityTags). */
const MAX_KEPT_IDENTITY = 512
/** Groups kept at most, over all policies; past it they are all dropped and built again as asked. */
const MAX_KEPT_GROUPS = 10_000

/**
 * The groups of one static policy (no per-request limit or window, no override), kept per policy
 * and identity: a request decided from a lease then builds no key string and hashes none it has
 * not hashed before. A group is never changed once built, so one object serves every request.
 */
export class GroupsOfOne {
  private readonly kept = new Map<Policy, Map<string, Group>>()
  private size = 0

  of(asked: Asked, tags: IdentityTags, names: KeyNames): Group {
    const { policy, identity } = asked
    if (asked.resolved !== undefined || identity.length > MAX_KEPT_IDENTITY)
      return groupOfOne(asked, tags.of(identity), names)
    let byIdentity = this.kept.get(policy)
    const found = byIdentity?.get(identity)
    // A cost function may ask another cost on the next request: that group is built for this one only.
    if (found) return found.costs[0] === asked.cost ? found : groupOfOne(asked, found.tag, names)
    if (this.size >= MAX_KEPT_GROUPS) {
      this.kept.clear()
      this.size = 0
      byIdentity = undefined
    }
    if (!byIdentity) {
      byIdentity = new Map()
      this.kept.set(policy, byIdentity)
    }
    const group = groupOfOne(asked, tags.of(identity), names)
    byIdentity.set(identity, group)
    this.size++
    return group
  }
}

export function addToGroup(groups: Map<string, Group>, asked: Asked, tag: string, names: KeyNames): void {
  const { policy, resolved } = asked
  const id = groupId(policy, tag)
  let group = groups.get(id)
  if (!group) {
    group = { id, tag, identity: asked.identity, policies: [], costs: [], keys: [], resolved: null }
    groups.set(id, group)
  }
  if (resolved) {
    group.resolved ??= []
    group.resolved[group.policies.length] = resolved
  }
  group.policies.push(policy)
  group.costs.push(asked.cost)
  group.keys.push(names.counterKey(tag, policy, resolved))
}

/**
 * Sliding-log members are `<nonce><sequence>:<n>`. Both are per process (per copy of this module),
 * not per engine: two plugin instances sharing a key space must never write the same member, or
 * one request's entry overwrites another's and the log undercounts.
 */
const PROCESS_NONCE = randomBytes(6).toString('base64url')
let sequence = 0

/** Only the sliding log and concurrency store members; the other scripts ignore the nonce. */
export function nonceFor(group: Group): string {
  const { algorithm } = group.policies[0]!
  return algorithm === 'sliding-log' || algorithm === 'concurrency'
    ? `${PROCESS_NONCE}${(++sequence).toString(36)}`
    : ''
}

/** The quota of the group's policy at `index`. */
export function quotaOf(group: Group, index: number): Quota {
  return group.resolved?.[index]?.quota ?? group.policies[index]!.quota
}

/** The header and quota of this process's share of the group's policy at `index`, for the 'local' fallback. */
export function localResolvedOf(group: Group, index: number, instances: number): Resolved {
  const policy = group.policies[index]!
  const quota = quotaOf(group, index)
  return resolve(policy, quota.limit, quota.windowMs, localShareOf(policy, instances))
}

/**
 * The script call for the group's policies (`only`: those indexes, for the local fallback, with
 * this process's share of each quota among `instances`), their blocks and the fixed window's penalties.
 */
export function callOf(
  group: Group,
  operation: Extract<Operation, 'consume' | 'peek'>,
  nonce: string,
  names: KeyNames,
  only: number[] | null = null,
  instances = 1,
): ScriptCall {
  const call: ScriptCall = { operation, nonce, policies: [], blocks: [], penalties: [] }
  const indexes = only ?? group.policies.map((_, i) => i)
  indexes.forEach((index, position) => {
    const policy = group.policies[index]!
    const counter = group.keys[index]!
    const policyCall: PolicyCall = {
      key: counter,
      quota: only ? localResolvedOf(group, index, instances).quota : quotaOf(group, index),
      cost: group.costs[index]!,
      maxDelayMs: policy.maxDelayMs,
      refundWindow: 0,
    }
    call.policies.push(policyCall)
    if (policy.blockMs > 0)
      call.blocks.push({
        policy: position,
        key: `${names.keyOf(group.tag, policy)}:block`,
        blockMs: policy.blockMs,
      })
    if (policy.penalised)
      call.penalties.push({
        policy: position,
        // The rejections of the counter's window.
        key: `${counter}:rejections`,
        banAfter: policy.banAfter,
        exponentialBackoff: policy.exponentialBackoff,
        continueExceeding: policy.continueExceeding,
      })
  })
  return call
}
