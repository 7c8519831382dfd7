import assert from 'node:assert/strict'
import { test } from 'node:test'
import type { Asked } from '../../src/plugins/rate-limit/asked.ts'
import { GroupsOfOne, type KeyNames } from '../../src/plugins/rate-limit/groups.ts'
import { IdentityTags } from '../../src/plugins/rate-limit/keys.ts'
import { normalizePolicy } from '../../src/plugins/rate-limit/policy.ts'
import type { Policy } from '../../src/plugins/rate-limit/types.ts'

// A request under one static policy reuses its identity's group (its key strings built once).
// What must never be reused: a group built for another cost or for a per-request quota.

const names: KeyNames = {
  keyOf: (tag, policy) => `rl:{${tag}}:${policy.name}`,
  counterKey: (tag, policy, resolved) =>
    resolved ? `rl:{${tag}}:${policy.name}:${resolved.quota.windowMs}` : `rl:{${tag}}:${policy.name}`,
}
const ip = normalizePolicy({ name: 'ip', algorithm: 'fixed-window', limit: 10, windowMs: 1000 })
const asked = (policy: Policy, identity: string, cost = 1, resolved?: Asked['resolved']): Asked => ({
  policy,
  identity,
  cost,
  resolved,
})

test('the same policy and identity get the same group; another identity or policy its own', () => {
  const groups = new GroupsOfOne()
  const tags = new IdentityTags()
  const first = groups.of(asked(ip, 'ip:192.0.2.1'), tags, names)
  assert.equal(groups.of(asked(ip, 'ip:192.0.2.1'), tags, names), first)
  assert.deepEqual(first.keys, [`rl:{${tags.of('ip:192.0.2.1')}}:ip`])
  assert.deepEqual(first.costs, [1])
  const other = groups.of(asked(ip, 'ip:192.0.2.2'), tags, names)
  assert.notEqual(other, first)
  assert.deepEqual(other.keys, [`rl:{${tags.of('ip:192.0.2.2')}}:ip`])
  const login = normalizePolicy({ name: 'login', algorithm: 'fixed-window', limit: 5, windowMs: 1000 })
  const byLogin = groups.of(asked(login, 'ip:192.0.2.1'), tags, names)
  assert.deepEqual(byLogin.policies, [login])
  assert.deepEqual(byLogin.keys, [`rl:{${tags.of('ip:192.0.2.1')}}:login`])
})

test('another cost is decided in a group of its own, and the kept one is unchanged', () => {
  const groups = new GroupsOfOne()
  const tags = new IdentityTags()
  const kept = groups.of(asked(ip, 'ip:192.0.2.1', 1), tags, names)
  const costly = groups.of(asked(ip, 'ip:192.0.2.1', 3), tags, names)
  assert.notEqual(costly, kept)
  assert.deepEqual(costly.costs, [3])
  assert.deepEqual(kept.costs, [1])
  assert.equal(groups.of(asked(ip, 'ip:192.0.2.1', 1), tags, names), kept)
})

test('a per-request quota (a limit function or an override) is never kept', () => {
  const groups = new GroupsOfOne()
  const tags = new IdentityTags()
  const resolved = { quota: { limit: 2, windowMs: 5000 } } as Asked['resolved']
  const first = groups.of(asked(ip, 'ip:192.0.2.1', 1, resolved), tags, names)
  const second = groups.of(asked(ip, 'ip:192.0.2.1', 1, resolved), tags, names)
  assert.notEqual(second, first)
  assert.deepEqual(first.resolved, [resolved])
  assert.deepEqual(first.keys, [`rl:{${tags.of('ip:192.0.2.1')}}:ip:5000`])
  // The static group of the same identity is not the per-request one.
  assert.equal(groups.of(asked(ip, 'ip:192.0.2.1'), tags, names).resolved, null)
})

test('at most 10000 groups are kept: past that they are built again, with the same keys', () => {
  const groups = new GroupsOfOne()
  const tags = new IdentityTags()
  const first = groups.of(asked(ip, 'ip:10.0.0.0'), tags, names)
  for (let i = 1; i < 10_000; i++) groups.of(asked(ip, `ip:10.0.${i >> 8}.${i & 255}`), tags, names)
  assert.equal(groups.of(asked(ip, 'ip:10.0.0.0'), tags, names), first)
  groups.of(asked(ip, 'ip:10.1.0.0'), tags, names)
  const again = groups.of(asked(ip, 'ip:10.0.0.0'), tags, names)
  assert.notEqual(again, first)
  assert.deepEqual(again.keys, first.keys)
})
