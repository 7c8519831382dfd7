import { gcra, tokenBucket } from './memory-buckets.ts'
import type { Entry, Keyspace } from './memory-keyspace.ts'
import { concurrency, fixedWindow, slidingCounter, slidingLog } from './memory-windows.ts'
import {
  type Algorithm,
  decodeCall,
  encodeReply,
  type ScriptCall,
  type ScriptReply,
  type WireArgument,
} from './protocol.ts'

/**
 * The rate-limit scripts run in this process: the same calls, the same replies and the same
 * decisions as src/lua/rate-limit-*.lua, on this process's clock instead of Redis's. It serves
 * `store: 'memory'` and, with a share of each limit, the `onRedisError: 'local'` fallback.
 *
 * Each algorithm (memory-windows.ts, memory-buckets.ts) follows its script's general path line by
 * line (the scripts' fast paths are shortcuts that reply the same); this file holds the keys and
 * the blocks every script shares. Keys are bounded: past `maxKeys` the least recently used key is
 * dropped (its client starts afresh), and expired keys are swept as Redis expires them.
 */

/**
 * A key as tests read it, the way they read Redis: the number it holds (a fixed window's count,
 * a token bucket's tokens, a GCRA arrival time), its expiry (writable, as PEXPIRE), a log's times.
 */
export interface InspectedKey {
  readonly n: number
  exp: number
  readonly times: readonly number[] | null
}

/** How often expired keys are swept while nothing else touches them. */
const SWEEP_INTERVAL_MS = 10_000

type AlgorithmAnswer = (keys: Keyspace, call: ScriptCall, now: number, overLimit: boolean[]) => ScriptReply

const ANSWER_OF_ALGORITHM: Record<Algorithm, AlgorithmAnswer> = {
  'fixed-window': fixedWindow,
  'sliding-log': slidingLog,
  concurrency,
  'sliding-counter': slidingCounter,
  'token-bucket': tokenBucket,
  gcra,
}

export class MemoryStore implements Keyspace {
  private readonly map = new Map<string, Entry>()
  maxKeys: number
  private readonly clock: () => number
  private readonly timer: NodeJS.Timeout

