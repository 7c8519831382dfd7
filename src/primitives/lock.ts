import { channels, traced } from '../plugins/common/diagnostics.ts'
import { GatewayError } from '../plugins/common/errors.ts'
import { optionChecker, optionKeys } from '../plugins/common/options.ts'
import { bridgeOpenTelemetry } from '../plugins/common/otel.ts'
import { randomToken } from '../plugins/common/random-token.ts'
import { type AnyRedisClient, checkRedisClient } from '../redis/client.ts'
import { callScript, codes, defineScript, integer } from '../redis/scripts.ts'
import { withTimeout } from '../redis/timeout.ts'
import { checkedOptions, InvalidArgumentError, shown } from './checks.ts'

// A distributed lock on one Redis (or one Cluster slot): SET NX PX to take it, compare-and-delete to
// release it, compare-and-PEXPIRE to extend it, each one Lua script, plus a fencing token that only
// grows per name so the protected resource can refuse a holder whose lock has gone.

export interface LockOptions {
  /** Prefix of every key (default `lock:`). A lock `name` uses `<prefix>{<name>}` and `<prefix>{<name>}:fence`. */
  keyPrefix?: string
}

/** What `acquire` hands the holder. */
export interface LockHandle {
  readonly name: string
  /** Random 128-bit token (hex) naming this acquisition; release and extend compare it. */
  readonly owner: string
  /**
   * Fencing token: larger than the token of every earlier holder of this name. Pass it to the resource
   * the lock protects and have it refuse a write carrying a token lower than the highest it has seen.
   */
  readonly fence: number
  /**
   * Local estimate (epoch ms, this process's clock) of when the lock expires: counted from before the
   * command was sent, so never later than the expiry in Redis. `extend` moves it.
   */
  expiresAt: number
}

/** Who holds a lock, as Redis says now. */
export interface LockHolder {
  owner: string
  fence: number
  /** Milliseconds until the lock expires unless extended. */
  expiresInMs: number
}

export interface WithLockOptions {
  /** Lock TTL in ms, renewed while `fn` runs. */
  ttlMs: number
  /** Renew every this many ms (default `ttlMs / 3`); must be below `ttlMs`. */
  renewEveryMs?: number
  /** Keep trying to acquire for up to this many ms (default 0: one attempt). */
  waitMs?: number
}

export interface Lock {
  /** Takes the lock for `ttlMs`, or null when another owner holds it. */
  acquire(name: string, ttlMs: number): Promise<LockHandle | null>
  /** Resets the lock's TTL to `ttlMs` if the handle still holds it; false otherwise. */
  extend(handle: LockHandle, ttlMs: number): Promise<boolean>
  /** Deletes the lock if the handle still holds it; false otherwise (nothing of another owner is touched). */
  release(handle: LockHandle): Promise<boolean>
  /** The current holder, or null (an expired holder is never reported). */
  holder(name: string): Promise<LockHolder | null>
  /**
   * Runs `fn` holding the lock, renewing it every `renewEveryMs`, and always releases it afterwards.
   * `signal` aborts, with a `LockLostError` as its reason, as soon as a renewal finds the lock gone
   * or renewals have failed until the TTL ran out: `fn` must then stop writing (check
   * `signal.aborted` or call `signal.throwIfAborted()` before each write), and it must pass
   * `handle.fence` with its writes so the resource refuses a holder that is late to notice.
   * Resolves with `fn`'s result (even if the signal aborted and `fn` chose to finish); rejects with
   * `fn`'s error, or with `LockNotAcquiredError` when the lock could not be taken within `waitMs`.
   */
  withLock<T>(
    name: string,
    fn: (signal: AbortSignal, handle: LockHandle) => Promise<T>,
    options: WithLockOptions,
  ): Promise<T>
}

/** `withLock` could not take the lock within `waitMs`. */
export class LockNotAcquiredError extends GatewayError {
  readonly lockName: string
  /** Milliseconds the holder's lock still had to live at the last attempt (its PTTL), 0 or more. */
  readonly retryAfterMs: number
  constructor(lockName: string, retryAfterMs: number) {
    super('FRG_LOCK_NOT_ACQUIRED', `lock '${lockName}' is held by another owner for ${retryAfterMs} ms more`)
    this.lockName = lockName
    this.retryAfterMs = retryAfterMs
  }
}

