import { hash } from 'node:crypto'
import { GatewayError } from '../plugins/common/errors.ts'
import { optionChecker, optionKeys } from '../plugins/common/options.ts'
import { randomToken } from '../plugins/common/random-token.ts'
import { type AnyRedisClient, checkRedisClient } from '../redis/client.ts'
import { callScript } from '../redis/scripts.ts'
import { BLOOM_ADD, BLOOM_BEGIN, BLOOM_CHECK, BLOOM_FINISH, type RebuildFailure } from './bloom-scripts.ts'
import { checkedOptions, InvalidArgumentError, shown } from './checks.ts'

// A Bloom filter on plain Redis strings (SETBIT/BITFIELD, no module): "is this id possibly in the
// set?" in a few bits per id. Blocked: an item's hash picks one shard (a string key with a hash tag
// of its own), and all k of its bits lie in that shard, so an item touches one key and a batch one
// call per shard it falls on. It never answers "absent" for an item it was given, even after Redis
// lost data: a shard whose bits are missing, not complete or built for other options answers
// "unknown".
//
// Per shard s, with the hash tag {<key>:<s>}: `<key>:{<key>:<s>}` the bits readers use,
// `...:building` the bits a rebuild is filling, `...:rebuild` the rebuild's state (a small hash).
// The bits start with a 64-bit header: bit 0 set when they went live complete, bit 1 when a rebuild
// created them, bits 8-39 the shape id (a hash of the options' geometry). A rebuild fills
// `building` (adds made meanwhile go to both) and renames it over the live bits, one step per shard.
// docs/bloom.md describes the layout, the hash and the rebuild.

export interface BloomFilterOptions {
  /**
   * Base name of the filter's keys: shard `s` is `<key>:{<key>:<s>}`, next to it `...:rebuild` (its
   * rebuilds' state) and, during a rebuild, `...:building`. No `{` or `}` (each shard gets a hash
   * tag of its own).
   */
  key: string
  /** How many distinct items the filter is sized for (n), 1 to 10^11. */
  expectedItems: number
  /** The false-positive rate wanted at `expectedItems` items (p), from 10^-9 to 0.5, e.g. 0.01. */
  falsePositiveRate: number
  /**
   * The most bits one key holds (its string, the 64-bit header included), 1024 to 2^32. A filter
   * larger than this is split over several keys (shards). Default 2^26 (8 MiB).
   */
  maxBitsPerShard?: number
}

/** What the filter says of an item. */
export type BloomAnswer =
  /** Not in the set: one of its bits is clear. Certain. */
  | 'absent'
  /** Possibly in the set: all its bits are set (a false positive at about the configured rate). */
  | 'maybe'
  /**
   * The item's shard cannot answer: never built, its bits lost (a flush, a restart without
   * persistence), or built for other options. Treat as "maybe", and rebuild.
   */
  | 'unknown'

export interface BloomRebuildOptions {
  /** Items per batch of adds (one script call per shard per batch), 1 to 5000. Default 1000. */
  batchSize?: number
}

export interface BloomRebuildResult {
  /** The rebuild's id (random). */
  generation: string
  /** Items read from the source and added (duplicates included). */
  items: number
}

/** One shard's keys (one hash tag). */
export interface BloomShardKeys {
  /** The bits readers use (a string). */
  bits: string
  /** The bits a rebuild is filling, while one is under way. */
  building: string
  /** The rebuild's state (a small hash). */
  rebuild: string
}

