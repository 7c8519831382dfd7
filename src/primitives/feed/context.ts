import { randomBytes } from 'node:crypto'
import { isCluster, type RedisClient } from '../../redis/client.ts'
import { hashSlot } from '../../redis/keys.ts'
import { shown } from '../checks.ts'
import { FeedSourceError } from './errors.ts'
import { newestFirst } from './items.ts'
import { type FeedSettings, isId } from './options.ts'
import type { FeedItem, ProducerKeys, ReaderKeys } from './types.ts'

// What every part of a feed shares: the client, the settings, the key layout, how keys are grouped
// into script calls, and the application's answers, checked.

/** Keys per script call on one Redis: Redis serves nobody else while a script runs. */
export const KEYS_PER_CALL = 500

export interface FeedContext {
  redis: RedisClient
  settings: FeedSettings
  /** The hash tag of a reader's keys, and of a producer's. */
  readerTag(reader: string): string
  producerTag(producer: string): string
  readerKeys(reader: string): ReaderKeys
  producerKeys(producer: string): ProducerKeys
  /** The fan-out stream. */
  fanoutStream: string
  /** The loss token every built feed records; a new one makes each feed rebuild at its next read. */
  lossToken(): Promise<string>
  /**
   * Producers whose meta a script just created: one the feed knew before lost its keys (one node
   * of a Cluster losing its data), its followers set with them, so its next items would reach no
   * feed. Then every feed is rebuilt at its next read.
   */
  noteCreated(producers: readonly string[]): Promise<void>
  /** Producers' keys were found lost: every feed is rebuilt at its next read. */
  noteLost(): Promise<void>
  /** Mode arguments of the producer scripts: the threshold, the grace after going pulled, the stickiness after going pushed. */
  modeArgs: { pushMaxFollowers: number; graceMs: number; stickyMs: number }
  /**
   * `values` in the groups one script call may take: one per hash slot on a Cluster (a script's keys
   * share a slot), at most `perCall` each on one Redis.
   */
  scriptGroups<T>(values: readonly T[], tagOf: (value: T) => string, perCall: number): T[][]
  /** The application's answers, checked: a wrong one fails loudly instead of corrupting a feed. */
  source: CheckedSource
}

export interface CheckedSource {
  following(reader: string): Promise<string[]>
  counts(producers: readonly string[]): Promise<number[]>
  /** The newest `limit` items of `producers`, newest first. */
  items(producers: readonly string[], limit: number): Promise<FeedItem[]>
}

export function createFeedContext(redis: RedisClient, settings: FeedSettings): FeedContext {
  const { keyPrefix, pushMaxFollowers, markActiveEveryMs, activeWindowMs } = settings
  const cluster = isCluster(redis)
  const readerTag = (reader: string) => `r:${reader}`
  const producerTag = (producer: string) => `p:${producer}`
  const readerKeys = (reader: string): ReaderKeys => {
    const base = `${keyPrefix}{${readerTag(reader)}}`
    return {
      feed: `${base}:feed`,
      following: `${base}:following`,
      pulled: `${base}:pulled`,
      meta: `${base}:meta`,
    }
  }
  const producerKeys = (producer: string): ProducerKeys => {
    const base = `${keyPrefix}{${producerTag(producer)}}`
    return {
      timeline: `${base}:timeline`,
      followers: `${base}:followers`,
      meta: `${base}:meta`,
      deleted: `${base}:deleted`,
    }
  }
  function scriptGroups<T>(values: readonly T[], tagOf: (value: T) => string, perCall: number): T[][] {
    const bySlot = new Map<number, T[]>()
    for (const value of values) {
      const slot = cluster ? hashSlot(tagOf(value)) : 0
      const group = bySlot.get(slot)
      if (group) group.push(value)
      else bySlot.set(slot, [value])
    }
    const groups: T[][] = []
    for (const group of bySlot.values())
      for (let i = 0; i < group.length; i += perCall) groups.push(group.slice(i, i + perCall))
    return groups
  }

  const lossKey = `${keyPrefix}{losses}`
  const knownKey = `${keyPrefix}{losses}:producers`
  const noteLost = async () => {
    await redis.set(lossKey, `${settings.now()}-${randomBytes(6).toString('hex')}`)
  }

  return {
    redis,
    settings,
    lossToken: async () => (await redis.get(lossKey)) ?? '',
    async noteCreated(producers) {
      if (producers.length === 0) return
      const added = await redis.sadd(knownKey, ...producers)
      if (added < new Set(producers).size) await noteLost()
    },
    noteLost,
    readerTag,
    producerTag,
    readerKeys,
    producerKeys,
    fanoutStream: `${keyPrefix}{fanout}`,
    modeArgs: { pushMaxFollowers, graceMs: markActiveEveryMs, stickyMs: activeWindowMs },
    scriptGroups,
    source: checkedSource(settings),
  }
}

function checkedSource({ source, maxFollowing }: FeedSettings): CheckedSource {
  return {
    async following(reader) {
      const list = await source.followingOf(reader)
      if (!Array.isArray(list))
        throw new FeedSourceError(`followingOf('${reader}') must resolve with an array`)
      const unique = [...new Set<unknown>(list)]
      const bad = unique.find((producer) => !isId(producer))
      if (bad !== undefined)
        throw new FeedSourceError(`followingOf('${reader}') answered a bad id: ${shown(bad)}`)
      if (unique.length > maxFollowing)
        throw new FeedSourceError(
          `followingOf('${reader}') answered ${unique.length} producers, above maxFollowing`,
        )
      return unique as string[]
    },

    async counts(producers) {
      const counts = await source.followerCountsOf(producers)
      if (!Array.isArray(counts) || counts.length !== producers.length)
        throw new FeedSourceError(
          `followerCountsOf must resolve with one count per producer (${producers.length})`,
        )
      for (const count of counts)
        if (!Number.isSafeInteger(count) || count < 0)
          throw new FeedSourceError(
            `followerCountsOf answered a count that is not a whole number: ${shown(count)}`,
          )
      return counts as number[]
    },

    async items(producers, limit) {
      const items = await source.itemsOf(producers, { limit })
      if (!Array.isArray(items)) throw new FeedSourceError('itemsOf must resolve with an array of items')
      const asked = new Set(producers)
      for (const item of items as unknown[]) {
        const { id, producer, at } = (item ?? {}) as Partial<FeedItem>
        if (!isId(id) || !isId(producer) || !Number.isSafeInteger(at) || (at as number) < 0)
          throw new FeedSourceError(
            `itemsOf answered an item that is not { id, producer, at }: ${shown(item)}`,
          )
        if (!asked.has(producer))
          throw new FeedSourceError(`itemsOf answered an item of '${producer}', not asked for`)
      }
      // The newest `limit`, whatever order came.
      return [...(items as FeedItem[])].sort(newestFirst).slice(0, limit)
    },
  }
}

/** Runs `fn` once per key at a time: callers asking while it runs share its promise. */
export function singleFlight<T>(fn: (key: string) => Promise<T>): (key: string) => Promise<T> {
  const running = new Map<string, Promise<T>>()
  return (key) => {
    let promise = running.get(key)
    if (!promise) {
      promise = fn(key).finally(() => running.delete(key))
      running.set(key, promise)
    }
    return promise
  }
}