  /** `clock`: ms since the epoch; tests pass their own to move time without waiting. */
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
    for (const [key, entry] of this.map) if (entry.expiresAt <= now) this.map.delete(key)
  }

  read(key: string, kind: Entry['kind'], now: number): Entry | undefined {
    const entry = this.map.get(key)
    if (entry === undefined) return undefined
    this.map.delete(key)
    if (entry.expiresAt <= now) return undefined
    this.map.set(key, entry)
    if (entry.kind !== kind)
      throw new Error('WRONGTYPE Operation against a key holding the wrong kind of value')
    return entry
  }

  /** Makes room by dropping expired, then least recently used keys. */
  create(key: string, kind: Entry['kind'], now: number): Entry {
    if (this.map.size >= this.maxKeys) {
      for (const [oldest, entry] of this.map) {
        this.map.delete(oldest)
        if (entry.expiresAt > now || this.map.size < this.maxKeys) break
      }
    }
    const entry: Entry = {
      kind,
      expiresAt: Number.POSITIVE_INFINITY,
      count: 0,
      tokens: 0,
      refilledAt: 0,
      windowIndex: Number.NaN,
      currentCount: 0,
      previousCount: 0,
      arrivalTime: 0,
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
    entry.expiresAt = now + ms
  }

  /** Every live key (tests list them as they would SCAN Redis). */
  keys(): string[] {
    const now = this.clock()
    return [...this.map].filter(([, entry]) => entry.expiresAt > now).map(([key]) => key)
  }

  /** A live key's state (tests look at it as they would at Redis); undefined when missing. */
  inspect(key: string): InspectedKey | undefined {
    const entry = this.map.get(key)
    if (!entry || entry.expiresAt <= this.clock()) return undefined
    const held =
      entry.kind === 'fixed-window'
        ? entry.count
        : entry.kind === 'token-bucket'
          ? entry.tokens
          : entry.kind === 'gcra'
            ? entry.arrivalTime
            : 0
    return {
      n: held,
      get exp() {
        return entry.expiresAt
      },
      set exp(expiresAt: number) {
        entry.expiresAt = expiresAt
      },
      times: entry.times,
    }
  }

  /** Runs the script of `algorithm` on its KEYS and ARGV; returns its reply as Redis would. */
  run(algorithm: Algorithm, keys: readonly string[], argv: readonly WireArgument[]): number[] {
    return encodeReply(this.answer(algorithm, decodeCall(algorithm, keys, argv)))
  }

  /** Answers a call as the script of `algorithm` does (src/lua/include/rate-limit-blocks-*.lua). */
  answer(algorithm: Algorithm, call: ScriptCall): ScriptReply {
    const now = this.clock()
    const requested = call.operation
    /** Policies blocked before this call, with their block's ms left. */
    const blocked = new Map<number, number>()
    if (requested !== 'refund') {
      for (const block of call.blocks) {
        const entry = this.read(block.key, 'block', now)
        if (entry === undefined) continue
        // A block without a TTL would never end: it gets its policy's block time.
        if (entry.expiresAt === Number.POSITIVE_INFINITY) entry.expiresAt = now + block.blockMs
        blocked.set(block.policy, entry.expiresAt - now)
      }
    }
    // A blocked request is only looked at: nothing is counted while any of its policies is blocked.
    const decided = blocked.size > 0 ? { ...call, operation: 'peek' as const } : call
    const overLimit: boolean[] = []
    const reply = ANSWER_OF_ALGORITHM[algorithm](this, decided, now, overLimit)
    if (requested === 'refund') return reply
    for (const block of call.blocks) {
      let ms = blocked.get(block.policy)
      // A policy that went over its limit on a consume starts its block.
      if (ms === undefined && requested === 'consume' && blocked.size === 0 && overLimit[block.policy]) {
        ms = block.blockMs
        const entry = this.read(block.key, 'block', now) ?? this.create(block.key, 'block', now)
        entry.expiresAt = now + ms
      }
      if (ms === undefined) continue
      const policy = reply.policies[block.policy]!
      policy.remaining = 0
      policy.resetMs = Math.max(policy.resetMs, ms)
      policy.retryMs = Math.max(policy.retryMs, ms)
    }
    if (blocked.size > 0) {
      reply.allowed = false
      reply.delayMs = 0
    }
    return reply
  }
}

/**
 * In-process stores are per process for one key space (kind and key prefix): two plugin instances
 * sharing a key prefix share one Redis counter, so they share the in-process one too (the memory
 * store, and the local fallback's share). Released when the last engine using one closes.
 */
const sharedStores = new Map<string, { store: MemoryStore; users: number }>()

/** The store of `id`, shared by the plugins of one key prefix; its clock is the first one's. */
export function acquireStore(id: string, maxKeys: number, clock: () => number = Date.now): MemoryStore {
  let shared = sharedStores.get(id)
  if (!shared) {
    shared = { store: new MemoryStore(maxKeys, clock), users: 0 }
    sharedStores.set(id, shared)
  }
  shared.users++
  shared.store.maxKeys = Math.max(shared.store.maxKeys, maxKeys)
  return shared.store
}

export function releaseStore(id: string): void {
  const shared = sharedStores.get(id)
  if (shared && --shared.users === 0) {
    shared.store.close()
    sharedStores.delete(id)
  }
}

/** The id of the `store: 'memory'` store of a key prefix. */
export const memoryStoreId = (keyPrefix: string) => `memory\0${keyPrefix}`

/** The memory store of a key prefix while an engine uses it (tests look into it as into Redis). */
export function memoryStoreOf(keyPrefix: string): MemoryStore | undefined {
  return sharedStores.get(memoryStoreId(keyPrefix))?.store
}
