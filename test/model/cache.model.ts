import assert from 'node:assert/strict'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import cachePlugin from '../../src/plugins/cache/index.ts'
import type { L1Cache } from '../../src/plugins/cache/l1.ts'
import { signal } from '../plugins/cache/fixtures.ts'
import { interleaveCommands, type ModelCommand, modelTest } from './harness.ts'
import { Advance, type ModelRedis, startModelRedis } from './redis.ts'

// Cache-aside reads on two gateway instances (the cache plugin, each with its own Redis client, L1
// and pub/sub subscriber) in front of a source of truth the model keeps, committed first and then
// invalidated, as the docs ask. A read is a getOrLoad call or a request to a route that prefetches
// its key. Every read must answer the committed value, on either instance, and load from the
// source exactly when nothing fresh is cached for it (in its L1, or in Redis within the entry's
// lifetime on the Redis clock the model moves). Races: a read on one instance against a commit and
// its invalidation (by key, by tag, or a `set`) on either, landing anywhere their Redis commands
// interleave (fc.scheduler), after the loader read the source and before its fill (the race the
// fence is for), or after the route's prefetch and before its handler; afterwards no instance may
// serve what was committed before. Faults: an instance redeployed with its L1 off or on, one Redis key evicted (an entry, a generation, a lease,
// a tag's generation), FLUSHALL, a Redis restart, the subscribers killed (alone, or while a
// write's invalidation is published, which then reaches no L1), the clock moving past entries'
// lifetimes. After every command the model waits for what was published to reach both subscribers
// (a PING on each: the delivery bound) before it checks that no L1 holds anything but the
// committed value.

// The clock moves by multiples of 4 ms and lifetimes are 2 ms off one: no read lands on an entry's
// last millisecond, where it is served while a refresh runs in the background.
const TTL = 10_002
const NEGATIVE_TTL = 2_002
const KEYS = ['acct:1', 'acct:2', 'acct:3', 'acct:4'] as const
type Key = (typeof KEYS)[number]
const TAGS: Record<Key, readonly string[]> = {
  'acct:1': ['cust:1'],
  'acct:2': ['cust:1'],
  'acct:3': ['cust:2'],
  // Untagged: a prefetched read of it is served from the peek.
  'acct:4': [],
}
/** A key's tags as `getOrLoad` and `set` take them (none for an untagged key). */
const tagsOf = (key: Key) => (TAGS[key].length > 0 ? { tags: TAGS[key] } : undefined)
const ALL_TAGS = ['cust:1', 'cust:2'] as const
const STEPS = [4, 500, 1_996, 2_004, 5_000, 9_996, 10_004, 30_000]

/** What a Redis entry of a key is, as far as the model knows: fresh until `expiry`, or not known. */
type Cached = { expiry: number } | 'unknown'

interface Model {
  now: number
  /** The source of truth: a key's committed value, null for "not found". */
  source: Map<Key, number | null>
  /** The last value committed, so every commit writes a new one. */
  written: number
  /** What Redis holds per key (absent: nothing fresh). */
  redis: Map<Key, Cached>
  /** Per instance: the keys its L1 holds for certain ('yes') or may hold ('maybe'); always the committed value. */
  l1: [Map<Key, 'yes' | 'maybe'>, Map<Key, 'yes' | 'maybe'>]
  /** Per instance: whether it runs with an L1 (a redeploy may turn it off or on). */
  l1On: [boolean, boolean]
}

interface Instance {
  app: FastifyInstance
  client: Redis
  /** The L1's subscriber and the L1 itself; none for an instance without an L1. */
  subscriber?: Redis
  l1?: L1Cache
  /** Loader calls. */
  loads: number
  /** For the next request to GET /read/:key: run between its prefetch and its handler, and after its load. */
  hooks: ReadHooks
}

/** What a read needs of an instance (all of it is there before the app is ready). */
type Reader = Pick<Instance, 'app' | 'loads' | 'hooks'>

interface ReadHooks {
  /** Once the loader has read the source, before it returns (before the fill). */
  loaded?: () => Promise<void>
  /** A route read: after the prefetch was sent, before the handler reads (a preHandler). */
  prefetched?: () => Promise<void>
}

interface Real {
  server: ModelRedis
  admin: Redis
  instances: [Instance, Instance]
  source: Map<Key, number | null>
  scheduler: fc.Scheduler | null
}

const cacheOf = (real: Real, i: 0 | 1) => real.instances[i].app.cache

