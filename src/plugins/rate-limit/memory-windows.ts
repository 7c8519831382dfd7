import type { Entry, Keyspace } from './memory-keyspace.ts'
import type { BanState, PenaltyCall, PolicyReply, ScriptCall, ScriptReply } from './protocol.ts'

/**
 * The window algorithms of the memory store, each following the general path of its script:
 * src/lua/rate-limit-fixed-window.lua, rate-limit-sliding-log.lua, rate-limit-sliding-counter.lua.
 * `overLimit[i]` is set for each policy that rejected the request itself (its block starts then).
 */

/** exponentialBackoff: a window grows to at most this (or the policy's window, if longer). */
const MAX_BACKOFF_MS = 2 ** 31 - 1

const admitted = (): ScriptReply => ({ allowed: true, delayMs: 0, policies: [], reportsBans: false })

const policyReply = (
  remaining: number,
  resetMs: number,
  retryMs: number,
  refundWindow: number,
): PolicyReply => ({
  remaining,
  resetMs,
  retryMs,
  refundWindow,
  ban: 'none',
})

export function fixedWindow(
  store: Keyspace,
  call: ScriptCall,
  now: number,
  overLimit: boolean[],
): ScriptReply {
  const { operation } = call
  const penalty: Array<(PenaltyCall & { rejected: number }) | undefined> = []
  if (operation !== 'refund') {
    for (const spec of call.penalties) {
      // Rejections counted in the current window before this request.
      penalty[spec.policy] = { ...spec, rejected: store.read(spec.key, 'fixed-window', now)?.count ?? 0 }
    }
  }
  const reply = admitted()
  const entries: Array<Entry | undefined> = []
  const counts: number[] = []
  const ttls: number[] = []
  const bans: BanState[] = []
  call.policies.forEach(({ key, quota, cost, refundWindow }, i) => {
    const pen = penalty[i]
    let entry = store.read(key, 'fixed-window', now)
    let count: number
    if (operation === 'consume') {
      entry ??= store.create(key, 'fixed-window', now)
      entry.count += cost
      count = entry.count
      // A new window: the rejections of an older one are gone with it.
      if (pen && count === cost && pen.rejected > 0) {
        pen.rejected = 0
        store.delete([pen.key])
      }
    } else count = entry?.count ?? 0
    // Banned: every request is rejected until the window ends.
    bans[i] = pen && pen.banAfter >= 0 && pen.rejected > pen.banAfter && count > 0 ? 'banned' : 'none'
    if (operation === 'consume' && (count > quota.limit || bans[i] !== 'none')) {
      reply.allowed = false
      overLimit[i] = true
    }
    let ttl = quota.windowMs
    if (count === cost && operation === 'consume') entry!.expiresAt = now + quota.windowMs
    else if (count > 0) {
      ttl = entry!.expiresAt === Number.POSITIVE_INFINITY ? -1 : entry!.expiresAt - now
      // A counter without a TTL would lock its client out forever: repair it on every visit.
      if (ttl < 0) {
        entry!.expiresAt = now + quota.windowMs
        ttl = quota.windowMs
      }
    }
    if (operation === 'refund') {
      // A TTL above the one seen at the consume belongs to a newer window: nothing to give back there.
      if (count >= cost && ttl <= refundWindow) entry!.count -= cost
    } else if (operation === 'peek' && (count + cost > quota.limit || bans[i] !== 'none')) {
      reply.allowed = false
      overLimit[i] = true
    }
    entries[i] = entry
    counts[i] = count
    ttls[i] = ttl
  })
  if (operation === 'refund') return reply
  call.policies.forEach(({ quota, cost }, i) => {
    let count = counts[i]!
    let retry = 0
    if (operation === 'consume' && !reply.allowed) {
      entries[i]!.count -= cost
      count -= cost
      // A rejection this policy decided (not one of a sibling's) is counted, and penalised.
      const pen = penalty[i]
      if (pen && overLimit[i]) {
        const rejections = pen.rejected + 1
        let ttl = ttls[i]!
        if (pen.continueExceeding) ttl = quota.windowMs
        else if (pen.exponentialBackoff)
          ttl = Math.min(quota.windowMs * 2 ** (rejections - 1), Math.max(quota.windowMs, MAX_BACKOFF_MS))
        entries[i]!.expiresAt = now + ttl
        const rejectionsEntry =
          store.read(pen.key, 'fixed-window', now) ?? store.create(pen.key, 'fixed-window', now)
        rejectionsEntry.count = rejections
        rejectionsEntry.expiresAt = now + ttl
        ttls[i] = ttl
        if (pen.banAfter >= 0 && rejections > pen.banAfter)
          bans[i] = rejections === pen.banAfter + 1 ? 'began' : 'banned'
      }
    }
    const banned = bans[i] !== 'none'
    if (!reply.allowed && (count + cost > quota.limit || banned)) retry = ttls[i]!
    reply.policies.push(policyReply(banned ? 0 : Math.max(0, quota.limit - count), ttls[i]!, retry, ttls[i]!))
  })
  if (call.penalties.length > 0) {
    reply.reportsBans = true
    reply.policies.forEach((policy, i) => {
      policy.ban = bans[i]!
    })
  }
  return reply
}

