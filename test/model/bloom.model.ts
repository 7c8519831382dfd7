import assert from 'node:assert/strict'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import {
  BLOOM_MAX_BATCH,
  type BloomAnswer,
  type BloomFilter,
  BloomRebuildError,
  createBloomFilter,
  InvalidArgumentError,
} from '../../src/index.ts'
import { hashSlot } from '../../src/redis/keys.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { dataLosses, type ModelRedis, startModelRedis } from './redis.ts'

// The Bloom filter (src/primitives/bloom.ts, docs/bloom.md) against a model of what it promises:
// an item it was given answers "maybe" while its shard's bits live; a shard whose bits Redis lost
// answers "unknown" (never "absent") until a rebuild, and an add to it writes nothing; a rebuild
// holds what its source gave plus the adds made while it ran; a rebuild that loses writes or is
// overtaken keeps each shard it did not switch as it was. Items never given may answer "absent"
// or "maybe" (a false positive). Faults: FLUSHALL, one shard's slot lost, a Redis restart, each
// also in the middle of a rebuild, and a second rebuild overtaking one.

/** The items the model reads after every command, and those a bulk add brings. */
const ITEMS = Array.from({ length: 40 }, (_, i) => `i${i}`)
const BULK = Array.from({ length: BLOOM_MAX_BATCH }, (_, i) => `b${i}`)
const SAMPLED = [...ITEMS, 'b0', 'b1', `b${BLOOM_MAX_BATCH / 2}`, `b${BLOOM_MAX_BATCH - 1}`]

interface Model {
  /** The set the application holds: what a rebuild reads. */
  source: Set<string>
  /** Per shard, the items its live bits were given (meaningless while the shard is lost). */
  given: Array<Set<string>>
  /** Shards whose bits Redis lost since their last switch. */
  lost: Set<number>
}

interface Real {
  redis: Redis
  server: ModelRedis
  filter: BloomFilter
}

let server: ModelRedis | undefined
let run = 0
after(() => server?.stop())

const shardOf = (real: Real, item: string) => real.filter.shardOf(item)

/** What one shard holds after a rebuild switched it: its source items and the adds made meanwhile. */
function switched(real: Real, model: Model, items: Iterable<string>, shards: readonly number[]) {
  for (const shard of shards) {
    model.given[shard] = new Set([...items].filter((item) => shardOf(real, item) === shard))
    model.lost.delete(shard)
  }
}

/** An application's add: to the set, and to the live bits of every shard that has them. */
function added(real: Real, model: Model, items: readonly string[]) {
  for (const item of items) {
    model.source.add(item)
    const shard = shardOf(real, item)
    if (!model.lost.has(shard)) model.given[shard]!.add(item)
  }
}

/** Shards whose keys live in the slot of shard `shard`'s hash tag (itself, and any that share it). */
function shardsInSlotOf(real: Real, shard: number): number[] {
  const slot = hashSlot(`${real.filter.key}:${shard}`)
  return Array.from({ length: real.filter.shards }, (_, s) => s).filter(
    (s) => hashSlot(`${real.filter.key}:${s}`) === slot,
  )
}

class Add implements ModelCommand<Model, Real> {
  constructor(readonly items: string[]) {}
  check = () => true
  async run(model: Model, real: Real) {
    const fresh = await real.filter.add(this.items)
    // Given before and live: not new. Its shard lost: new (nothing could be compared).
    this.items.forEach((item, i) => {
      const shard = shardOf(real, item)
      if (model.lost.has(shard)) assert.equal(fresh[i], true, `${item} in a lost shard`)
      else if (model.given[shard]!.has(item)) assert.equal(fresh[i], false, `${item} added before`)
    })
    added(real, model, this.items)
  }
  toString = () => `add(${this.items.join(',')})`
}

class BulkAdd implements ModelCommand<Model, Real> {
  constructor(readonly oversized: boolean) {}
  check = () => true
  async run(model: Model, real: Real) {
    if (this.oversized) {
      // More than one call takes: refused before anything is sent.
      await assert.rejects(real.filter.add([...BULK, 'b-extra']), InvalidArgumentError)
      return
    }
    await real.filter.add(BULK)
    added(real, model, BULK)
  }
  toString = () => `bulkAdd(${this.oversized ? BLOOM_MAX_BATCH + 1 : BLOOM_MAX_BATCH})`
}

class Remove implements ModelCommand<Model, Real> {
  constructor(readonly item: string) {}
  check = (model: Readonly<Model>) => model.source.has(this.item)
  async run(model: Model) {
    // Gone from the set only: the filter keeps answering "maybe" until a rebuild.
    model.source.delete(this.item)
  }
  toString = () => `remove(${this.item})`
}

class Has implements ModelCommand<Model, Real> {
  constructor(readonly item: string) {}
  check = () => true
  async run(model: Model, real: Real) {
    const answer = await real.filter.check(this.item)
    assert.ok(allowed(real, model, this.item).includes(answer), `${this.item}: ${answer}`)
    assert.equal(await real.filter.mightContain(this.item), answer !== 'absent')
  }
  toString = () => `has(${this.item})`
}

type Midway =
  | { kind: 'none' }
  | { kind: 'flushAll' }
  | { kind: 'dropSlot'; shard: number }
  | { kind: 'add'; item: string }
  | { kind: 'rebuild' }