/** The reason of `withLock`'s signal when the lock was lost while `fn` ran. */
export class LockLostError extends GatewayError {
  readonly lockName: string
  constructor(lockName: string, message: string, options?: { cause?: unknown }) {
    super('FRG_LOCK_LOST', `lock '${lockName}': ${message}`, options)
    this.lockName = lockName
  }
}

const LOCK_OPTIONS = optionKeys<LockOptions>({ keyPrefix: true })
const WITH_LOCK_OPTIONS = optionKeys<WithLockOptions>({ ttlMs: true, renewEveryMs: true, waitMs: true })

function checkName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name.length === 0)
    throw new InvalidArgumentError(`lock: \`name\` must be a non-empty string, got ${shown(name)}`)
}

function checkTtl(value: unknown): asserts value is number {
  if (!Number.isInteger(value) || (value as number) < 1)
    throw new InvalidArgumentError(`lock: \`ttlMs\` must be a positive integer (ms), got ${shown(value)}`)
}

/** withLock's options, defaults applied. */
function withLockOptions(options: WithLockOptions) {
  const check = optionChecker('withLock')
  const { ttlMs, waitMs = 0 } = checkedOptions(check, options, WITH_LOCK_OPTIONS)
  if (!Number.isInteger(ttlMs) || ttlMs < 1)
    check.fail(`\`ttlMs\` must be a positive integer (ms), got ${shown(ttlMs)}`)
  const renewEveryMs = options.renewEveryMs ?? Math.max(1, Math.floor(ttlMs / 3))
  if (!Number.isInteger(renewEveryMs) || renewEveryMs < 1 || renewEveryMs >= ttlMs)
    check.fail(
      `\`renewEveryMs\` must be a positive integer (ms) below \`ttlMs\` (${ttlMs}), got ${shown(renewEveryMs)}`,
    )
  if (!Number.isInteger(waitMs) || waitMs < 0)
    check.fail(`\`waitMs\` must be a non-negative integer (ms), got ${shown(waitMs)}`)
  return { ttlMs, renewEveryMs, waitMs }
}

const HELD = codes({ acquired: 1, held: 0 })

const LOCK_ACQUIRE = defineScript({
  name: 'lockAcquire',
  keys: ['lock', 'fence'],
  args: ['owner', 'ttlMs'],
  /** The fence when acquired, else how long the holder still has (PTTL). */
  reply: (raw) => {
    const [state, value] = raw as [number, number]
    return { state: HELD(state), value: integer(value) }
  },
})
const LOCK_EXTEND = defineScript({
  name: 'lockExtend',
  keys: ['lock'],
  args: ['owner', 'ttlMs'],
  reply: codes({ extended: 1, notHolder: 0 }),
})
const LOCK_RELEASE = defineScript({
  name: 'lockRelease',
  keys: ['lock'],
  args: ['owner'],
  reply: codes({ released: 1, notHolder: 0 }),
})
const LOCK_HOLDER = defineScript({
  name: 'lockHolder',
  keys: ['lock', 'fence'],
  args: [],
  reply: (raw): LockHolder | null => {
    if (!raw) return null
    const [owner, fence, pttl] = raw as [string, string | null, number]
    return { owner, fence: Number(fence), expiresInMs: pttl }
  },
})

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