export function slidingLog(
  store: Keyspace,
  call: ScriptCall,
  now: number,
  overLimit: boolean[],
): ScriptReply {
  const { operation, nonce } = call
  const reply = admitted()
  const counts: number[] = []
  call.policies.forEach(({ key, quota, cost }, i) => {
    const entry = store.read(key, 'sliding-log', now)
    if (operation === 'refund') {
      if (entry) removeNonce(store, key, entry, nonce)
      return
    }
    // ZCOUNT now - window + 1 .. +inf
    let count = 0
    if (entry) for (const time of entry.times!) if (time >= now - quota.windowMs + 1) count++
    counts[i] = count
    if (count + cost > quota.limit) {
      reply.allowed = false
      overLimit[i] = true
    }
  })
  if (operation === 'refund') return reply
  call.policies.forEach(({ key, quota, cost }, i) => {
    const { limit, windowMs: window } = quota
    let count = counts[i]!
    let retry = 0
    let entry = store.read(key, 'sliding-log', now)
    // A log left without a TTL would never expire: repaired (a consume sets it anyway).
    if ((!reply.allowed || operation !== 'consume') && entry && entry.expiresAt === Number.POSITIVE_INFINITY)
      entry.expiresAt = now + window
    if (reply.allowed && operation === 'consume') {
      if (entry) {
        // ZREMRANGEBYSCORE -inf .. now - window
        let drop = 0
        while (drop < entry.times!.length && entry.times![drop]! <= now - window) drop++
        if (drop > 0) {
          entry.times!.splice(0, drop)
          entry.nonces!.splice(0, drop)
        }
      }
      if (!entry || entry.times!.length === 0) {
        entry ??= store.create(key, 'sliding-log', now)
        entry.times = []
        entry.nonces = []
      }
      for (let unit = 0; unit < cost; unit++) insertSorted(entry.times!, entry.nonces!, now, nonce)
      // Never shortened, as the script's TTL (an expiry of Infinity is no TTL: one is set).
      if (entry.expiresAt === Number.POSITIVE_INFINITY || entry.expiresAt < now + window)
        entry.expiresAt = now + window
      count += cost
    } else if (count + cost > limit) {
      // Free once enough of the oldest entries leave: the (count + cost - limit)-th oldest in the window.
      const need = Math.min(count + cost - limit, count)
      retry = window
      if (cost <= limit && need >= 1 && entry) {
        // ZRANGEBYSCORE now - window + 1 .. +inf LIMIT need - 1 1
        let seen = 0
        for (const time of entry.times!) {
          if (time < now - window + 1) continue
          if (++seen === need) {
            retry = time + window - now
            break
          }
        }
      }
    }
    // From the oldest unit still in the window (a rejection trims nothing).
    let reset = window
    const oldest = entry?.times?.find((time) => time > now - window)
    if (oldest !== undefined) reset = Math.max(1, oldest + window - now)
    reply.policies.push(policyReply(Math.max(0, limit - count), reset, retry, 0))
  })
  return reply
}

/**
 * src/lua/rate-limit-concurrency.lua: slots scored by the end of their lease (`times`), the nonce
 * each was taken under; a refund removes a nonce's slots.
 */
export function concurrency(
  store: Keyspace,
  call: ScriptCall,
  now: number,
  overLimit: boolean[],
): ScriptReply {
  const { operation, nonce } = call
  const reply = admitted()
  const counts: number[] = []
  call.policies.forEach(({ key, quota, cost }, i) => {
    const entry = store.read(key, 'concurrency', now)
    if (operation === 'refund') {
      if (entry) removeNonce(store, key, entry, nonce)
      return
    }
    // ZCOUNT (now .. +inf: the slots whose lease has not ended
    counts[i] = entry ? entry.times!.filter((end) => end > now).length : 0
    if (counts[i]! + cost > quota.limit) {
      reply.allowed = false
      overLimit[i] = true
    }
  })
  if (operation === 'refund') return reply
  call.policies.forEach(({ key, quota, cost }, i) => {
    const { limit, windowMs: lease } = quota
    let count = counts[i]!
    let retry = 0
    let entry = store.read(key, 'concurrency', now)
    if (reply.allowed && operation === 'consume') {
      if (!entry) {
        entry = store.create(key, 'concurrency', now)
        entry.times = []
        entry.nonces = []
      }
      for (let unit = 0; unit < cost; unit++) insertSorted(entry.times!, entry.nonces!, now + lease, nonce)
      // No live slot: PEXPIRE lease; else PEXPIRE GT (never shortened; a set without a TTL keeps none).
      entry.expiresAt = count === 0 ? now + lease : Math.max(entry.expiresAt, now + lease)
      count += cost
    } else {
      if (entry && operation === 'consume') {
        // The ended slots go (the script's HDEL of them)
        let drop = 0
        while (drop < entry.times!.length && entry.times![drop]! <= now) drop++
        entry.times!.splice(0, drop)
        entry.nonces!.splice(0, drop)
        if (entry.times!.length === 0) {
          store.delete([key])
          entry = undefined
        }
      }
      if (entry && entry.expiresAt === Number.POSITIVE_INFINITY) entry.expiresAt = now + lease
      if (count + cost > limit) {
        retry = lease
        if (cost <= limit && entry) {
          // ZRANGEBYSCORE (now .. +inf LIMIT count + cost - limit - 1 1
          const ends = entry.times!.filter((end) => end > now)
          const end = ends[count + cost - limit - 1]
          if (end !== undefined) retry = end - now
        }
      }
    }
    reply.policies.push(policyReply(Math.max(0, limit - count), retry, retry, 0))
  })
  return reply
}