/** `getOrLoad` as a route calls it: the source's value, loaded (and counted) only on a miss. */
function getOrLoad(instance: Reader, source: Map<Key, number | null>, key: Key, hooks: ReadHooks) {
  return instance.app.cache.getOrLoad(
    key,
    async () => {
      instance.loads++
      const value = source.get(key) ?? null
      await hooks.loaded?.()
      return value
    },
    tagsOf(key),
  )
}

/**
 * A read on instance `i`: a `getOrLoad` call, or a request to its route that prefetches the key in
 * onRequest (as the demo's balance route does).
 */
async function read(
  real: Real,
  i: 0 | 1,
  key: Key,
  via: Via = 'call',
  hooks: ReadHooks = {},
): Promise<number | null> {
  const instance = real.instances[i]
  if (via === 'call') return getOrLoad(instance, real.source, key, hooks)
  instance.hooks = hooks
  try {
    const response = await instance.app.inject({ method: 'GET', url: `/read/${key}` })
    assert.equal(response.statusCode, 200, response.body)
    return (response.json() as { value: number | null }).value
  } finally {
    instance.hooks = {}
  }
}

/** Whether a read on instance `i` loads: 0, 1, or either when the model cannot know. */
function expectedLoads(model: Model, i: 0 | 1, key: Key): number[] {
  const inL1 = model.l1[i].get(key)
  if (inL1 === 'yes') return [0]
  const cached = model.redis.get(key)
  let fromRedis: number[]
  if (cached === undefined) fromRedis = [1]
  else if (cached === 'unknown') fromRedis = [0, 1]
  else fromRedis = model.now < cached.expiry ? [0] : [1]
  return inL1 === 'maybe' ? [...new Set([0, ...fromRedis])] : fromRedis
}

/** After a read on `i` that loaded (or not): what Redis and that instance's L1 now hold. */
function afterRead(model: Model, i: 0 | 1, key: Key, loaded: boolean): void {
  if (loaded) {
    const ttl = model.source.get(key) === null ? NEGATIVE_TTL : TTL
    model.redis.set(key, { expiry: model.now + ttl })
  }
  keeps(model, i, key, 'yes')
}

/** What instance `i`'s L1 now holds of `key`, if it has an L1. */
function keeps(model: Model, i: 0 | 1, key: Key, held: 'yes' | 'maybe'): void {
  if (model.l1On[i]) model.l1[i].set(key, held)
}

/** A commit of a new value (or a deletion) to the source, in the model and the real source. */
function commit(model: Model, real: Real, key: Key, deleted: boolean): number | null {
  const value = deleted ? null : ++model.written
  model.source.set(key, value)
  real.source.set(key, value)
  return value
}

/** Waits until every subscriber has received everything published so far (a PING on each). */
async function settle(real: Real): Promise<void> {
  await Promise.all(real.instances.map((instance) => instance.subscriber?.ping()))
}

/**
 * Runs `fault`, which drops both subscribers, and waits until each has subscribed again and its L1
 * serves (the plugin clears an L1 when its SUBSCRIBE is confirmed).
 */
async function dropSubscribers(real: Real, fault: () => Promise<void>): Promise<void> {
  const dropped = real.instances.map(
    ({ subscriber }) => subscriber && new Promise((resolve) => subscriber.once('close', resolve)),
  )
  await fault()
  await Promise.all(dropped)
  for (let waited = 0; !real.instances.every(serves); waited += 5) {
    if (waited > 10_000) throw new Error('the L1 subscribers did not subscribe again within 10 s')
    await sleep(5)
  }
}

type Via = 'call' | 'route'

class Read implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly key: Key,
    readonly via: Via,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const before = real.instances[this.instance].loads
    const value = await read(real, this.instance, this.key, this.via)
    const loads = real.instances[this.instance].loads - before
    assert.equal(
      value,
      model.source.get(this.key),
      `${this.key} read on ${this.instance} answers the committed value`,
    )
    const expected = expectedLoads(model, this.instance, this.key)
    assert.ok(
      expected.includes(loads),
      `${this.key} loaded ${loads} times on ${this.instance}, expected ${expected}`,
    )
    afterRead(model, this.instance, this.key, loads === 1)
  }
  toString = () => `read(${this.instance}, ${this.key}, ${this.via})`
}

/**
 * A commit on one instance, then the cache told of it: `invalidate([key])`, or `set(key, value)`
 * with the key's tags (the entry then holds the new value).
 */