export function createLock(client: AnyRedisClient, options: LockOptions = {}): Lock {
  void bridgeOpenTelemetry()
  const redis = checkRedisClient('lock', client)
  const check = optionChecker('lock')
  const { keyPrefix = 'lock:' } = checkedOptions(check, options, LOCK_OPTIONS)
  if (typeof keyPrefix !== 'string') check.fail(`\`keyPrefix\` must be a string, got ${shown(keyPrefix)}`)
  // One hash tag for both keys of a name, so the script runs on one Cluster slot.
  const keys = (name: string) => ({ lock: `${keyPrefix}{${name}}`, fence: `${keyPrefix}{${name}}:fence` })

  /** One attempt: the handle, or how long the current holder still has (traced on the lock channel). */
  function attempt(name: string, ttlMs: number): Promise<LockHandle | number> {
    return traced(
      channels.lock,
      () => ({ name, acquired: false, fence: null }),
      () => attemptOnce(name, ttlMs),
      (context, result) => {
        if (typeof result === 'number') return
        context.acquired = true
        context.fence = result.fence
      },
    )
  }

  async function attemptOnce(name: string, ttlMs: number): Promise<LockHandle | number> {
    const owner = randomToken(16, 'hex')
    const sent = Date.now()
    const { state, value } = await callScript(redis, LOCK_ACQUIRE, keys(name), { owner, ttlMs })
    if (state === 'held') return value
    return { name, owner, fence: value, expiresAt: sent + ttlMs }
  }

  async function acquire(name: string, ttlMs: number): Promise<LockHandle | null> {
    checkName(name)
    checkTtl(ttlMs)
    const result = await attempt(name, ttlMs)
    return typeof result === 'number' ? null : result
  }

  async function extend(handle: LockHandle, ttlMs: number): Promise<boolean> {
    checkTtl(ttlMs)
    const sent = Date.now()
    const { lock } = keys(handle.name)
    const reply = await callScript(redis, LOCK_EXTEND, { lock }, { owner: handle.owner, ttlMs })
    if (reply === 'extended') handle.expiresAt = sent + ttlMs
    return reply === 'extended'
  }

  async function release(handle: LockHandle): Promise<boolean> {
    const { lock } = keys(handle.name)
    return (await callScript(redis, LOCK_RELEASE, { lock }, { owner: handle.owner })) === 'released'
  }

  async function holder(name: string): Promise<LockHolder | null> {
    checkName(name)
    return callScript(redis, LOCK_HOLDER, keys(name), {})
  }

  async function acquireWithin(name: string, ttlMs: number, waitMs: number): Promise<LockHandle> {
    const deadline = Date.now() + waitMs
    let pause = 10
    for (;;) {
      const result = await attempt(name, ttlMs)
      if (typeof result !== 'number') return result
      const left = deadline - Date.now()
      if (left <= 0) throw new LockNotAcquiredError(name, Math.max(0, result))
      // Poll with a growing, jittered pause (the holder may release before its TTL ends).
      const wait = Math.min(left, Math.ceil(pause * (0.5 + Math.random())), result > 0 ? result : pause)
      await sleep(Math.max(1, wait))
      pause = Math.min(pause * 2, 200)
    }
  }

  async function withLock<T>(
    name: string,
    fn: (signal: AbortSignal, handle: LockHandle) => Promise<T>,
    options: WithLockOptions,
  ): Promise<T> {
    checkName(name)
    if (typeof fn !== 'function')
      throw new InvalidArgumentError(
        `lock: \`fn\` must be a function of the signal and the handle, got ${shown(fn)}`,
      )
    const { ttlMs, renewEveryMs, waitMs } = withLockOptions(options)
    const handle = await acquireWithin(name, ttlMs, waitMs)

    const controller = new AbortController()
    let done = false
    let renewTimer: NodeJS.Timeout | undefined
    let expiryTimer: NodeJS.Timeout | undefined
    let lastError: unknown

    const lose = (message: string, cause?: unknown) => {
      clearTimeout(renewTimer)
      clearTimeout(expiryTimer)
      if (!controller.signal.aborted)
        controller.abort(new LockLostError(name, message, cause === undefined ? undefined : { cause }))
    }
    // Fires when the lock must be taken as expired: no renewal succeeded in time (Redis failing or
    // slow, the command hanging), whatever the pending command later answers.
    const armExpiry = () => {
      clearTimeout(expiryTimer)
      expiryTimer = setTimeout(
        () => lose(`not renewed before its ttl of ${ttlMs} ms ran out`, lastError),
        Math.max(0, handle.expiresAt - Date.now()),
      )
    }
    const renew = async () => {
      try {
        const held = await extend(handle, ttlMs)
        if (done || controller.signal.aborted) return
        if (!held) return lose('taken by another owner or expired before it was renewed')
        lastError = undefined
        armExpiry()
      } catch (err) {
        lastError = err
      }
      if (!done && !controller.signal.aborted) renewTimer = setTimeout(renew, renewEveryMs)
    }
    armExpiry()
    renewTimer = setTimeout(renew, renewEveryMs)

    try {
      return await fn(controller.signal, handle)
    } finally {
      done = true
      clearTimeout(renewTimer)
      clearTimeout(expiryTimer)
      // Compare-and-delete: never touches another owner's lock. Not waited on past the lock's own
      // expiry: by then Redis lets it go anyway.
      await withTimeout(
        release(handle).catch(() => false),
        Math.max(0, handle.expiresAt - Date.now()),
        () => false,
      )
    }
  }

  return { acquire, extend, release, holder, withLock }
}