export interface BloomFilter {
  readonly key: string
  /** Bits for items over all shards (m, rounded up to whole bytes per shard). */
  readonly bits: number
  /** Bits set per item (k). */
  readonly hashes: number
  /** How many keys the bits are split over. */
  readonly shards: number
  /** Bytes of the bits over all shards (string payloads; a rebuild holds twice that while it runs). */
  readonly bytes: number
  /** The shard of an item (see docs/bloom.md: the first 4 bytes of its SHA-256, modulo `shards`). */
  shardOf(item: string): number
  /**
   * Adds items: one script call per shard they fall on, all in flight together. Resolves with, per
   * item in order, whether it was new: true when one of its bits was clear (or its shard is not
   * built), false when all were set already (it was added before, or is a false positive).
   */
  add(item: string): Promise<boolean>
  add(items: readonly string[]): Promise<boolean[]>
  /** Per item in order: false only when the item is certainly absent. `unknown` answers true. */
  mightContain(item: string): Promise<boolean>
  mightContain(items: readonly string[]): Promise<boolean[]>
  /** Per item in order: `absent`, `maybe`, or `unknown` when its shard cannot answer (rebuild). */
  check(item: string): Promise<BloomAnswer>
  check(items: readonly string[]): Promise<BloomAnswer[]>
  /** True when every shard is built for these options (none would answer `unknown`). */
  ready(): Promise<boolean>
  /**
   * Builds the filter anew from `source` (every item of the set, e.g. ids read from the database)
   * into fresh bits, then renames them over each shard's live bits in one step. Every shard is
   * marked as being rebuilt before `source` is first read, and adds made meanwhile go to both.
   * Readers use the previous bits (or answer `unknown`) until the switch. Rejects with
   * BloomRebuildError when a later rebuild started since or Redis lost the rebuild's writes.
   */
  rebuild(
    source: AsyncIterable<string> | Iterable<string>,
    options?: BloomRebuildOptions,
  ): Promise<BloomRebuildResult>
  /** The keys of shard `shard` (0 to shards - 1). */
  keys(shard: number): BloomShardKeys
  /** Deletes every key of the filter (for these options' shards). */
  destroy(): Promise<void>
}

/** A rebuild that could not switch every shard; those keep their previous bits (or stay unbuilt). */
export class BloomRebuildError extends GatewayError {
  /** The shards that kept their previous bits (they answer as before the rebuild). */
  readonly shards: readonly number[]
  constructor(
    code: 'FRG_BLOOM_REBUILD_SUPERSEDED' | 'FRG_BLOOM_REBUILD_LOST',
    message: string,
    shards: readonly number[],
  ) {
    super(code, message)
    this.shards = shards
  }
}

/** The most items one call takes. */
export const BLOOM_MAX_BATCH = 5000
/** The longest item (UTF-16 code units, `item.length`). */
export const BLOOM_MAX_ITEM_LENGTH = 1024
/** The most shards a filter has. */
const MAX_SHARDS = 1024
/** Each shard's string starts with a header: bit 0 live and complete, bit 1 made by a rebuild, bits 8-39 the shape id. */
const HEADER_BITS = 64
/** The hash and layout of this version; part of the shape, so another format never reads these bits. */
const FORMAT = 'bloom-v1'

const FILTER_OPTIONS = optionKeys<BloomFilterOptions>({
  key: true,
  expectedItems: true,
  falsePositiveRate: true,
  maxBitsPerShard: true,
})
const REBUILD_OPTIONS = optionKeys<BloomRebuildOptions>({ batchSize: true })

/**
 * The size of a filter: m = ceil(-n ln p / (ln 2)^2) bits and k = round(m / n * ln 2) hashes, split
 * into `shards` keys of `shardBits` item bits each (m / shards rounded up to whole bytes), each key
 * `keyBits` long with its header.
 */
export function bloomSize(expectedItems: number, falsePositiveRate: number, maxBitsPerShard = 2 ** 26) {
  const m = Math.ceil((-expectedItems * Math.log(falsePositiveRate)) / Math.LN2 ** 2)
  const hashes = Math.max(1, Math.round((m / expectedItems) * Math.LN2))
  const perKey = Math.floor(maxBitsPerShard / 8) * 8 - HEADER_BITS
  const shards = Math.ceil(m / perKey)
  /** Item bits per shard: whole bytes. */
  const shardBits = Math.ceil(Math.ceil(m / shards) / 8) * 8
  return { hashes, shards, shardBits, keyBits: shardBits + HEADER_BITS }
}