class Write implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly key: Key,
    readonly deleted: boolean,
    readonly how: 'invalidate' | 'set',
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const value = commit(model, real, this.key, this.deleted)
    const cache = cacheOf(real, this.instance)
    if (this.how === 'invalidate') {
      assert.equal(await cache.invalidate([this.key]), true)
      model.redis.delete(this.key)
    } else {
      assert.equal(await cache.set(this.key, value, tagsOf(this.key)), true)
      model.redis.set(this.key, { expiry: model.now + (value === null ? NEGATIVE_TTL : TTL) })
    }
    for (const l1 of model.l1) l1.delete(this.key)
  }
  toString = () => `${this.how}(${this.instance}, ${this.key}${this.deleted ? ', null' : ''})`
}

/** A commit of every key of a tag, then `invalidateTags([tag])` on one instance. */
class WriteTag implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly tag: string,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const keys = KEYS.filter((key) => TAGS[key].includes(this.tag))
    for (const key of keys) commit(model, real, key, false)
    assert.equal(await cacheOf(real, this.instance).invalidateTags([this.tag]), true)
    for (const key of keys) {
      model.redis.delete(key)
      for (const l1 of model.l1) l1.delete(key)
    }
  }
  toString = () => `writeTag(${this.instance}, ${this.tag})`
}

type RaceWrite = 'invalidate' | 'set' | 'tag'
/**
 * Where the commit and its invalidation land in the read: anywhere its Redis commands and the
 * writer's interleave (`free`), after the loader has read the source and before its fill
 * (`after-load`: the stale-fill race the fence is there for), or, on the route, after its prefetch
 * was sent and before its handler reads (`after-prefetch`).
 */
type RacePoint = 'free' | 'after-load' | 'after-prefetch'

/**
 * A read on `reader` and a commit with its invalidation on `writer`, at once. The read answers the
 * value before or after the commit; what either instance serves afterwards is the committed one.
 */
class Race implements ModelCommand<Model, Real> {
  constructor(
    readonly reader: 0 | 1,
    readonly via: Via,
    readonly writer: 0 | 1,
    readonly key: Key,
    readonly write: RaceWrite,
    readonly point: RacePoint,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const before = model.source.get(this.key)
    const tag = TAGS[this.key][0]
    const keys = this.write === 'tag' ? KEYS.filter((key) => tag && TAGS[key].includes(tag)) : [this.key]
    const cache = cacheOf(real, this.writer)
    const reached = signal()
    const written = signal()
    const hold = async () => {
      reached.resolve()
      await written.promise
    }
    const reading = read(real, this.reader, this.key, this.via, {
      loaded: this.point === 'after-load' ? hold : undefined,
      prefetched: this.point === 'after-prefetch' ? hold : undefined,
    })
    const writing = (async () => {
      // At its point in the read, or once the read is over if it never got there (no load).
      if (this.point !== 'free') await Promise.race([reached.promise, reading])
      const values = keys.map((key) => commit(model, real, key, false))
      const done =
        this.write === 'invalidate'
          ? await cache.invalidate([this.key])
          : this.write === 'set'
            ? await cache.set(this.key, values[0], tagsOf(this.key))
            : await cache.invalidateTags([tag!])
      written.resolve()
      return done
    })()
    const [value, ok] = await Promise.all([reading, writing])
    assert.equal(ok, true)
    const after = model.source.get(this.key)
    assert.ok(
      value === before || value === after,
      `the racing read answers ${value}: neither ${before} nor ${after}`,
    )
    for (const key of keys) {
      model.redis.set(key, 'unknown')
      for (const l1 of model.l1) l1.delete(key)
    }
    // The reader's L1 may hold the committed value now (a read that began after the drop keeps what it read).
    keeps(model, this.reader, this.key, 'maybe')
    // The writer's own L1 has dropped the old value before its call resolved: a read there now,
    // before any message arrives, answers the committed value.
    assert.equal(
      await read(real, this.writer, this.key, this.via),
      after,
      `a read on the writer ${this.writer} right after`,
    )
    keeps(model, this.writer, this.key, 'maybe')
  }
  toString = () =>
    `race(read on ${this.reader} by ${this.via}, ${this.write} ${this.key} on ${this.writer}, ${this.point})`
}

/**
 * One instance redeployed with its L1 turned off or on (a rolling deploy, a fleet with mixed
 * settings): its L1 starts empty; every other instance's L1 must still hear of its writes.
 */
