import { hash } from 'node:crypto'
import { type RedisClient, runScript } from '../lua/index.ts'
import { GatewayError } from '../plugins/common/errors.ts'
import { optionChecker, optionKeys } from '../plugins/common/options.ts'
import { randomToken } from '../plugins/common/random-token.ts'
import { checkedOptions, checkRedisClient, InvalidArgumentError, shown } from './checks.ts'

// A Bloom filter on plain Redis strings (SETBIT/BITFIELD, no module): "is this id possibly in the
// set?" in a few bits per id. Blocked: an item's hash picks one shard (a string key with a hash tag
// of its own), and all k of its bits lie in that shard, so an item touches one key and a batch one
// script call per shard it falls on. It never answers "absent" for an item it was given, even after
// Redis lost data: a shard whose bits are gone, never built or half rebuilt answers "unknown".
//
// Per shard s, the head `<key>:{<key>:<s>}` is a small hash naming the live generation (the bits
// readers use) and, during a rebuild, the one being built; a generation's bits are the string
// `<head>:<generation>`, same hash tag, so each script runs on one Cluster slot. Bit 0 of the bits
// is set when the generation went live complete, bit 1 when a rebuild created it; the item bits
// follow, from bit 8. docs/bloom.md describes the layout, the hash and the rebuild.

export interface BloomFilterOptions {
  /**
   * Base name of the filter's keys: shard `s` has the head `<key>:{<key>:<s>}` and its bits
   * `<key>:{<key>:<s>}:<generation>`. No `{` or `}` (each shard gets a hash tag of its own).
   */
  key: string
  /** How many distinct items the filter is sized for (n), 1 to 10^11. */
  expectedItems: number
  /** The false-positive rate wanted at `expectedItems` items (p), from 10^-9 to 0.5, e.g. 0.01. */
  falsePositiveRate: number
  /**
   * The most bits one key holds (its string, header byte included), 1024 to 2^32. A filter larger
   * than this is split over several keys (shards). Default 2^26 (8 MiB).
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
  /** The new generation's id (in the names of its keys). */
  generation: string
  /** Items read from the source and added (duplicates included). */
  items: number
}

/** One shard's keys as Redis holds them now. */
export interface BloomShardKeys {
  shard: number
  /** The head: a hash naming the live generation and the one being built. */
  head: string
  /** The bits readers use, or null when the shard is not built. */
  live: string | null
  /** The bits a rebuild is filling, or null. */
  building: string | null
}

export interface BloomFilter {
  readonly key: string
  /** Bits for items over all shards (m, rounded up to whole bytes per shard). */
  readonly bits: number
  /** Bits set per item (k). */
  readonly hashes: number
  /** How many keys the bits are split over. */
  readonly shards: number
  /** Bytes of one generation in Redis string payloads, over all shards (a rebuild holds two). */
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
   * Builds a new generation from `source` (every item of the set, e.g. ids read from the
   * database), then switches each shard to it in one step and deletes the old one. Every shard is
   * marked as being rebuilt before `source` is first read: adds made meanwhile go to both
   * generations. Readers use the old generation (or answer `unknown`) until the switch. Rejects
   * with BloomRebuildError when another rebuild started since or Redis lost the rebuild's writes.
   */
  rebuild(
    source: AsyncIterable<string> | Iterable<string>,
    options?: BloomRebuildOptions,
  ): Promise<BloomRebuildResult>
  /** Every shard's keys (one call per shard). */
  inspect(): Promise<BloomShardKeys[]>
  /** Deletes every key of the filter (for these options' shards). */
  destroy(): Promise<void>
}

