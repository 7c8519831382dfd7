import type { Algorithm } from './protocol.ts'

// The memory store's keys as its algorithms (memory-windows.ts, memory-buckets.ts) read and write
// them; memory.ts holds them.

/** What a key holds; each algorithm uses its own fields, the others stay at their start values. */
export interface Entry {
  /** Which script's data the key holds; another script on it fails as WRONGTYPE would. */
  kind: Algorithm | 'block'
  /** Expiry time in ms since the epoch (Infinity: no TTL, as a key Redis holds without one). */
  expiresAt: number
  /** Fixed window: requests counted in the window (a rejections key: rejections counted). */
  count: number
  /** Token bucket: tokens at `refilledAt`. */
  tokens: number
  refilledAt: number
  /** Sliding counter: the current window's index (NaN: none), its count and the previous one's. */
  windowIndex: number
  currentCount: number
  previousCount: number
  /** GCRA: the theoretical arrival time. */
  arrivalTime: number
  /** Sliding log: unit times ascending, and the nonce each unit was added under. */
  times: number[] | null
  nonces: string[] | null
}

/** The keys as an algorithm reads and writes them. */
export interface Keyspace {
  /** A live entry (most recently used from now on), or undefined; `kind` is checked like a Redis type. */
  read(key: string, kind: Entry['kind'], now: number): Entry | undefined
  /** A new entry without a TTL. */
  create(key: string, kind: Entry['kind'], now: number): Entry
  delete(keys: readonly string[]): void
}