class Redeploy implements ModelCommand<Model, Real> {
  constructor(readonly instance: 0 | 1) {}
  check = () => true
  async run(model: Model, real: Real) {
    const old = real.instances[this.instance]
    await old.app.close()
    old.client.disconnect()
    const l1On = !model.l1On[this.instance]
    real.instances[this.instance] = await startInstance(real.server, real.scheduler, real.source, l1On, true)
    model.l1On[this.instance] = l1On
    model.l1[this.instance].clear()
  }
  toString = () => `redeploy(${this.instance})`
}

/**
 * One Redis key evicted, as a cache Redis with an eviction policy does: a key's entry (`v`), its
 * generation (`g`) or its lease (`l`), or a tag's generation. It may cost a load, never a stale value.
 */
class Evict implements ModelCommand<Model, Real> {
  constructor(
    readonly key: Key,
    readonly part: 'v' | 'g' | 'l' | 'tag',
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const tag = TAGS[this.key][0]
    if (this.part !== 'tag') await real.admin.del(`mc:{${this.key}}:${this.part}`)
    else if (tag) await real.admin.del(`mc:{${tag}}:t`)
    if (this.part === 'v') model.redis.delete(this.key)
    // Entries recorded under the tag's old generation no longer match it: reloaded, or not yet.
    if (this.part === 'tag' && tag)
      for (const key of KEYS)
        if (TAGS[key].includes(tag) && model.redis.has(key)) model.redis.set(key, 'unknown')
  }
  toString = () => `evict(${this.key}, ${this.part})`
}

/** FLUSHALL: every entry, generation, tag and lease in Redis is gone; the L1s keep what they hold (still current). */
class FlushAll implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await real.server.flushAll()
    model.redis.clear()
  }
  toString = () => 'flushAll()'
}

/** A Redis crash and restart: Redis loses everything, both subscribers drop and subscribe again (L1s cleared). */
class Restart implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await dropSubscribers(real, () => real.server.restart())
    model.redis.clear()
    for (const l1 of model.l1) l1.clear()
  }
  toString = () => 'restart()'
}

/**
 * Both subscriber connections killed on the server (CLIENT KILL TYPE pubsub), optionally with a
 * write committed and invalidated right after: its message reaches no L1, which must not serve the
 * old value once it can serve again (each is cleared when it subscribes again).
 */
class KillSubscribers implements ModelCommand<Model, Real> {
  constructor(readonly write: { instance: 0 | 1; key: Key } | null) {}
  check = () => true
  async run(model: Model, real: Real) {
    await dropSubscribers(real, async () => {
      await real.admin.call('CLIENT', 'KILL', 'TYPE', 'pubsub')
      if (!this.write) return
      commit(model, real, this.write.key, false)
      assert.equal(await cacheOf(real, this.write.instance).invalidate([this.write.key]), true)
      model.redis.delete(this.write.key)
    })
    for (const l1 of model.l1) l1.clear()
  }
  toString = () =>
    `killSubscribers(${this.write ? `then write(${this.write.instance}, ${this.write.key})` : ''})`
}

let shared: Promise<ModelRedis> | undefined
after(async () => (await shared)?.stop())

/** One gateway instance: a Fastify app with the cache plugin on a client of its own (through the scheduler). */
async function startInstance(
  server: ModelRedis,
  scheduler: fc.Scheduler | null,
  source: Map<Key, number | null>,
  l1On: boolean,
  inCommand = false,
): Promise<Instance> {
  const client = await server.client()
  // The plugin's subscriber is a duplicate of the client: kept, to PING it and to see it drop.
  let subscriber: Redis | undefined
  const duplicate = client.duplicate.bind(client)
  client.duplicate = ((...args: Parameters<Redis['duplicate']>) => {
    subscriber = duplicate(...args)
    return subscriber
  }) as Redis['duplicate']
  if (scheduler) interleaveCommands(client, scheduler)
  const app = Fastify({ logger: false })
  const reader: Reader = { app, loads: 0, hooks: {} }
  const booting = (async () => {
    await app.register(cachePlugin, {
      redis: client,
      keyPrefix: 'mc:',
      ttlMs: TTL,
      jitter: 0,
      negativeTtlMs: NEGATIVE_TTL,
      l1TtlMs: l1On ? 600_000 : 0,
    })
    // The demo's balance route, in small: the key read in onRequest, then by the handler.
    app.get<{ Params: { key: Key } }>(
      '/read/:key',
      {
        config: { cache: { prefetch: (request) => (request.params as { key: string }).key } },
        preHandler: async () => await reader.hooks.prefetched?.(),
      },
      async (request) => ({ value: await getOrLoad(reader, source, request.params.key, reader.hooks) }),
    )
    await app.ready()
  })()
  // Within a command (a redeploy) the command's own wait releases the scheduled steps.
  await (scheduler && !inCommand ? scheduler.waitFor(booting) : booting)
  const l1 = (app.cache as unknown as { parts: { l1?: L1Cache } }).parts.l1
  const instance: Instance = Object.assign(reader, { client, subscriber, l1 })
  // An L1 serves once its SUBSCRIBE is confirmed (and is cleared then).
  for (let waited = 0; !serves(instance); waited += 5) {
    if (waited > 10_000) throw new Error('the L1 subscriber did not subscribe within 10 s')
    await sleep(5)
  }
  return instance
}