/** A rebuild that could not switch every shard; those keep their previous generation (or stay unbuilt). */
export class BloomRebuildError extends GatewayError {
  /** The shards that kept their previous generation (they answer as before the rebuild). */
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
/** The first 8 bits of each shard's string are its header (bit 0: live and complete; bit 1: made by a rebuild). */
const HEADER_BITS = 8
/** The hash and layout of this version; part of the shape, so another format never reads these bits. */
const FORMAT = 'bloom-v1'

const FILTER_OPTIONS = optionKeys<BloomFilterOptions>({
  key: true,
  expectedItems: true,
  falsePositiveRate: true,
  maxBitsPerShard: true,
})
const REBUILD_OPTIONS = optionKeys<BloomRebuildOptions>({ batchSize: true })

/** The size of a filter: m = ceil(-n ln p / (ln 2)^2) bits, k = round(m / n * ln 2) hashes, split in shards. */
export function bloomSize(expectedItems: number, falsePositiveRate: number, maxBitsPerShard = 2 ** 26) {
  const m = Math.ceil((-expectedItems * Math.log(falsePositiveRate)) / Math.LN2 ** 2)
  const hashes = Math.max(1, Math.round((m / expectedItems) * Math.LN2))
  const perKey = Math.floor(maxBitsPerShard / 8) * 8 - HEADER_BITS
  const shards = Math.ceil(m / perKey)
  /** Item bits per shard: whole bytes. */
  const shardBits = Math.ceil(Math.ceil(m / shards) / 8) * 8
  return { hashes, shards, shardBits, keyBits: shardBits + HEADER_BITS }
}

export function createBloomFilter(redis: RedisClient, options: BloomFilterOptions): BloomFilter {
  checkRedisClient('bloom filter', redis)
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
  // Bits of another shape (other options, another format) mean nothing to this filter.
  const shape = `${FORMAT}:${shards}:${keyBits}:${hashes}`
  const heads = Array.from({ length: shards }, (_, shard) => `${key}:{${key}:${shard}}`)
  const all = Array.from({ length: shards }, (_, shard) => shard)

  /** SHA-256 of the item's UTF-8: the shard, then k bit offsets by double hashing. */
  function place(item: string, into: Array<string | number>): number {
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

  /** Items grouped by shard: each shard's script arguments (after `head`) and the items' indexes. */
  function byShard(items: readonly string[], head: Array<string | number>) {
    const groups = new Map<number, { args: Array<string | number>; at: number[] }>()
    const positions: number[] = []
    items.forEach((item, at) => {
      positions.length = 0
      const shard = place(item, positions)
      let group = groups.get(shard)
      if (!group) {
        group = { args: [...head], at: [] }
        groups.set(shard, group)
      }
      for (const position of positions) group.args.push(position)
      group.at.push(at)
    })
    return groups
  }

  /** One script call per shard, all in flight together; each reply spread back to its items. */
  async function perShard<T>(
    script: string,
    items: readonly string[],
    head: Array<string | number>,
    answer: (reply: string | null, offset: number) => T,
  ): Promise<T[]> {
    const results = new Array<T>(items.length)
    await Promise.all(
      [...byShard(items, head)].map(async ([shard, { args, at }]) => {
        const reply = await runScript<string | null>(redis, script, [heads[shard]!], args)
        at.forEach((index, offset) => {
          results[index] = answer(reply, offset)
        })
      }),
    )
    return results
  }

  async function add(input: string | readonly string[]): Promise<boolean | boolean[]> {
    const items = checkItems(input)
    const added = await perShard('bloomAdd', items, ['', shape, hashes, 0], (reply, i) =>
      reply === null ? true : reply[i] === '1',
    )
    return typeof input === 'string' ? added[0]! : added
  }

  async function answers(items: readonly string[]): Promise<BloomAnswer[]> {
    return perShard('bloomCheck', items, [shape, hashes], (reply, i) =>
      reply === null ? 'unknown' : reply[i] === '1' ? 'maybe' : 'absent',
    )
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
    const replies = await Promise.all(
      heads.map((head) => runScript<string | null>(redis, 'bloomCheck', [head], [shape, hashes])),
    )
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
    /** Per shard, this rebuild's number there (the shard counts the rebuilds that started). */
    let numbers: number[] = []
    const finish = (mode: 'switch' | 'abort') =>
      Promise.all(
        all.map((shard) =>
          runScript<string | number>(
            redis,
            'bloomFinish',
            [heads[shard]!],
            [generation, mode, calls[shard]!, keyBits / 8, numbers[shard] ?? 0],
          ),
        ),
      )
    /** The error for the shards whose reply says the rebuild cannot go on (-1: overtaken, -2: writes lost). */
    const failure = (replies: ReadonlyArray<readonly [number, string | number]>, switched: boolean) => {
      const failed = replies.filter(([, reply]) => typeof reply === 'number' && reply < 0)
      if (failed.length === 0) return undefined
      const superseded = failed.some(([, reply]) => reply === -1)
      return new BloomRebuildError(
        superseded ? 'FRG_BLOOM_REBUILD_SUPERSEDED' : 'FRG_BLOOM_REBUILD_LOST',
        `bloom filter '${key}': rebuild ${generation} ${
          superseded
            ? 'was overtaken by a later rebuild of the filter'
            : 'lost writes: Redis dropped its state or some of its adds (a flush, a restart, a failover)'
        }; ${switched ? failed.length : shards} of ${shards} shards kept their previous generation`,
        switched ? failed.map(([shard]) => shard) : all,
      )
    }

    numbers = await Promise.all(
      heads.map((head) => runScript<number>(redis, 'bloomBegin', [head], [generation, shape, keyBits])),
    )
    let count = 0
    try {
      let batch: string[] = []
      const write = async () => {
        const groups = [...byShard(batch, [generation, shape, hashes, 0])]
        batch = []
        const replies = await Promise.all(
          groups.map(async ([shard, { args }]) => {
            calls[shard]!++
            args[3] = numbers[shard]!
            return [
              shard,
              await runScript<string | number>(redis, 'bloomAdd', [heads[shard]!], args),
            ] as const
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
      // The generation is deleted wherever it is still the one being built; readers never saw it.
      await finish('abort').catch(() => {})
      throw err
    }
    const replies = await finish('switch')
    const failed = failure(
      replies.map((reply, shard) => [shard, reply] as const),
      true,
    )
    if (failed) throw failed
    // Fewer shards than the generation replaced: the shards past the new count are dropped.
    const before = Math.max(
      0,
      ...replies.map((shapeBefore) => Number(String(shapeBefore).split(':')[1] ?? 0)),
    )
    if (before > shards)
      await Promise.all(
        Array.from({ length: before - shards }, (_, i) =>
          runScript(redis, 'bloomDrop', [`${key}:{${key}:${shards + i}}`]),
        ),
      )
    return { generation, items: count }
  }

  async function inspect(): Promise<BloomShardKeys[]> {
    const replies = await Promise.all(heads.map((head) => redis.hmget(head, 'live', 'building')))
    return replies.map(([live, building], shard) => {
      const head = heads[shard]!
      return {
        shard,
        head,
        live: live ? `${head}:${live}` : null,
        building: building ? `${head}:${building}` : null,
      }
    })
  }

  async function destroy(): Promise<void> {
    await Promise.all(heads.map((head) => runScript(redis, 'bloomDrop', [head])))
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
    inspect,
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
