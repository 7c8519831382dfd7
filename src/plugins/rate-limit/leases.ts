import { randomBytes } from 'node:crypto'
import type { FastifyBaseLogger } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'
import { callScript, defineScript, integer } from '../../redis/scripts.ts'
import type { RateLimitMetrics } from './metrics.ts'
import { encodeCall, type Quota, runEncoded, type ScriptCall } from './protocol.ts'
import type { Policy, SyncSettings } from './types.ts'

/**
 * Buffered mode: what one instance holds of each buffered key's quota. A lease is quota consumed
 * in Redis ahead of the requests it will admit: the script call that grants it is an ordinary
 * consume of `size` units, so Redis never counts less than every instance may admit (no
 * over-admission while Redis keeps its data), and what an instance does not use it gives back
 * with an ordinary refund. Each lease takes a share of the remaining quota that follows the live
 * number of instances (a heartbeat per key prefix), at most the policy's `batch`.
 *
 * The sync timer (the smallest interval of the buffered policies seen) renews the heartbeat (at
 * most every second) and gives back every lease idle since the previous tick or held for LEASE_TICKS intervals; a fixed
 * window's lease also ends with its window (what it held is gone with it).
 */

const INSTANCES = defineScript({
  name: 'rateLimitInstances',
  keys: ['instances'],
  args: ['instance', 'ttlMs'],
  reply: integer,
})

/**
 * Leases are timed on a clock that never jumps (a wall clock stepped back would stretch a fixed
 * window's lease into the next window): ms, in the epoch's range, from the monotonic clock.
 */
export const monotonicNow = () => performance.timeOrigin + performance.now()

/** The plugin's clock when a test gives one; else a clock that never jumps. */
export const leaseClock = (now: (() => number) | undefined) => (!now || now === Date.now ? monotonicNow : now)

/** `watch`'s answer when nothing changes: asked on every buffered decision, so no promise is made. */
const WATCHED = Promise.resolve()

/** A lease is given back after this many sync intervals even while in use: no unit is held longer. */
const LEASE_TICKS = 4
/**
 * The heartbeat is renewed at most every second (each one is a script call, and every instance
 * sends them), and an instance counts toward the others' shares until three go missing.
 */
const HEARTBEAT_MIN_MS = 1000
const HEARTBEATS_MISSED = 3
/** Keys one instance holds leases on at most; past it the oldest lease is given back. */
export const MAX_LEASES = 10_000

export interface Lease {
  readonly policy: Policy
  readonly sync: SyncSettings
  /** The counter key, the quota it was taken under, and what a refund of it passes back. */
  readonly key: string
  readonly quota: Quota
  readonly refundWindow: number
  /** Units granted and not yet spent. */
  left: number
  /** Units spent since the last sync tick (0 at a tick: the lease is idle and given back). */
  spent: number
  /** This process's clock: when the lease stops admitting (a fixed window's end; LEASE_TICKS intervals). */
  readonly expiresAt: number
  /** What Redis had left after the grant, and when the quota resets (this process's clock). */
  readonly remaining: number
  readonly resetAt: number
  /** The RateLimit-Policy item and limit its decisions carry. */
  readonly header: string
  readonly limit: number
}

export interface Grant {
  policy: Policy
  key: string
  quota: Quota
  header: string
  limit: number
  /** Units the script call consumed (this request's cost included). */
  size: number
  /** Units of it the requests waiting on the call take at once. */
  taken: number
  remaining: number
  resetMs: number
  refundWindow: number
  /** This process's clock when the call was sent: a window's end is measured from it (never late). */
  sentAt: number
}

/** What Redis last said of a key: the units left then, and when it is full again (this process's clock). */
interface LastWord {
  remaining: number
  at: number
  fullAt: number
  /** A token bucket or GCRA, refilled evenly until `fullAt`; a fixed window is renewed at once then. */
  refills: boolean
}

export class LeaseBook {
  private readonly leases = new Map<string, Lease>()
  /** Acquisitions in flight per key: requests arriving meanwhile wait for them instead of sending their own. */
  readonly pending = new Map<string, Promise<unknown>>()
  /** What Redis last said was left of each key (the next lease's share is taken from it). */
  private readonly lastWords = new Map<string, LastWord>()
  private readonly id = randomBytes(9).toString('base64url')
  private readonly instancesKey: string
  private timer: NodeJS.Timeout | null = null
  private intervalMs = Number.POSITIVE_INFINITY
  /** When the next tick renews the heartbeat (this process's clock). */
  private nextHeartbeat = 0
  /** Live instances of the key prefix, this one included, as the last heartbeat said. */
  instances = 1
  private closed = false