const instance = fc.constantFrom<0 | 1>(0, 1)
const key = fc.constantFrom(...KEYS)
const via = fc.constantFrom<Via>('call', 'route')
const race = fc
  .tuple(
    instance,
    via,
    instance,
    key,
    fc.constantFrom<RaceWrite>('invalidate', 'set', 'tag'),
    fc.constantFrom<RacePoint>('free', 'after-load', 'after-prefetch'),
  )
  .map(
    ([r, v, w, k, how, point]) =>
      new Race(
        r,
        point === 'after-prefetch' ? 'route' : v,
        w,
        k,
        how === 'tag' && TAGS[k].length === 0 ? 'invalidate' : how,
        point,
      ),
  )

modelTest<Model, Real>({
  name: 'cache',
  // The race that found invalidate's missing second drop takes about 150 runs to come up.
  runs: 250,
  maxCommands: 40,
  scheduled: true,
  commands: [
    fc.tuple(instance, key, via).map(([i, k, v]) => new Read(i, k, v)),
    fc.tuple(instance, key, via).map(([i, k, v]) => new Read(i, k, v)),
    fc.tuple(instance, key, via).map(([i, k, v]) => new Read(i, k, v)),
    fc.tuple(instance, key, fc.boolean()).map(([i, k, d]) => new Write(i, k, d, 'invalidate')),
    fc.tuple(instance, key, fc.boolean()).map(([i, k, d]) => new Write(i, k, d, 'set')),
    fc.tuple(instance, fc.constantFrom(...ALL_TAGS)).map(([i, t]) => new WriteTag(i, t)),
    race,
    race,
    fc.constantFrom(...STEPS).map((ms) => new Advance<Model, Real>(ms)),
    fc
      .tuple(key, fc.constantFrom<'v' | 'g' | 'l' | 'tag'>('v', 'g', 'l', 'tag'))
      .map(([k, part]) => new Evict(k, part)),
    instance.map((i) => new Redeploy(i)),
    fc.constant(new FlushAll()),
    fc.constant(new Restart()),
    fc.option(fc.record({ instance, key }), { nil: null }).map((write) => new KillSubscribers(write)),
  ],
  async setup(scheduler) {
    // One server for every run (starting one per run was most of the model's time), emptied first.
    shared ??= startModelRedis()
    const server = await shared
    await server.flushAll()
    const admin = await server.client()
    const source = new Map<Key, number | null>(KEYS.map((k, n) => [k, n === 2 ? null : n + 1]))
    const instances: Real['instances'] = [
      await startInstance(server, scheduler, source, true),
      await startInstance(server, scheduler, source, true),
    ]
    return {
      model: {
        now: server.clock.now(),
        source: new Map(source),
        written: KEYS.length,
        redis: new Map(),
        l1: [new Map(), new Map()],
        l1On: [true, true],
      },
      real: { server, admin, instances, source, scheduler },
    }
  },
  async teardown(real) {
    for (const instance of real.instances) {
      await instance.app.close()
      instance.client.disconnect()
    }
    real.admin.disconnect()
  },
  async invariant(model, real) {
    // The bound: what a command published has reached both L1s before the next command.
    await settle(real)
    // Nothing an L1 holds is older than the committed value.
    for (const [i, instance] of real.instances.entries()) {
      for (const key of KEYS) {
        const held = instance.l1?.get(key)
        if (held !== undefined)
          assert.equal(held.value, model.source.get(key), `L1 ${i} holds ${key} at the committed value`)
      }
    }
  },
})

/** Whether the instance's L1 serves (subscribed, connection ready). */
function serves(instance: Instance): boolean {
  return !instance.l1 || (instance.l1 as unknown as { coherent: () => boolean }).coherent()
}