export function slidingCounter(
  store: Keyspace,
  call: ScriptCall,
  now: number,
  overLimit: boolean[],
): ScriptReply {
  const { operation } = call
  const reply = admitted()
  const states: Array<{
    windowIndex: number
    elapsed: number
    current: number
    previous: number
    estimate: number
    stored: boolean
  }> = []
  call.policies.forEach(({ key, quota, cost, refundWindow }, i) => {
    const { limit, windowMs: window } = quota
    const windowIndex = Math.floor(now / window)
    const elapsed = now - windowIndex * window
    const entry = store.read(key, 'sliding-counter', now)
    const storedIndex = entry ? entry.windowIndex : Number.NaN
    let current = entry ? entry.currentCount : 0
    let previous = entry ? entry.previousCount : 0
    if (Number.isNaN(storedIndex) || storedIndex < windowIndex - 1) {
      current = 0
      previous = 0
    } else if (storedIndex === windowIndex - 1) {
      previous = current
      current = 0
    }
    if (operation === 'refund') {
      if (refundWindow === windowIndex && current >= cost) entry!.currentCount -= cost
      return
    }
    // The previous window weighs by how much of it the sliding window still covers.
    const estimate = (previous * (window - elapsed)) / window + current
    states[i] = { windowIndex, elapsed, current, previous, estimate, stored: !Number.isNaN(storedIndex) }
    if (estimate + cost > limit) {
      reply.allowed = false
      overLimit[i] = true
    }
  })
  if (operation === 'refund') return reply
  call.policies.forEach(({ key, quota, cost }, i) => {
    const { limit, windowMs: window } = quota
    const { windowIndex, elapsed, current, previous, stored } = states[i]!
    let { estimate } = states[i]!
    let retry = 0
    if (stored && (!reply.allowed || operation !== 'consume')) {
      // A Hash left without a TTL would never expire: repaired (a consume sets it anyway).
      const entry = store.read(key, 'sliding-counter', now)
      if (entry && entry.expiresAt === Number.POSITIVE_INFINITY) entry.expiresAt = now + 2 * window - elapsed
    }
    if (reply.allowed) {
      if (operation === 'consume') {
        estimate += cost
        const entry = store.read(key, 'sliding-counter', now) ?? store.create(key, 'sliding-counter', now)
        entry.windowIndex = windowIndex
        entry.currentCount = current + cost
        entry.previousCount = previous
        entry.expiresAt = now + 2 * window - elapsed
      }
    } else if (estimate + cost > limit) {
      if (cost > limit) retry = 2 * window - elapsed
      // Later in this window, once the previous window's weight has dropped far enough.
      else if (current + cost <= limit)
        retry = Math.ceil(window * (1 - (limit - current - cost) / previous)) - elapsed
      // In the next window this window's count becomes the weighted previous one.
      else retry = window - elapsed + Math.max(0, Math.ceil(window * (1 - (limit - cost) / current)))
      retry = Math.max(1, retry)
    }
    reply.policies.push(
      policyReply(Math.max(0, Math.floor(limit - estimate)), window - elapsed, retry, windowIndex),
    )
  })
  return reply
}

/** ZADD of one unit: times stay ascending (a clock step back lands where Redis would sort it). */
/** ZREM of the members added under `nonce` (a sliding log's units, a concurrency policy's slots). */
function removeNonce(store: Keyspace, key: string, entry: Entry, nonce: string): void {
  for (let k = entry.nonces!.length - 1; k >= 0; k--) {
    if (entry.nonces![k] === nonce) {
      entry.nonces!.splice(k, 1)
      entry.times!.splice(k, 1)
    }
  }
  if (entry.times!.length === 0) store.delete([key])
}

function insertSorted(times: number[], nonces: string[], at: number, nonce: string): void {
  let k = times.length
  while (k > 0 && times[k - 1]! > at) k--
  if (k === times.length) {
    times.push(at)
    nonces.push(nonce)
  } else {
    times.splice(k, 0, at)
    nonces.splice(k, 0, nonce)
  }
}
