import type { Algorithm } from './policy.ts'

/**
 * The rate-limit scripts run in this process: the same arguments, the same reply and the same
 * decisions as src/lua/rate-limit-*.lua, on this process's clock instead of Redis's. It serves
 * `store: 'memory'` and, with a share of each limit, the `onRedisError: 'local'` fallback.
 *
 * Each method below follows its script's general path line by line (the scripts' fast paths are
 * shortcuts that reply the same). Keys are bounded: past `maxKeys` the least recently used key is
 * dropped (its client starts afresh), and expired keys are swept as Redis expires them.
 */

interface Entry {
  /** Which script's data the key holds; another script on it fails as WRONGTYPE would. */
  kind: 'fw' | 'log' | 'sc' | 'tb' | 'gcra' | 'block'
  /** Expiry time in ms since the epoch (Infinity: no TTL). */
  exp: number
  /** fixed window: the count; token bucket: tokens; gcra: the theoretical arrival time. */
  n: number
  /** sliding counter: window index (NaN: none); token bucket: last refill time. */
  w: number
  /** sliding counter: current and previous window counts. */
  c: number
  p: number
  /** sliding log: unit times ascending, and the nonce each unit was added under. */
  times: number[] | null
  nonces: string[] | null
}

/** A fixed-window policy's penalties in one call: see src/lua/rate-limit-fixed-window.lua. */
interface Penalty {
  key: string
  /** Rejections before the ban (-1: no ban). */
  ban: number
  backoff: boolean
  continue: boolean
  /** Rejections counted in the current window before this request. */
  rejected: number
}

/** exponentialBackoff: a window grows to at most this (or the policy's window, if longer). */
export const MAX_BACKOFF_MS = 2 ** 31 - 1

/** How often expired keys are swept while nothing else touches them. */
const SWEEP_INTERVAL_MS = 10_000

type Arg = string | number

export class MemoryStore {
  private readonly map = new Map<string, Entry>()
  maxKeys: number
  private readonly clock: () => number
  private readonly timer: NodeJS.Timeout

  constructor(maxKeys: number, clock: () => number = Date.now) {
    this.maxKeys = maxKeys
    this.clock = clock
    this.timer = setInterval(() => this.sweep(), SWEEP_INTERVAL_MS)
    this.timer.unref()
  }

  get size(): number {
    return this.map.size
  }

  close(): void {
    clearInterval(this.timer)
    this.map.clear()
  }

  /** Drops every expired key (Redis's active expiry). */
  sweep(now = this.clock()): void {
    for (const [key, entry] of this.map) if (entry.exp <= now) this.map.delete(key)
  }

  /** A live entry (most recently used from now on), or undefined; `kind` is checked like a Redis type. */
  private read(key: string, kind: Entry['kind'], now: number): Entry | undefined {
    const entry = this.map.get(key)
    if (entry === undefined) return undefined
    this.map.delete(key)
    if (entry.exp <= now) return undefined
    this.map.set(key, entry)
    if (entry.kind !== kind)
      throw new Error('WRONGTYPE Operation against a key holding the wrong kind of value')
    return entry
  }

  /** A new entry without a TTL, making room by dropping expired, then least recently used keys. */
  private create(key: string, kind: Entry['kind'], now: number): Entry {
    if (this.map.size >= this.maxKeys) {
      for (const [oldest, entry] of this.map) {
        this.map.delete(oldest)
        if (entry.exp > now || this.map.size < this.maxKeys) break
      }
    }
    const entry: Entry = {
      kind,
      exp: Number.POSITIVE_INFINITY,
      n: 0,
      w: Number.NaN,
      c: 0,
      p: 0,
      times: null,
      nonces: null,
    }
    this.map.set(key, entry)
    return entry
  }

  /** Deletes keys (DEL). */
  delete(keys: readonly string[]): void {
    for (const key of keys) this.map.delete(key)
  }

  /** SET key 1 PX ms: a block until now + ms. */
  block(key: string, ms: number): void {
    const now = this.clock()
    const entry = this.read(key, 'block', now) ?? this.create(key, 'block', now)
    entry.exp = now + ms
  }

  /** Every live key (tests list them as they would SCAN Redis). */
  keys(): string[] {
    const now = this.clock()
    return [...this.map].filter(([, entry]) => entry.exp > now).map(([key]) => key)
  }

