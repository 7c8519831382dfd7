import { isCluster, type RedisClient } from '../../redis/client.ts'
import { callScript } from '../../redis/scripts.ts'
import { randomToken } from '../common/random-token.ts'
import type { GetReply } from './entry.ts'
import { CacheUnavailableError } from './errors.ts'
import { CACHE_FILL, CACHE_GET, CACHE_INVALIDATE, CACHE_RELEASE, CACHE_SET } from './scripts.ts'
import type { CacheSettings } from './types.ts'

/** A lease owner or a generation: random, so that no later one can equal it. */
export const token = () => randomToken(12)

/** Entries per invalidation script call: a long list must not hold Redis in one script. */
const INVALIDATE_CHUNK = 100

function chunks<T>(list: readonly T[], size: number): T[][] {
  const out: T[][] = []
  for (let i = 0; i < list.length; i += size) out.push(list.slice(i, i + size))
  return out
}

/** One read's own arguments to cache-get.lua: the same again when the read asks a second time. */
export interface GetAttempt {
  /** The token this read takes the lease with. */
  readonly owner: string
  /** XFetch's random number in (0, 1]. */
  readonly draw: number
  /** The generation the script creates for a key that has none. */
  readonly newGeneration: string
}

/** What cache-fill.lua stores, and what fences it. */
export interface EntryFill {
  /** The generation read before loading. */
  readonly generation: string
  /** The lease this fill releases ('' when it loaded without the lease). */
  readonly owner: string
  readonly softMs: number
  readonly hardMs: number
  /** How long the load took (XFetch's delta). */
  readonly loadMs: number
  readonly payload: string
  /** "tag=generation,..." of the entry's tags, read before loading; undefined for an untagged entry. */
  readonly recorded: string | undefined
}

/** What cache-set.lua stores. */
export interface EntryWrite {
  readonly softMs: number
  readonly hardMs: number
  readonly payload: string
  /** "tag=generation,..." of the entry's tags ('' for an entry without tags). */
  readonly recorded: string
}

/**
 * The entries in Redis: each is three keys in one slot (the logical key is their hash tag), its
 * value, its generation (the fence) and its fill lease, read and written by the cache-*.lua scripts.
 */
export class EntryStore {
  constructor(
    readonly redis: RedisClient,
    private readonly settings: CacheSettings,
    /** Outlives any value and any load; its expiry only costs a refused fill, never a stale one. */
    readonly generationTtlMs: number,
  ) {}

  private keys(key: string): { value: string; generation: string; lease: string } {
    const base = `${this.settings.keyPrefix}{${key}}`
    return { value: `${base}:v`, generation: `${base}:g`, lease: `${base}:l` }
  }

  /** Commands fail at once while disconnected (no offline queue); skipping them saves the error. */
  up(): boolean {
    return this.redis.status === 'ready'
  }

  /** Throws CacheUnavailableError while Redis is not ready. */
  requireUp(): void {
    if (!this.up()) throw new CacheUnavailableError(this.redis.status)
  }

  /** The entry as stored (see `peekEntry`), with a plain GET. */
  raw(key: string): Promise<string | null> {
    return this.redis.get(this.keys(key).value)
  }

  /**
   * cache-get.lua: the entry, and the lease when it must be (re)loaded. `currentTags`, the current
   * "tag=generation,..." of the read's tags, makes an entry that recorded other generations absent.
   */
  get(key: string, attempt: GetAttempt, currentTags?: string): Promise<GetReply> {
    const { settings } = this
    return callScript(this.redis, CACHE_GET, this.keys(key), {
      owner: attempt.owner,
      leaseTtlMs: settings.leaseTtlMs,
      beta: settings.earlyRefreshBeta,
      draw: attempt.draw,
      generationTtlMs: this.generationTtlMs,
      newGeneration: attempt.newGeneration,
      currentTags: currentTags === undefined ? [] : [currentTags],
    })
  }

  /** cache-fill.lua: true when stored, false when an invalidation since the read fenced it off. */
  async fill(key: string, fill: EntryFill): Promise<boolean> {
    const reply = await callScript(this.redis, CACHE_FILL, this.keys(key), {
      generation: this.settings.fence ? fill.generation : '',
      owner: fill.owner,
      softMs: fill.softMs,
      hardMs: fill.hardMs,
      loadMs: fill.loadMs,
      payload: fill.payload,
      generationTtlMs: this.generationTtlMs,
      recorded: fill.recorded ? [fill.recorded] : [],
    })
    return reply === 'stored'
  }

  /** Gives up this caller's lease, if it still holds it; never rejects (an expired lease is gone anyway). */
  release(key: string, owner: string): Promise<void> {
    return callScript(this.redis, CACHE_RELEASE, this.keys(key), { owner }).then(
      () => {},
      () => {},
    )
  }

  /** cache-set.lua: a new generation (fencing off older fills), then the value. */
  async set(key: string, write: EntryWrite): Promise<void> {
    await callScript(this.redis, CACHE_SET, this.keys(key), {
      generation: token(),
      generationTtlMs: this.generationTtlMs,
      softMs: write.softMs,
      hardMs: write.hardMs,
      payload: write.payload,
      recorded: write.recorded,
    })
  }

  /** cache-invalidate.lua: drops the entries and gives each a new generation. */
  async invalidate(keys: readonly string[]): Promise<void> {
    // Each entry is a slot of its own on a Cluster; one Redis takes them all in one script call.
    const calls = isCluster(this.redis) ? keys.map((key) => [key]) : chunks(keys, INVALIDATE_CHUNK)
    const generation = token()
    await Promise.all(
      calls.map((entries) =>
        callScript(
          this.redis,
          CACHE_INVALIDATE,
          {
            entries: entries.flatMap((key) => {
              const entry = this.keys(key)
              return [entry.value, entry.generation, entry.lease]
            }),
          },
          { generation, generationTtlMs: this.generationTtlMs },
        ),
      ),
    )
  }
}