export function createBloomFilter(client: AnyRedisClient, options: BloomFilterOptions): BloomFilter {
  const redis = checkRedisClient('bloom filter', client)
  const check = optionChecker('bloom filter')
  const {
    key,
    expectedItems,
    falsePositiveRate,
    maxBitsPerShard = 2 ** 26,
  } = checkedOptions(check, options, FILTER_OPTIONS)
  if (typeof key !== 'string' || key === '' || key.length > 200 || /[{}]/.test(key))
    check.fail(`\`key\` must be a string of 1 to 200 characters without { or }, got ${shown(key)}`)
  if (!Number.isSafeInteger(expectedItems) || expectedItems < 1 || expectedItems > 1e11)
    check.fail(`\`expectedItems\` must be an integer from 1 to 10^11, got ${shown(expectedItems)}`)
  if (typeof falsePositiveRate !== 'number' || !(falsePositiveRate >= 1e-9 && falsePositiveRate <= 0.5))
    check.fail(`\`falsePositiveRate\` must be a number from 1e-9 to 0.5, got ${shown(falsePositiveRate)}`)
  if (!Number.isSafeInteger(maxBitsPerShard) || maxBitsPerShard < 1024 || maxBitsPerShard > 2 ** 32)
    check.fail(`\`maxBitsPerShard\` must be an integer from 1024 to 2^32, got ${shown(maxBitsPerShard)}`)
  const { hashes, shards, shardBits, keyBits } = bloomSize(expectedItems, falsePositiveRate, maxBitsPerShard)
  if (shards > MAX_SHARDS)
    check.fail(
      `${expectedItems} items at ${falsePositiveRate} need ${shards} shards of ${maxBitsPerShard} bits, ` +
        `more than ${MAX_SHARDS}: raise \`maxBitsPerShard\``,
    )
  // Bits built for another shape (other options, another format) mean nothing to this filter.
  const shape = `${FORMAT}:${shards}:${keyBits}:${hashes}`
  const shapeId = hash('sha256', shape, 'buffer').readUInt32BE(0)
  const keysOf = (shard: number): BloomShardKeys => {
    const bits = `${key}:{${key}:${shard}}`
    return { bits, building: `${bits}:building`, rebuild: `${bits}:rebuild` }
  }
  const all = Array.from({ length: shards }, (_, shard) => keysOf(shard))

  /** SHA-256 of the item's UTF-8: the shard, then k bit offsets by double hashing. */
  function place(item: string, into: number[]): number {
    const digest = hash('sha256', item, 'buffer')
    const h1 = digest.readUInt32BE(4)
    const step = 1 + (digest.readUInt32BE(8) % (shardBits - 1))
    for (let i = 0; i < hashes; i++) into.push(HEADER_BITS + ((h1 + i * step) % shardBits))
    return digest.readUInt32BE(0) % shards
  }

  function checkItems(input: unknown): string[] {
    const items = typeof input === 'string' ? [input] : input
    if (!Array.isArray(items))
      throw new InvalidArgumentError(`bloom filter: items must be a string or an array, got ${shown(items)}`)
    if (items.length > BLOOM_MAX_BATCH)
      throw new InvalidArgumentError(
        `bloom filter: at most ${BLOOM_MAX_BATCH} items per call, got ${items.length}: split the batch`,
      )
    for (const item of items) checkItem(item)
    return items
  }

  /** Items grouped by shard: each item's k offsets, and its index in the batch. */
  function byShard(items: readonly string[]) {
    const groups = new Map<number, { positions: number[]; at: number[] }>()
    items.forEach((item, at) => {
      const positions: number[] = []
      const shard = place(item, positions)
      let group = groups.get(shard)
      if (!group) {
        group = { positions: [], at: [] }
        groups.set(shard, group)
      }
      for (const position of positions) group.positions.push(position)
      group.at.push(at)
    })
    return [...groups]
  }

  /** Per item of a group, whether all its bits are set; null when the shard cannot answer. */
  const read = (shard: number, positions: number[]) =>
    callScript(
      redis,
      BLOOM_CHECK,
      { bits: all[shard]!.bits },
      { shapeId, hashes, positions: positions.join(' ') },
    )

  async function answers(items: readonly string[]): Promise<BloomAnswer[]> {
    const results = new Array<BloomAnswer>(items.length)
    await Promise.all(
      byShard(items).map(async ([shard, { positions, at }]) => {
        const reply = await read(shard, positions)
        at.forEach((index, i) => {
          results[index] = reply === null ? 'unknown' : reply[i] ? 'maybe' : 'absent'
        })
      }),
    )
    return results
  }

  async function add(input: string | readonly string[]): Promise<boolean | boolean[]> {
    const items = checkItems(input)
    const results = new Array<boolean>(items.length)
    await Promise.all(
      byShard(items).map(async ([shard, { positions, at }]) => {
        const reply = await callScript(redis, BLOOM_ADD, all[shard]!, {
          generation: '',
          shapeId,
          hashes,
          rebuild: 0,
          positions: positions.join(' '),
        })
        // An application's add is never refused as a rebuild's can be.
        const added = 'items' in reply ? reply.items : null
        at.forEach((index, i) => {
          results[index] = added === null || added[i]!
        })
      }),
    )
    return typeof input === 'string' ? results[0]! : results
  }

  async function checkAnswers(input: string | readonly string[]): Promise<BloomAnswer | BloomAnswer[]> {
    const found = await answers(checkItems(input))
    return typeof input === 'string' ? found[0]! : found
  }

  async function mightContain(input: string | readonly string[]): Promise<boolean | boolean[]> {
    const found = (await answers(checkItems(input))).map((answer) => answer !== 'absent')
    return typeof input === 'string' ? found[0]! : found
  }

  async function ready(): Promise<boolean> {
    const replies = await Promise.all(all.map((_, shard) => read(shard, [])))
    return replies.every((reply) => reply !== null)
  }

  async function rebuild(
    source: AsyncIterable<string> | Iterable<string>,
    rebuildOptions: BloomRebuildOptions = {},
  ): Promise<BloomRebuildResult> {
    const { batchSize = 1000 } = checkedOptions(check, rebuildOptions, REBUILD_OPTIONS, 'rebuild')
    if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > BLOOM_MAX_BATCH)
      check.fail(
        `rebuild: \`batchSize\` must be an integer from 1 to ${BLOOM_MAX_BATCH}, got ${shown(batchSize)}`,
      )
    const iterable = source as Partial<AsyncIterable<string> & Iterable<string>> | null
    if (
      typeof source === 'string' ||
      (typeof iterable?.[Symbol.asyncIterator] !== 'function' &&
        typeof iterable?.[Symbol.iterator] !== 'function')
    )
      throw new InvalidArgumentError(
        `bloom filter: rebuild's source must be an iterable of items (e.g. an async generator), got ${shown(source)}`,
      )
    const generation = randomToken(6, 'hex')
    const calls = new Array<number>(shards).fill(0)
    /** Per shard, this rebuild's number there (each shard counts the rebuilds that started on it). */
    let numbers: number[] = []
    const finish = (mode: 'switch' | 'abort') =>
      Promise.all(
        all.map((shardKeys, shard) =>
          callScript(redis, BLOOM_FINISH, shardKeys, {
            generation,
            action: mode,
            calls: calls[shard]!,
            bytes: keyBits / 8,
            rebuild: numbers[shard] ?? 0,
          }),
        ),
      )
    /** The error for the shards whose reply says the rebuild cannot go on. */
    const failure = (
      replies: ReadonlyArray<readonly [number, { failure?: RebuildFailure }]>,
      switched: boolean,
    ) => {
      const failed = replies.filter(([, reply]) => reply.failure)
      if (failed.length === 0) return undefined
      const superseded = failed.some(([, reply]) => reply.failure === 'superseded')
      return new BloomRebuildError(
        superseded ? 'FRG_BLOOM_REBUILD_SUPERSEDED' : 'FRG_BLOOM_REBUILD_LOST',
        `bloom filter '${key}': rebuild ${generation} ${
          superseded
            ? 'was overtaken by a later rebuild of the filter'
            : 'lost writes: Redis dropped its state or some of its adds (a flush, a restart, a failover)'
        }; ${switched ? failed.length : shards} of ${shards} shards kept their previous bits`,
        switched ? failed.map(([shard]) => shard) : all.map((_, shard) => shard),
      )
    }

    numbers = await Promise.all(
      all.map(({ building, rebuild }) =>
        callScript(redis, BLOOM_BEGIN, { building, rebuild }, { generation, shapeId, bits: keyBits, shape }),
      ),
    )
    let count = 0
    try {
      let batch: string[] = []
      const write = async () => {
        const groups = byShard(batch)
        batch = []
        const replies = await Promise.all(
          groups.map(async ([shard, { positions }]) => {
            calls[shard]!++
            const reply = await callScript(redis, BLOOM_ADD, all[shard]!, {
              generation,
              shapeId,
              hashes,
              rebuild: numbers[shard]!,
              positions: positions.join(' '),
            })
            return [shard, 'failure' in reply ? reply : {}] as const
          }),
        )
        const failed = failure(replies, false)
        if (failed) throw failed
      }
      for await (const item of source) {
        checkItem(item)
        batch.push(item)
        count++
        if (batch.length >= batchSize) await write()
      }
      if (batch.length > 0) await write()
    } catch (err) {
      // The bits being built are deleted wherever they are still this rebuild's; no reader saw them.
      await finish('abort').catch(() => {})
      throw err
    }
    const replies = await finish('switch')
    const failed = failure(
      replies.map((reply, shard) => [shard, reply] as const),
      true,
    )
    if (failed) throw failed
    // Fewer shards than the bits replaced: the shards past the new count are dropped.
    const before = Math.max(
      0,
      ...replies.map(({ previousShape }) => Number(previousShape.split(':')[1] ?? 0)),
    )
    if (before > shards)
      await Promise.all(
        Array.from({ length: before - shards }, (_, i) => {
          const dropped = keysOf(shards + i)
          return redis.del(dropped.bits, dropped.building, dropped.rebuild)
        }),
      )
    return { generation, items: count }
  }

  async function destroy(): Promise<void> {
    // One DEL per shard: its three keys share a slot, the shards do not.
    await Promise.all(all.map(({ bits, building, rebuild }) => redis.del(bits, building, rebuild)))
  }

  return {
    key,
    bits: shards * shardBits,
    hashes,
    shards,
    bytes: (shards * keyBits) / 8,
    shardOf: (item) => {
      checkItem(item)
      return place(item, [])
    },
    add: add as BloomFilter['add'],
    mightContain: mightContain as BloomFilter['mightContain'],
    check: checkAnswers as BloomFilter['check'],
    ready,
    rebuild,
    keys: (shard) => {
      if (!Number.isInteger(shard) || shard < 0 || shard >= shards)
        throw new InvalidArgumentError(
          `bloom filter: \`shard\` must be an integer from 0 to ${shards - 1}, got ${shown(shard)}`,
        )
      return keysOf(shard)
    },
    destroy,
  }
}

function checkItem(item: unknown): asserts item is string {
  if (typeof item !== 'string')
    throw new InvalidArgumentError(`bloom filter: an item must be a string, got ${shown(item)}`)
  if (item.length > BLOOM_MAX_ITEM_LENGTH)
    throw new InvalidArgumentError(
      `bloom filter: an item must be at most ${BLOOM_MAX_ITEM_LENGTH} characters, got ${item.length}`,
    )
}