  /** The stored state of a key (tests look at it as they would at Redis). */
  inspect(key: string): Readonly<Entry> | undefined {
    const entry = this.map.get(key)
    return entry && entry.exp > this.clock() ? entry : undefined
  }

  /** Runs the script of `algorithm` with the arguments the Redis script takes; returns its reply. */
  run(algorithm: Algorithm, keys: readonly string[], argv: readonly Arg[]): number[] {
    const now = this.clock()
    // KEYS: the n policy keys, then one block key per policy with blocks; ARGV: op, nonce, four per
    // policy, then (policy index, block ms) per block key. So n = (#ARGV - 2) / 2 - #KEYS.
    const n = (argv.length - 2) / 2 - keys.length
    const requested = argv[0] as string
    let op = requested
    let blocked: Map<number, number> | null = null
    if (op !== 'r' && keys.length > n) {
      for (let j = 1; j <= keys.length - n; j++) {
        const at = 2 + 4 * n + 2 * j - 1
        // A negative index is a fixed window's penalty key, not a block.
        if (Number(argv[at - 1]) < 0) continue
        const entry = this.read(keys[n + j - 1]!, 'block', now)
        if (entry === undefined) continue
        if (entry.exp === Number.POSITIVE_INFINITY) entry.exp = now + Number(argv[at])
        blocked ??= new Map()
        blocked.set(Number(argv[at - 1]), entry.exp - now)
      }
      // A blocked request is only looked at: nothing is counted while any of its policies is blocked.
      if (blocked) op = 'p'
    }
    const over: boolean[] = []
    const reply = this.decide(algorithm, op, keys, argv, n, now, over)
    if (op === 'r' || keys.length === n) return reply
    for (let j = 1; j <= keys.length - n; j++) {
      const at = 2 + 4 * n + 2 * j - 1
      const i = Number(argv[at - 1])
      if (i < 0) continue
      let ttl = blocked?.get(i)
      if (ttl === undefined && requested === 'c' && !blocked && over[i]) {
        ttl = Number(argv[at])
        const entry = this.read(keys[n + j - 1]!, 'block', now) ?? this.create(keys[n + j - 1]!, 'block', now)
        entry.exp = now + ttl
      }
      if (ttl !== undefined) {
        const r = 2 + (i - 1) * 4
        reply[r] = 0
        if (ttl > reply[r + 1]!) reply[r + 1] = ttl
        if (ttl > reply[r + 2]!) reply[r + 2] = ttl
      }
    }
    if (blocked) {
      reply[0] = 0
      reply[1] = 0
    }
    return reply
  }

  private decide(
    algorithm: Algorithm,
    op: string,
    keys: readonly string[],
    argv: readonly Arg[],
    n: number,
    now: number,
    over: boolean[],
  ): number[] {
    switch (algorithm) {
      case 'fixed-window':
        return this.fixedWindow(op, keys, argv, n, now, over)
      case 'sliding-log':
        return this.slidingLog(op, keys, argv, n, now, over)
      case 'sliding-counter':
        return this.slidingCounter(op, keys, argv, n, now, over)
      case 'token-bucket':
        return this.tokenBucket(op, keys, argv, n, now, over)
      case 'gcra':
        return this.gcra(op, keys, argv, n, now, over)
    }
  }