  constructor(
    private readonly redis: RedisClient,
    keyPrefix: string,
    private readonly now: () => number,
    private readonly log: FastifyBaseLogger,
    private readonly metrics: RateLimitMetrics,
  ) {
    this.instancesKey = `${keyPrefix}instances`
  }

  /**
   * A buffered policy was seen (at ready, or a route's added later): ticks at least as often as it
   * syncs; resolves once the heartbeat that announces this instance has its answer.
   */
  watch(sync: SyncSettings): Promise<void> {
    if (this.closed || sync.intervalMs >= this.intervalMs) return WATCHED
    this.intervalMs = sync.intervalMs
    if (this.timer) clearInterval(this.timer)
    this.timer = setInterval(() => void this.tick(), this.intervalMs)
    this.timer.unref()
    return this.heartbeat()
  }

  /** Takes `cost` units from the key's lease: the lease when it admits the request, else null. */
  take(key: string, cost: number): Lease | null {
    const lease = this.leases.get(key)
    if (!lease || lease.left < cost) return null
    if (this.now() >= lease.expiresAt) {
      // Its window has ended, or it is due back: its units are no longer this instance's to spend.
      void this.retire(lease)
      return null
    }
    lease.left -= cost
    lease.spent += cost
    return lease
  }

  /** Units taken for a request another policy then refused go back to their lease. */
  giveBack(lease: Lease, cost: number): void {
    if (this.leases.get(lease.key) !== lease) return
    lease.left += cost
    lease.spent -= cost
  }

  /**
   * Units to ask for: this instance's share of what the key has left, at most `batch` and the
   * limit, at least the request's cost. What it has left is `remaining` when Redis just said it,
   * else an estimate from Redis's last word (a guess too high costs one more call: a lease Redis
   * refuses is asked again for a share of what it says is left).
   */
  sizeFor(key: string, quota: Quota, sync: SyncSettings, cost: number, remaining?: number): number {
    const left = remaining ?? this.leftOf(key, quota)
    const share = Math.floor(left / this.instances)
    return Math.max(cost, Math.min(share, sync.batch, quota.limit))
  }

  /**
   * What the key has now by Redis's last word: the limit once its window ended or its bucket
   * refilled (or before any call), a bucket's or GCRA's refill so far, else what was left.
   */
  private leftOf(key: string, quota: Quota): number {
    const last = this.lastWords.get(key)
    const now = this.now()
    if (!last || now >= last.fullAt) return quota.limit
    if (!last.refills) return last.remaining
    const refilled = ((quota.limit - last.remaining) * (now - last.at)) / (last.fullAt - last.at)
    return last.remaining + Math.floor(refilled)
  }

  /** Redis granted `grant.size` units: the request's cost is spent, the rest becomes (or joins) the key's lease. */
  granted(grant: Grant): Lease {
    const { policy, key } = grant
    const sync = policy.sync!
    const windowEnds =
      policy.algorithm === 'fixed-window' ? grant.sentAt + grant.resetMs : Number.POSITIVE_INFINITY
    // A lease too small for a request's cost is replaced: what it has left goes back.
    const old = this.leases.get(key)
    if (old) void this.retire(old)
    const lease: Lease = {
      policy,
      sync,
      key,
      quota: grant.quota,
      refundWindow: grant.refundWindow,
      left: grant.size - grant.taken,
      spent: grant.taken,
      expiresAt: Math.min(windowEnds, grant.sentAt + LEASE_TICKS * sync.intervalMs),
      remaining: grant.remaining,
      resetAt: grant.sentAt + grant.resetMs,
      header: grant.header,
      limit: grant.limit,
    }
    this.leases.delete(key)
    if (this.leases.size >= MAX_LEASES) {
      const oldest = this.leases.values().next().value!
      void this.giveBackUnused(oldest)
    }
    this.leases.set(key, lease)
    this.metrics.leaseCall('acquire')
    return lease
  }

  /**
   * What Redis said of a key (after a refusal too): the units left, and in `resetMs` from `sentAt`
   * (the call's send time, so never late) when it is full again. The next share is taken from it.
   */
  remember(key: string, policy: Policy, remaining: number, resetMs: number, sentAt: number): void {
    this.lastWords.delete(key)
    if (this.lastWords.size >= MAX_LEASES) this.lastWords.delete(this.lastWords.keys().next().value!)
    const refills = policy.algorithm !== 'fixed-window'
    this.lastWords.set(key, { remaining, at: sentAt, fullAt: sentAt + resetMs, refills })
  }

