import { type OptionChecker, optionChecker, optionKeys } from '../plugins/common/options.ts'
import { type AnyRedisClient, checkRedisClient, isCluster } from '../redis/client.ts'
import { callScript, defineScript, integer } from '../redis/scripts.ts'
import { checkedOptions, InvalidArgumentError, shown } from './checks.ts'

// A counter split over N keys, so that no single key takes every write: one key lives on one Redis
// (one CPU; one master of a Cluster), N shards with their own hash tags spread over the masters.
// Writes go to one shard each; a read asks every shard in one round trip and sums.

export interface ShardedCounterOptions {
  /**
   * The key of shard `shard` (0 to shards - 1): its counts (a hash); its distinct members and counted
   * ids are `<key>:distinct` and `<key>:ids`. Give each shard a hash tag of its own, e.g.
   * `(shard) => \`hits:{2026-12-01:${shard}}\``, so a Redis Cluster spreads the shards over its slots.
   */
  key: (shard: number) => string
  /** How many shards, 1 to 1024. Default 16. */
  shards?: number
  /** Lifetime of a shard's keys, renewed by every add to that shard. Default none. */
  ttlMs?: number
}

/** One thing counted, e.g. one event. */
export interface ShardedCounterItem {
  /** Integers added to named counts, e.g. `{ transfers: 1, 'volume:VND': 50000 }`. */
  counts?: Record<string, number>
  /**
   * A member of the distinct count (e.g. a customer id). It picks the shard, so each member lives on
   * one shard only and the shards' distinct counts add up.
   */
  member?: string
  /**
   * Counted at most once per id (a redelivered event adds nothing). Picks the shard when there is no
   * `member`; one id must always come with the same member. Without either, the shard is random.
   */
  id?: string
}

export interface ShardedCounterTotals {
  /** Every count's sum over the shards: exact integers, saturating at +-(2^53 - 1). */
  counts: Record<string, number>
  /** Distinct members over the shards (HyperLogLog estimates: 0.81 % standard error). */
  distinct: number
}

export interface ShardedCounter {
  readonly shards: number
  /** The shard of a member or id (FNV-1a of its UTF-16 code units, modulo `shards`). */
  shardOf(value: string): number
  /** The keys of one shard. */
  keys(shard: number): { counts: string; distinct: string; ids: string }
  /**
   * Adds items, one script call per shard they fall on (all in flight together), each shard's
   * items atomically with their ids. Resolves with how many were counted now (not counted before).
   */
  add(items: ShardedCounterItem | readonly ShardedCounterItem[]): Promise<number>
  /** The totals: every shard read in one round trip (a pipeline; on a Cluster, one command per shard at once). */
  read(): Promise<ShardedCounterTotals>
}

const MAX = BigInt(Number.MAX_SAFE_INTEGER)
const clamp = (value: bigint) => Number(value > MAX ? MAX : value < -MAX ? -MAX : value)

/** 32-bit FNV-1a: cheap, stable across processes and versions. */
function fnv1a(value: string): number {
  let hash = 0x811c9dc5
  for (let i = 0; i < value.length; i++) {
    hash ^= value.charCodeAt(i)
    hash = Math.imul(hash, 0x01000193)
  }
  return hash >>> 0
}

const COUNTER_OPTIONS = optionKeys<ShardedCounterOptions>({ key: true, shards: true, ttlMs: true })
const ITEM_KEYS = optionKeys<ShardedCounterItem>({ counts: true, member: true, id: true })

function checkItem(check: OptionChecker, item: ShardedCounterItem): void {
  // A misspelt key (`count:`) would count nothing, in silence.
  checkedOptions(check, item, ITEM_KEYS, 'add: item')
  for (const [field, amount] of Object.entries(item.counts ?? {})) {
    if (field === '' || !Number.isSafeInteger(amount))
      throw new InvalidArgumentError(
        `sharded counter: count '${field}' must be named and a safe integer, got ${shown(amount)}`,
      )
  }
  if (item.member === '' || item.id === '')
    throw new InvalidArgumentError('sharded counter: `member` and `id` must be non-empty when given')
}