/** A rebuild from the set; `midway` happens when half of the source has been read. */
class Rebuild implements ModelCommand<Model, Real> {
  constructor(readonly midway: Midway) {}
  check = () => true
  async run(model: Model, real: Real) {
    const items = [...model.source]
    const meanwhile: string[] = []
    const shards = real.filter.shards
    let later: { items: string[] } | null = null
    const midway = this.midway
    async function* source() {
      for (let i = 0; i <= items.length; i++) {
        if (i === Math.floor(items.length / 2)) {
          if (midway.kind === 'flushAll') {
            await real.server.flushAll()
            for (let s = 0; s < shards; s++) model.lost.add(s)
          } else if (midway.kind === 'dropSlot') {
            const dropped = midway.shard % shards
            await real.server.dropSlot(`${real.filter.key}:${dropped}`)
            for (const s of shardsInSlotOf(real, dropped)) model.lost.add(s)
          } else if (midway.kind === 'add') {
            await real.filter.add(midway.item)
            added(real, model, [midway.item])
            meanwhile.push(midway.item)
          } else if (midway.kind === 'rebuild') {
            const second = [...model.source]
            await real.filter.rebuild(second, { batchSize: Math.max(7, Math.ceil(second.length / 8)) })
            switched(real, model, second, [...Array(shards).keys()])
            later = { items: second }
          }
        }
        if (i < items.length) yield items[i]!
      }
    }
    let outcome: unknown
    try {
      await real.filter.rebuild(source(), { batchSize: Math.max(7, Math.ceil(items.length / 8)) })
    } catch (err) {
      outcome = err
    }
    const all = [...Array(shards).keys()]
    if (outcome === undefined) {
      assert.ok(
        midway.kind === 'none' || midway.kind === 'add',
        `a rebuild with ${midway.kind} midway went live`,
      )
      switched(real, model, [...items, ...meanwhile], all)
      return
    }
    assert.ok(outcome instanceof BloomRebuildError, `rebuild rejected with ${String(outcome)}`)
    const expected = midway.kind === 'rebuild' ? 'FRG_BLOOM_REBUILD_SUPERSEDED' : 'FRG_BLOOM_REBUILD_LOST'
    assert.equal(outcome.code, expected)
    assert.ok(midway.kind !== 'none' && midway.kind !== 'add', `a rebuild with ${midway.kind} midway failed`)
    // The shards it did not switch kept their bits (lost ones stay lost); the others went live.
    const kept = new Set(outcome.shards)
    if (midway.kind !== 'rebuild' || later === null)
      switched(
        real,
        model,
        [...items, ...meanwhile],
        all.filter((s) => !kept.has(s)),
      )
    if (midway.kind === 'flushAll') assert.equal(kept.size, shards, 'a flush leaves no shard to switch')
  }
  toString = () =>
    `rebuild(${this.midway.kind === 'none' ? '' : `${this.midway.kind}${'shard' in this.midway ? ` ${this.midway.shard}` : ''}${'item' in this.midway ? ` ${this.midway.item}` : ''} midway`})`
}

class DropSlot implements ModelCommand<Model, Real> {
  constructor(readonly shard: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    const shard = this.shard % real.filter.shards
    await real.server.dropSlot(`${real.filter.key}:${shard}`)
    for (const s of shardsInSlotOf(real, shard)) model.lost.add(s)
  }
  toString = () => `dropSlot(${this.shard})`
}

/** What the filter may answer for `item`. */
function allowed(real: Real, model: Model, item: string): BloomAnswer[] {
  const shard = shardOf(real, item)
  if (model.lost.has(shard)) return ['unknown']
  return model.given[shard]!.has(item) ? ['maybe'] : ['absent', 'maybe']
}

const item = fc.constantFrom(...ITEMS)
const shard = fc.nat({ max: 7 })

modelTest<Model, Real>({
  name: 'bloom',
  runs: 20,
  maxCommands: 25,
  commands: [
    fc.array(item, { minLength: 1, maxLength: 5 }).map((items) => new Add(items)),
    fc.array(item, { minLength: 1, maxLength: 5 }).map((items) => new Add(items)),
    fc.boolean().map((oversized) => new BulkAdd(oversized)),
    item.map((i) => new Remove(i)),
    item.map((i) => new Has(i)),
    fc.constant(new Rebuild({ kind: 'none' })),
    fc
      .oneof(
        fc.constant<Midway>({ kind: 'flushAll' }),
        shard.map<Midway>((s) => ({ kind: 'dropSlot', shard: s })),
        item.map<Midway>((i) => ({ kind: 'add', item: i })),
        fc.constant<Midway>({ kind: 'rebuild' }),
      )
      .map((midway) => new Rebuild(midway)),
    ...dataLosses<Model, Real>((model, real) => {
      for (let s = 0; s < real.filter.shards; s++) model.lost.add(s)
    }),
    shard.map((s) => new DropSlot(s)),
  ],
  async setup() {
    server ??= await startModelRedis()
    await server.flushAll()
    const redis = await server.client()
    // Sized so that a bulk add fills it to half: "absent" stays common. Small shards: several keys.
    const filter = createBloomFilter(redis, {
      key: `bloom${run++}`,
      expectedItems: 10_000,
      falsePositiveRate: 0.01,
      maxBitsPerShard: 2 ** 15,
    })
    const given = Array.from({ length: filter.shards }, () => new Set<string>())
    // Never built: every shard answers "unknown" until the first rebuild.
    const lost = new Set(given.keys())
    return { model: { source: new Set(), given, lost }, real: { redis, server, filter } }
  },
  async teardown(real) {
    real.redis.disconnect()
  },
  async invariant(model, real) {
    const answers = await real.filter.check(SAMPLED)
    SAMPLED.forEach((item, i) => {
      assert.ok(
        allowed(real, model, item).includes(answers[i]!),
        `${item} (shard ${shardOf(real, item)}) answered ${answers[i]}, the model allows ${allowed(real, model, item)}`,
      )
    })
    assert.equal(await real.filter.ready(), model.lost.size === 0, 'ready()')
  },
})