  /** The sync tick: the heartbeat when due (`renew`: now), and every idle, aged or ended lease given back. */
  async tick(renew = false): Promise<void> {
    const now = this.now()
    const returns: Array<Promise<void>> = []
    if (renew || now >= this.nextHeartbeat) returns.push(this.heartbeat())
    for (const lease of [...this.leases.values()]) {
      if (lease.spent === 0 || now >= lease.expiresAt) returns.push(this.retire(lease))
      else lease.spent = 0
    }
    await Promise.all(returns)
  }

  /** A lease leaves: its unused units go back, unless its fixed window has ended (they went with it). */
  private retire(lease: Lease): Promise<void> {
    if (lease.policy.algorithm === 'fixed-window' && this.now() >= lease.resetAt) {
      this.drop(lease)
      return Promise.resolve()
    }
    return this.giveBackUnused(lease)
  }

  private drop(lease: Lease): void {
    if (this.leases.get(lease.key) === lease) this.leases.delete(lease.key)
  }

  /** One refund call for the unused units of a lease (none for an empty one). */
  private async giveBackUnused(lease: Lease): Promise<void> {
    this.drop(lease)
    const { left } = lease
    if (left <= 0) return
    lease.left = 0
    const call: ScriptCall = {
      operation: 'refund',
      nonce: '',
      policies: [
        { key: lease.key, quota: lease.quota, cost: left, maxDelayMs: 0, refundWindow: lease.refundWindow },
      ],
      blocks: [],
      penalties: [],
    }
    this.metrics.leaseCall('return')
    try {
      await runEncoded(this.redis, lease.policy.algorithm, encodeCall(lease.policy.algorithm, call))
    } catch (err) {
      // Units not given back stay counted until the window moves or the bucket refills: the safe side.
      this.log.debug({ err, policy: lease.policy.name }, 'rate-limit lease return failed')
    }
  }

  private get heartbeatMs(): number {
    return Math.max(this.intervalMs, HEARTBEAT_MIN_MS)
  }

  private async heartbeat(): Promise<void> {
    if (this.closed || this.redis.status !== 'ready') return
    // A tick may come a little early: the next heartbeat is due within half a tick of a period.
    this.nextHeartbeat = this.now() + this.heartbeatMs - this.intervalMs / 2
    this.metrics.leaseCall('heartbeat')
    try {
      this.instances = Math.max(
        1,
        await callScript(
          this.redis,
          INSTANCES,
          { instances: this.instancesKey },
          { instance: this.id, ttlMs: HEARTBEATS_MISSED * this.heartbeatMs },
        ),
      )
    } catch (err) {
      this.log.debug({ err }, 'rate-limit heartbeat failed')
    }
  }

  /** The app is closing: every unused unit goes back, and this instance leaves the count. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    if (this.timer) clearInterval(this.timer)
    if (this.redis.status !== 'ready') return
    const returns = [...this.leases.values()].map((lease) => this.giveBackUnused(lease))
    returns.push(
      callScript(
        this.redis,
        INSTANCES,
        { instances: this.instancesKey },
        { instance: this.id, ttlMs: 0 },
      ).then(
        () => {},
        () => {},
      ),
    )
    await Promise.all(returns)
  }

  /** A key was reset: its lease's units were counted on the counter just deleted, and must not be spent. */
  forget(key: string): void {
    this.leases.delete(key)
    this.lastWords.delete(key)
  }

  /** What this instance holds, per buffered policy. */
  report(): LeaseReport {
    const policies: LeaseReport['policies'] = {}
    const now = this.now()
    for (const lease of this.leases.values()) {
      // Units of a lease past its age stay held until given back; those of an ended window are gone.
      if (lease.policy.algorithm === 'fixed-window' && now >= lease.resetAt) continue
      const entry = policies[lease.policy.name] ?? { keys: 0, unitsHeld: 0 }
      policies[lease.policy.name] = entry
      entry.keys++
      entry.unitsHeld += lease.left
    }
    return { instances: this.instances, policies }
  }
}

/** `app.rateLimiter.leases()`: the live instances this one counts, and the unused units it holds per buffered policy. */
export interface LeaseReport {
  instances: number
  policies: Record<string, { keys: number; unitsHeld: number }>
}