const SHARD_ADD = defineScript({
  name: 'shardedCounterAdd',
  keys: ['counts', 'distinct', 'ids'],
  /** items: per item its id, member, n, and n field/amount pairs. */
  args: ['ttlMs', '...items'],
  /** How many items were counted now. */
  reply: integer,
})

export function createShardedCounter(client: AnyRedisClient, options: ShardedCounterOptions): ShardedCounter {
  const redis = checkRedisClient('sharded counter', client)
  const check = optionChecker('sharded counter')
  const { key, shards = 16, ttlMs = 0 } = checkedOptions(check, options, COUNTER_OPTIONS)
  if (typeof key !== 'function') check.fail(`\`key\` must be a function of the shard, got ${shown(key)}`)
  if (!Number.isInteger(shards) || shards < 1 || shards > 1024)
    check.fail(`\`shards\` must be an integer from 1 to 1024, got ${shown(shards)}`)
  if (!Number.isInteger(ttlMs) || ttlMs < 0)
    check.fail(`\`ttlMs\` must be a non-negative integer, got ${shown(ttlMs)}`)

  const keys = (shard: number) => {
    const counts = key(shard)
    return { counts, distinct: `${counts}:distinct`, ids: `${counts}:ids` }
  }
  const shardOf = (value: string) => fnv1a(value) % shards

  async function add(input: ShardedCounterItem | readonly ShardedCounterItem[]): Promise<number> {
    const items: readonly ShardedCounterItem[] = Array.isArray(input) ? input : [input as ShardedCounterItem]
    const byShard = new Map<number, Array<string | number>>()
    for (const item of items) {
      checkItem(check, item)
      const by = item.member ?? item.id
      const shard = by === undefined ? Math.floor(Math.random() * shards) : shardOf(by)
      const args = byShard.get(shard) ?? []
      const counts = Object.entries(item.counts ?? {})
      args.push(item.id ?? '', item.member ?? '', counts.length, ...counts.flat())
      byShard.set(shard, args)
    }
    const counted = await Promise.all(
      [...byShard].map(([shard, items]) => callScript(redis, SHARD_ADD, keys(shard), { ttlMs, items })),
    )
    return counted.reduce((sum, n) => sum + n, 0)
  }

  async function read(): Promise<ShardedCounterTotals> {
    const all = Array.from({ length: shards }, (_, shard) => keys(shard))
    let hashes: Array<Record<string, string>>
    let distincts: number[]
    if (isCluster(redis)) {
      // A Cluster pipeline must stay on one node and the shards are on several: each command goes
      // alone, all of them in flight together (still one round trip of latency).
      ;[hashes, distincts] = await Promise.all([
        Promise.all(all.map((k) => redis.hgetall(k.counts))),
        Promise.all(all.map((k) => redis.pfcount(k.distinct))),
      ])
    } else {
      const pipeline = redis.pipeline()
      for (const k of all) pipeline.hgetall(k.counts).pfcount(k.distinct)
      const replies = (await pipeline.exec()) ?? []
      const failed = replies.find(([err]) => err)
      if (failed) throw failed[0]
      hashes = replies.filter((_, i) => i % 2 === 0).map(([, hash]) => hash as Record<string, string>)
      distincts = replies.filter((_, i) => i % 2 === 1).map(([, n]) => Number(n))
    }
    // Summed as BigInt: exact whatever the shards hold, then clamped to what a number holds exactly.
    const sums = new Map<string, bigint>()
    for (const hash of hashes) {
      for (const [field, value] of Object.entries(hash))
        sums.set(field, (sums.get(field) ?? 0n) + BigInt(value))
    }
    const counts: Record<string, number> = {}
    for (const [field, sum] of sums) counts[field] = clamp(sum)
    return { counts, distinct: distincts.reduce((sum, n) => sum + n, 0) }
  }

  return { shards, shardOf, keys, add, read }
}
