import type { Policy } from './policy.ts'

export interface Verdict {
  allowed: boolean
  remaining: number
  resetMs: number
  retryMs: number
}

interface State {
  a: number
  b: number
  c: number
  log?: number[]
}

/**
 * The in-process stand-in for one policy while Redis is unreachable: the same algorithm on this
 * process's clock with `localShare` of the limit (each of N instances gets its share, so together
 * they stay near the global limit). Keys are capped; the oldest are dropped first.
 */
export class LocalLimiter {
  readonly limit: number
  readonly header: string
  private readonly policy: Policy
  private readonly rate: number
  private readonly states = new Map<string, State>()
  private readonly maxKeys: number

  constructor(policy: Policy, maxKeys = 10_000) {
    this.policy = policy
    this.limit = Math.max(1, Math.floor(policy.limit * policy.localShare))
    this.rate = (policy.refillPerSecond * policy.localShare) / 1000
    this.header = `"${policy.name}";q=${this.limit};w=${policy.windowSec}`
    this.maxKeys = maxKeys
  }

  /** Decides for `cost` at `now`; changes state only with `commit` (so callers can be all-or-nothing). */
  decide(key: string, cost: number, now: number, commit: boolean): Verdict {
    let s = this.states.get(key)
    if (!s) {
      if (!commit) s = { a: 0, b: 0, c: 0 }
      else {
        if (this.states.size >= this.maxKeys) this.states.delete(this.states.keys().next().value!)
        s = { a: 0, b: 0, c: 0 }
        this.states.set(key, s)
      }
    }
    const { limit } = this
    const w = this.policy.windowMs
    switch (this.policy.algorithm) {
      case 'fixed-window': {
        const start = now - (now % w)
        const count = s.a === start ? s.b : 0
        const allowed = count + cost <= limit
        if (allowed && commit) Object.assign(s, { a: start, b: count + cost })
        const used = allowed ? count + cost : count
        return {
          allowed,
          remaining: limit - used,
          resetMs: start + w - now,
          retryMs: allowed ? 0 : start + w - now,
        }
      }
      case 'sliding-log': {
        const log = (s.log ?? []).filter((at) => at > now - w)
        const allowed = log.length + cost <= limit
        if (commit) s.log = allowed ? log.concat(Array(cost).fill(now)) : log
        const used = allowed ? log.length + cost : log.length
        const freeing = log[Math.max(0, log.length + cost - limit - 1)]
        return {
          allowed,
          remaining: Math.max(0, limit - used),
          resetMs: log.length ? log[0]! + w - now : w,
          retryMs: allowed ? 0 : freeing !== undefined ? freeing + w - now : w,
        }
      }
      case 'sliding-counter': {
        const idx = Math.floor(now / w)
        const [c, p] = s.a === idx ? [s.b, s.c] : s.a === idx - 1 ? [0, s.b] : [0, 0]
        const elapsed = now - idx * w
        const estimate = (p * (w - elapsed)) / w + c
        const allowed = estimate + cost <= limit
        if (allowed && commit) Object.assign(s, { a: idx, b: c + cost, c: p })
        return {
          allowed,
          remaining: Math.max(0, Math.floor(limit - estimate - (allowed ? cost : 0))),
          resetMs: w - elapsed,
          retryMs: allowed ? 0 : w - elapsed,
        }
      }
      case 'token-bucket': {
        const tokens = s.b === 0 ? limit : Math.min(limit, s.a + (now - s.b) * this.rate)
        const allowed = tokens >= cost
        if (allowed && commit) Object.assign(s, { a: tokens - cost, b: now })
        const left = allowed ? tokens - cost : tokens
        return {
          allowed,
          remaining: Math.floor(left),
          resetMs: Math.ceil((limit - left) / this.rate),
          retryMs: allowed ? 0 : Math.ceil((cost - tokens) / this.rate),
        }
      }
      case 'gcra': {
        const interval = w / limit
        const tat = Math.max(s.a, now)
        const next = tat + cost * interval
        const wait = Math.max(0, Math.ceil(next - now - w - 0.001))
        const allowed = wait === 0
        if (allowed && commit) s.a = next
        const at = allowed ? next : tat
        return {
          allowed,
          remaining: Math.max(0, Math.floor((w - (at - now)) / interval + 1e-6)),
          resetMs: Math.ceil(at - now),
          retryMs: wait,
        }
      }
    }
  }
}
