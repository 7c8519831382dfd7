import type { Keyspace } from './memory-keyspace.ts'
import type { ScriptCall, ScriptReply } from './protocol.ts'

/**
 * The algorithms of the memory store that can delay a request instead of rejecting it, each
 * following the general path of its script: src/lua/rate-limit-token-bucket.lua, rate-limit-gcra.lua.
 * `overLimit[i]` is set for each policy that rejected the request itself (its block starts then).
 */

/**
 * A policy that can never pass, or not within its max delay, rejects the request; otherwise the
 * request waits for the policy that needs the longest wait.
 */
function admitOrReject(
  reply: ScriptReply,
  overLimit: boolean[],
  index: number,
  rejects: boolean,
  wait: number,
) {
  if (rejects) {
    reply.allowed = false
    overLimit[index] = true
  } else if (wait > reply.delayMs) reply.delayMs = wait
}

export function tokenBucket(
  store: Keyspace,
  call: ScriptCall,
  now: number,
  overLimit: boolean[],
): ScriptReply {
  const { operation } = call
  const reply: ScriptReply = { allowed: true, delayMs: 0, policies: [], reportsBans: false }
  const states: Array<{ tokens: number; after: number; wait: number }> = []
  call.policies.forEach(({ key, quota, cost, maxDelayMs }, i) => {
    const capacity = quota.limit
    const perMs = quota.refillPerSecond / 1000
    const entry = store.read(key, 'token-bucket', now)
    // A missing key is a full bucket.
    let tokens = capacity
    if (entry) {
      tokens = Math.min(capacity, entry.tokens + Math.max(0, now - entry.refilledAt) * perMs)
      // A bucket left without a TTL would never expire: repaired (a consume sets it anyway).
      if (operation !== 'consume' && entry.expiresAt === Number.POSITIVE_INFINITY)
        entry.expiresAt = now + Math.max(1, Math.ceil((capacity - tokens) / perMs))
    }
    if (operation === 'refund') {
      tokens = Math.min(capacity, tokens + cost)
      if (tokens < capacity) {
        const refunded = entry ?? store.create(key, 'token-bucket', now)
        refunded.tokens = tokens
        refunded.refilledAt = now
        refunded.expiresAt = now + Math.ceil((capacity - tokens) / perMs)
      } else store.delete([key])
      return
    }
    const after = tokens - cost
    const wait = after < 0 ? Math.ceil(-after / perMs) : 0
    states[i] = { tokens, after, wait }
    admitOrReject(reply, overLimit, i, cost > capacity || wait > maxDelayMs, wait)
  })
  if (operation === 'refund') return reply
  if (!reply.allowed) reply.delayMs = 0
  call.policies.forEach(({ key, quota, cost }, i) => {
    const capacity = quota.limit
    const perMs = quota.refillPerSecond / 1000
    const { tokens, after, wait } = states[i]!
    let left = after
    let retry = 0
    if (reply.allowed && operation === 'consume') {
      const entry = store.read(key, 'token-bucket', now) ?? store.create(key, 'token-bucket', now)
      entry.tokens = after
      entry.refilledAt = now
      entry.expiresAt = now + Math.max(1, Math.ceil((capacity - after) / perMs))
    } else {
      left = tokens
      if (operation === 'consume' && tokens < capacity) {
        const entry = store.read(key, 'token-bucket', now)
        if (entry && entry.expiresAt === Number.POSITIVE_INFINITY)
          entry.expiresAt = now + Math.max(1, Math.ceil((capacity - tokens) / perMs))
      }
    }
    if (!reply.allowed) {
      if (after < 0) retry = wait
      if (cost > capacity) retry = Math.ceil((capacity - tokens) / perMs) + 1
    }
    reply.policies.push({
      remaining: Math.max(0, Math.floor(left)),
      resetMs: Math.ceil((capacity - left) / perMs),
      retryMs: retry,
      refundWindow: 0,
      ban: 'none',
    })
  })
  return reply
}

export function gcra(store: Keyspace, call: ScriptCall, now: number, overLimit: boolean[]): ScriptReply {
  const { operation } = call
  const reply: ScriptReply = { allowed: true, delayMs: 0, policies: [], reportsBans: false }
  const states: Array<{ arrival: number; nextArrival: number; wait: number; interval: number }> = []
  call.policies.forEach(({ key, quota, cost, maxDelayMs }, i) => {
    const { limit, windowMs: period } = quota
    // Each unit of cost moves the theoretical arrival time on by one interval.
    const interval = period / limit
    const entry = store.read(key, 'gcra', now)
    const stored = entry?.arrivalTime
    const arrival = Math.max(stored ?? now, now)
    if (operation === 'refund') {
      if (stored !== undefined && stored > now) {
        const back = Math.max(now, stored - cost * interval)
        entry!.arrivalTime = back
        entry!.expiresAt = now + Math.max(1, Math.ceil(back - now))
      }
      return
    }
    const nextArrival = arrival + cost * interval
    // The microsecond slack absorbs float rounding of period / limit, so exactly `limit` fit.
    const wait = Math.max(0, Math.ceil(nextArrival - now - period - 0.001))
    states[i] = { arrival, nextArrival, wait, interval }
    admitOrReject(reply, overLimit, i, cost > limit || wait > maxDelayMs, wait)
  })
  if (operation === 'refund') return reply
  if (!reply.allowed) reply.delayMs = 0
  call.policies.forEach(({ key, quota, cost }, i) => {
    const { limit, windowMs: period } = quota
    const { nextArrival, wait, interval } = states[i]!
    let { arrival } = states[i]!
    let retry = 0
    if (!reply.allowed || operation !== 'consume') {
      // An arrival time left without a TTL would never expire: repaired (a consume rewrites it).
      const entry = store.read(key, 'gcra', now)
      if (entry && entry.expiresAt === Number.POSITIVE_INFINITY)
        entry.expiresAt = now + Math.max(1, Math.ceil(arrival - now))
    }
    if (reply.allowed && operation === 'consume') {
      arrival = nextArrival
      const entry = store.read(key, 'gcra', now) ?? store.create(key, 'gcra', now)
      entry.arrivalTime = nextArrival
      entry.expiresAt = now + Math.max(1, Math.ceil(nextArrival - now))
    } else if (!reply.allowed && wait > 0) retry = wait
    if (cost > limit) retry = Math.max(1, Math.ceil(arrival - now))
    reply.policies.push({
      remaining: Math.max(0, Math.floor((period - (arrival - now)) / interval + 0.000001)),
      resetMs: Math.ceil(arrival - now),
      retryMs: retry,
      refundWindow: 0,
      ban: 'none',
    })
  })
  return reply
}