  private fixedWindow(
    op: string,
    keys: readonly string[],
    argv: readonly Arg[],
    n: number,
    now: number,
    over: boolean[],
  ) {
    const penalty: Array<Penalty | undefined> = []
    let penalties = false
    if (op !== 'r') {
      for (let j = 1; j <= keys.length - n; j++) {
        const at = 2 + 4 * n + 2 * j - 1
        const i = Number(argv[at - 1])
        if (i >= 0) continue
        const spec = Number(argv[at])
        const key = keys[n + j - 1]!
        penalty[-i] = {
          key,
          ban: Math.floor(spec / 4) - 1,
          backoff: spec % 4 >= 2,
          continue: spec % 2 === 1,
          rejected: this.read(key, 'fw', now)?.n ?? 0,
        }
        penalties = true
      }
    }
    const reply = [1, 0]
    const entries: Array<Entry | undefined> = []
    const counts: number[] = []
    const ttls: number[] = []
    const banned: number[] = []
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const limit = Number(argv[b])
      const window = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      const pen = penalty[i]
      let entry = this.read(key, 'fw', now)
      let count: number
      if (op === 'c') {
        entry ??= this.create(key, 'fw', now)
        entry.n += cost
        count = entry.n
        // A new window: the rejections of an older one are gone with it.
        if (pen && count === cost && pen.rejected > 0) {
          pen.rejected = 0
          this.map.delete(pen.key)
        }
      } else count = entry?.n ?? 0
      // Banned: every request is rejected until the window ends.
      if (pen && pen.ban >= 0 && pen.rejected > pen.ban && count > 0) banned[i] = 1
      if (op === 'c' && (count > limit || banned[i])) {
        reply[0] = 0
        over[i] = true
      }
      let ttl = window
      if (count === cost && op === 'c') entry!.exp = now + window
      else if (count > 0) {
        ttl = entry!.exp === Number.POSITIVE_INFINITY ? -1 : entry!.exp - now
        if (ttl < 0) {
          entry!.exp = now + window
          ttl = window
        }
      }
      if (op === 'r') {
        if (count >= cost && ttl <= Number(argv[b + 3])) entry!.n -= cost
      } else if (op === 'p' && (count + cost > limit || banned[i])) {
        reply[0] = 0
        over[i] = true
      }
      entries[i] = entry
      counts[i] = count
      ttls[i] = ttl
    }
    if (op === 'r') return reply
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const limit = Number(argv[b])
      const window = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      let count = counts[i]!
      let retry = 0
      if (op === 'c' && reply[0] === 0) {
        entries[i]!.n -= cost
        count -= cost
        // A rejection this policy decided (not one of a sibling's) is counted, and penalised.
        const pen = penalty[i]
        if (pen && over[i]) {
          const k = pen.rejected + 1
          let ttl = ttls[i]!
          if (pen.continue) ttl = window
          else if (pen.backoff) ttl = Math.min(window * 2 ** (k - 1), Math.max(window, MAX_BACKOFF_MS))
          entries[i]!.exp = now + ttl
          const rejections = this.read(pen.key, 'fw', now) ?? this.create(pen.key, 'fw', now)
          rejections.n = k
          rejections.exp = now + ttl
          ttls[i] = ttl
          if (pen.ban >= 0 && k > pen.ban) banned[i] = k === pen.ban + 1 ? 2 : 1
        }
      }
      if (reply[0] === 0 && (count + cost > limit || banned[i])) retry = ttls[i]!
      reply.push(banned[i] ? 0 : Math.max(0, limit - count), ttls[i]!, retry, ttls[i]!)
    }
    if (penalties) for (let i = 1; i <= n; i++) reply.push(banned[i] ?? 0)
    return reply
  }

  private slidingLog(
    op: string,
    keys: readonly string[],
    argv: readonly Arg[],
    n: number,
    now: number,
    over: boolean[],
  ) {
    const nonce = String(argv[1])
    const reply = [1, 0]
    const counts: number[] = []
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const window = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      const entry = this.read(key, 'log', now)
      if (op === 'r') {
        // ZREM of the members added under this nonce.
        if (entry) {
          for (let k = entry.nonces!.length - 1; k >= 0; k--) {
            if (entry.nonces![k] === nonce) {
              entry.nonces!.splice(k, 1)
              entry.times!.splice(k, 1)
            }
          }
          if (entry.times!.length === 0) this.map.delete(key)
        }
      } else {
        // ZCOUNT now - window + 1 .. +inf
        let count = 0
        if (entry) for (const t of entry.times!) if (t >= now - window + 1) count++
        counts[i] = count
        if (count + cost > Number(argv[b])) {
          reply[0] = 0
          over[i] = true
        }
      }
    }
    if (op === 'r') return reply
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const limit = Number(argv[b])
      const window = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      let count = counts[i]!
      let retry = 0
      let entry = this.read(key, 'log', now)
      if ((reply[0] === 0 || op !== 'c') && entry && entry.exp === Number.POSITIVE_INFINITY)
        entry.exp = now + window
      if (reply[0] === 1 && op === 'c') {
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
          entry ??= this.create(key, 'log', now)
          entry.times = []
          entry.nonces = []
        }
        for (let k = 0; k < cost; k++) insertSorted(entry.times!, entry.nonces!, now, nonce)
        entry.exp = now + window
        count += cost
      } else if (count + cost > limit) {
        const need = Math.min(count + cost - limit, count)
        retry = window
        if (cost <= limit && need >= 1 && entry) {
          // ZRANGEBYSCORE now - window + 1 .. +inf LIMIT need - 1 1
          let seen = 0
          for (const t of entry.times!) {
            if (t < now - window + 1) continue
            if (++seen === need) {
              retry = t + window - now
              break
            }
          }
        }
      }
      let reset = window
      const oldest = entry?.times?.[0]
      if (oldest !== undefined) reset = Math.max(1, oldest + window - now)
      reply.push(Math.max(0, limit - count), reset, retry, 0)
    }
    return reply
  }

  private slidingCounter(
    op: string,
    keys: readonly string[],
    argv: readonly Arg[],
    n: number,
    now: number,
    over: boolean[],
  ) {
    const reply = [1, 0]
    const state: Array<[number, number, number, number, number, number]> = []
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const limit = Number(argv[b])
      const window = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      const idx = Math.floor(now / window)
      const elapsed = now - idx * window
      const entry = this.read(key, 'sc', now)
      const w = entry ? entry.w : Number.NaN
      let c = entry ? entry.c : 0
      let p = entry ? entry.p : 0
      if (Number.isNaN(w) || w < idx - 1) {
        c = 0
        p = 0
      } else if (w === idx - 1) {
        p = c
        c = 0
      }
      if (op === 'r') {
        if (Number(argv[b + 3]) === idx && c >= cost) entry!.c -= cost
      } else {
        const estimate = (p * (window - elapsed)) / window + c
        state[i] = [idx, elapsed, c, p, estimate, w]
        if (estimate + cost > limit) {
          reply[0] = 0
          over[i] = true
        }
      }
    }
    if (op === 'r') return reply
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const limit = Number(argv[b])
      const window = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      const [idx, elapsed, c, p, , w] = state[i]!
      let estimate = state[i]![4]
      let retry = 0
      if (!Number.isNaN(w) && (reply[0] === 0 || op !== 'c')) {
        const entry = this.read(key, 'sc', now)
        if (entry && entry.exp === Number.POSITIVE_INFINITY) entry.exp = now + 2 * window - elapsed
      }
      if (reply[0] === 1) {
        if (op === 'c') {
          estimate += cost
          const entry = this.read(key, 'sc', now) ?? this.create(key, 'sc', now)
          entry.w = idx
          entry.c = c + cost
          entry.p = p
          entry.exp = now + 2 * window - elapsed
        }
      } else if (estimate + cost > limit) {
        if (cost > limit) retry = 2 * window - elapsed
        else if (c + cost <= limit) retry = Math.ceil(window * (1 - (limit - c - cost) / p)) - elapsed
        else retry = window - elapsed + Math.max(0, Math.ceil(window * (1 - (limit - cost) / c)))
        retry = Math.max(1, retry)
      }
      reply.push(Math.max(0, Math.floor(limit - estimate)), window - elapsed, retry, idx)
    }
    return reply
  }

  private tokenBucket(
    op: string,
    keys: readonly string[],
    argv: readonly Arg[],
    n: number,
    now: number,
    over: boolean[],
  ) {
    const reply = [1, 0]
    const state: Array<[number, number, number]> = []
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const cap = Number(argv[b])
      const rate = Number(argv[b + 1]) / 1000
      const cost = Number(argv[b + 2])
      const maxDelay = Number(argv[b + 3])
      const entry = this.read(key, 'tb', now)
      let tokens = cap
      if (entry) {
        tokens = Math.min(cap, entry.n + Math.max(0, now - entry.w) * rate)
        if (op !== 'c' && entry.exp === Number.POSITIVE_INFINITY)
          entry.exp = now + Math.max(1, Math.ceil((cap - tokens) / rate))
      }
      if (op === 'r') {
        tokens = Math.min(cap, tokens + cost)
        if (tokens < cap) {
          const e = entry ?? this.create(key, 'tb', now)
          e.n = tokens
          e.w = now
          e.exp = now + Math.ceil((cap - tokens) / rate)
        } else this.map.delete(key)
      } else {
        const after = tokens - cost
        let wait = 0
        if (after < 0) wait = Math.ceil(-after / rate)
        state[i] = [tokens, after, wait]
        if (cost > cap || wait > maxDelay) {
          reply[0] = 0
          over[i] = true
        } else if (wait > reply[1]!) reply[1] = wait
      }
    }
    if (op === 'r') return reply
    if (reply[0] === 0) reply[1] = 0
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const cap = Number(argv[b])
      const rate = Number(argv[b + 1]) / 1000
      const cost = Number(argv[b + 2])
      const [tokens, after, wait] = state[i]!
      let left = after
      let retry = 0
      if (reply[0] === 1 && op === 'c') {
        const entry = this.read(key, 'tb', now) ?? this.create(key, 'tb', now)
        entry.n = after
        entry.w = now
        entry.exp = now + Math.max(1, Math.ceil((cap - after) / rate))
      } else {
        left = tokens
        if (op === 'c' && tokens < cap) {
          const entry = this.read(key, 'tb', now)
          if (entry && entry.exp === Number.POSITIVE_INFINITY)
            entry.exp = now + Math.max(1, Math.ceil((cap - tokens) / rate))
        }
      }
      if (reply[0] === 0) {
        if (after < 0) retry = wait
        if (cost > cap) retry = Math.ceil((cap - tokens) / rate) + 1
      }
      reply.push(Math.max(0, Math.floor(left)), Math.ceil((cap - left) / rate), retry, 0)
    }
    return reply
  }

  private gcra(
    op: string,
    keys: readonly string[],
    argv: readonly Arg[],
    n: number,
    now: number,
    over: boolean[],
  ) {
    const reply = [1, 0]
    const state: Array<[number, number, number, number]> = []
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const limit = Number(argv[b])
      const period = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      const maxDelay = Number(argv[b + 3])
      const interval = period / limit
      const entry = this.read(key, 'gcra', now)
      const stored = entry?.n
      const tat = Math.max(stored ?? now, now)
      if (op === 'r') {
        if (stored !== undefined && stored > now) {
          const back = Math.max(now, stored - cost * interval)
          entry!.n = back
          entry!.exp = now + Math.max(1, Math.ceil(back - now))
        }
      } else {
        const newTat = tat + cost * interval
        // The microsecond slack absorbs float rounding of period / limit, so exactly `limit` fit.
        const wait = Math.max(0, Math.ceil(newTat - now - period - 0.001))
        state[i] = [tat, newTat, wait, interval]
        if (cost > limit || wait > maxDelay) {
          reply[0] = 0
          over[i] = true
        } else if (wait > reply[1]!) reply[1] = wait
      }
    }
    if (op === 'r') return reply
    if (reply[0] === 0) reply[1] = 0
    for (let i = 1; i <= n; i++) {
      const b = 3 + (i - 1) * 4 - 1
      const key = keys[i - 1]!
      const limit = Number(argv[b])
      const period = Number(argv[b + 1])
      const cost = Number(argv[b + 2])
      let [tat, newTat, wait, interval] = state[i]!
      let retry = 0
      if (reply[0] === 0 || op !== 'c') {
        const entry = this.read(key, 'gcra', now)
        if (entry && entry.exp === Number.POSITIVE_INFINITY)
          entry.exp = now + Math.max(1, Math.ceil(tat - now))
      }
      if (reply[0] === 1 && op === 'c') {
        tat = newTat
        const entry = this.read(key, 'gcra', now) ?? this.create(key, 'gcra', now)
        entry.n = newTat
        entry.exp = now + Math.max(1, Math.ceil(newTat - now))
      } else if (reply[0] === 0 && wait > 0) retry = wait
      if (cost > limit) retry = Math.max(1, Math.ceil(tat - now))
      reply.push(
        Math.max(0, Math.floor((period - (tat - now)) / interval + 0.000001)),
        Math.ceil(tat - now),
        retry,
        0,
      )
    }
    return reply
  }
}

/** ZADD of one unit: times stay ascending (a clock step back lands where Redis would sort it). */
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
