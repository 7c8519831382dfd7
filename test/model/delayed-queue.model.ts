import assert from 'node:assert/strict'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { createDelayedQueue, type DelayedQueue } from '../../src/primitives/delayed-queue.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { dataLosses, MODEL_EPOCH_MS, type ModelRedis, startModelRedis } from './redis.ts'

// The delayed queue against a plain model on a Redis whose clock the model moves. Two instances
// ('a' and 'b', stable ids; b's own clock 1.5 s ahead of Redis's) schedule, cancel, move, take,
// consume, ack, nack, heartbeat, run the watchdog, adopt, stop (and stop again), and crash and come
// back under the same id; faults: FLUSHALL and a Redis restart. No timers run (start() is never called): every background step is a command, so
// a run replays exactly.
//
// The model holds where each entry is: an instance's delayed set (id -> due time), the ready list,
// an instance's processing list (with its take time). An entry goes back to ready only the ways the
// docs allow a second delivery: the watchdog after the visibility timeout, adoption of an instance
// whose heartbeat is gone, a stop's hand-back, a nack. After every command the real lists and sets
// must hold the model's entries: nothing lost while Redis keeps its data, nothing extra (an item
// delivered twice other than those ways). A take must hand out an entry the model has ready, and
// never one before its due time.

const INSTANCES = ['a', 'b'] as const
type Instance = (typeof INSTANCES)[number]
const IDS = ['j1', 'j2', 'j3', 'j4'] as const
const VISIBILITY_MS = 1000
const HEARTBEAT_TTL_MS = 3000
const BATCH = 2
/** How far each instance's own clock is ahead of the Redis clock. */
const CLOCK_AHEAD_MS: Record<'a' | 'b', number> = { a: 0, b: 1500 }

interface ReadyEntry {
  id: string
  due: number
}

interface Model {
  now: number
  registered: Set<Instance>
  /** Heartbeat key's expiry (Redis ms); present while now <= it. */
  heartbeat: Map<Instance, number>
  delayed: Record<Instance, Map<string, number>>
  ready: ReadyEntry[]
  processing: Record<Instance, ReadyEntry[]>
  /** Latest take time per id, per instance (the watchdog's clock). */
  taken: Record<Instance, Map<string, number>>
}

interface Real {
  server: ModelRedis
  admin: Redis
  queues: Record<Instance, DelayedQueue>
  clients: Record<Instance, Redis>
}

const PREFIX = 'mdq:'
let shared: { server: ModelRedis; admin: Redis; clients: Record<Instance, Redis> } | undefined
after(async () => {
  await shared?.server.stop()
})

const newQueue = (client: Redis, instanceId: Instance) =>
  createDelayedQueue(client, {
    name: 'jobs',
    instanceId,
    keyPrefix: PREFIX,
    visibilityTimeoutMs: VISIBILITY_MS,
    heartbeatTtlMs: HEARTBEAT_TTL_MS,
    batch: BATCH,
  })

const alive = (model: Model, instance: Instance) => {
  const until = model.heartbeat.get(instance)
  return until !== undefined && model.now <= until
}

/** Removes one occurrence of `id` from a processing list, and its take time when none is left. */
function unTake(model: Model, instance: Instance, id: string): ReadyEntry | undefined {
  const list = model.processing[instance]
  const at = list.findIndex((entry) => entry.id === id)
  if (at < 0) return undefined
  const [entry] = list.splice(at, 1)
  if (!list.some((e) => e.id === id)) model.taken[instance].delete(id)
  return entry
}

/** ZADD LT: a new member is added, an existing one keeps the earlier time. */
function addEarlier(set: Map<string, number>, id: string, due: number) {
  const current = set.get(id)
  if (current === undefined || due < current) set.set(id, due)
}

class Schedule implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: Instance,
    readonly id: string,
    readonly inMs: number,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    // Due times are epoch ms of the producer's clock, which for 'b' runs ahead of Redis's: its items
    // are due by that much later on the Redis clock, and never run before the time it passed.
    const due = model.now + CLOCK_AHEAD_MS[this.instance] + this.inMs
    const queue = real.queues[this.instance]
    const added = await (this.instance === 'b'
      ? queue.schedule(this.id, new Date(due))
      : queue.schedule(this.id, due))
    model.registered.add(this.instance)
    const set = model.delayed[this.instance]
    // ZADD NX: an id already in this instance's set keeps its first due time.
    assert.equal(added, !set.has(this.id))
    if (added) set.set(this.id, due)
  }
  toString = () => `schedule(${this.instance}, ${this.id}, now+${this.inMs})`
}

class Remove implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: Instance,
    readonly id: string,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const removed = await real.queues[this.instance].remove(this.id)
    let count = model.ready.filter((entry) => entry.id === this.id).length
    model.ready = model.ready.filter((entry) => entry.id !== this.id)
    for (const instance of new Set([...model.registered, this.instance]))
      if (model.delayed[instance].delete(this.id)) count++
    assert.equal(removed, count > 0)
  }
  toString = () => `remove(${this.instance}, ${this.id})`
}

class Move implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(model: Model, real: Real) {
    const moved = await real.queues[this.instance].move()
    const set = model.delayed[this.instance]
    const due = [...set]
      .filter(([, at]) => at <= model.now)
      .sort(([i1, a1], [i2, a2]) => a1 - a2 || (i1 < i2 ? -1 : 1))
      .slice(0, BATCH)
    for (const [id, at] of due) {
      set.delete(id)
      model.ready.push({ id, due: at })
    }
    assert.equal(moved, due.length)
  }
  toString = () => `move(${this.instance})`
}

class Take implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(model: Model, real: Real) {
    const id = await real.queues[this.instance].take()
    if (model.ready.length === 0) {
      assert.equal(id, null, 'took an id the model has not made ready')
      return
    }
    assert.ok(id !== null, 'nothing taken while the model has ready ids')
    const at = model.ready.findIndex((entry) => entry.id === id)
    assert.ok(at >= 0, `took ${id}, which the model has not made ready`)
    const [entry] = model.ready.splice(at, 1)
    assert.ok(entry!.due <= model.now, `${id} delivered before its due time`)
    model.processing[this.instance].push(entry!)
    model.taken[this.instance].set(id, model.now)
    model.registered.add(this.instance)
  }
  toString = () => `take(${this.instance})`
}

/**
 * A consumer handles one item: its handler stops the consumer as it runs (so no second take
 * follows), and succeeds (the id is acknowledged) or throws (nacked, due again 700 ms later).
 */
class ConsumeOne implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: Instance,
    readonly fails: boolean,
  ) {}
  check = (model: Readonly<Model>) => model.ready.length > 0
  async run(model: Model, real: Real) {
    let handled: string | undefined
    let stopped: Promise<void> | undefined
    await new Promise<void>((resolve, reject) => {
      const consumer = real.queues[this.instance].consume(
        (id) => {
          handled = id
          stopped = consumer.stop()
          stopped.then(resolve, reject)
          if (this.fails) throw new Error('handler failed')
        },
        { pollMs: 5, retryDelayMs: () => 700 },
      )
    })
    await stopped
    assert.ok(handled !== undefined)
    const at = model.ready.findIndex((entry) => entry.id === handled)
    assert.ok(at >= 0, `consumed ${handled}, which the model has not made ready`)
    const [entry] = model.ready.splice(at, 1)
    assert.ok(entry!.due <= model.now, `${handled} delivered before its due time`)
    if (this.fails) {
      model.registered.add(this.instance)
      addEarlier(model.delayed[this.instance], handled, model.now + 700)
    }
    // The take registered the instance too.
    model.registered.add(this.instance)
  }
  toString = () => `consumeOne(${this.instance}, ${this.fails ? 'fails' : 'succeeds'})`
}

class Ack implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: Instance,
    readonly id: string,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const acked = await real.queues[this.instance].ack(this.id)
    assert.equal(acked, unTake(model, this.instance, this.id) !== undefined)
  }
  toString = () => `ack(${this.instance}, ${this.id})`
}

class Nack implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: Instance,
    readonly id: string,
    readonly delayMs: number,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const nacked = await real.queues[this.instance].nack(this.id, this.delayMs)
    const entry = unTake(model, this.instance, this.id)
    assert.equal(nacked, entry !== undefined)
    if (!entry) return
    model.registered.add(this.instance)
    addEarlier(model.delayed[this.instance], this.id, model.now + this.delayMs)
  }
  toString = () => `nack(${this.instance}, ${this.id}, ${this.delayMs})`
}

/** The watchdog of one instance, over every registered instance. */
class ReturnStuck implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(model: Model, real: Real) {
    const returned = await real.queues[this.instance].returnStuck()
    let expected = 0
    for (const instance of new Set([...model.registered, this.instance])) {
      for (const [id, at] of [...model.taken[instance]]) {
        if (at > model.now - VISIBILITY_MS) continue
        const copies = model.processing[instance].filter((entry) => entry.id === id)
        model.processing[instance] = model.processing[instance].filter((entry) => entry.id !== id)
        model.ready.push(...copies)
        model.taken[instance].delete(id)
        expected += copies.length
      }
    }
    assert.equal(returned, expected)
  }
  toString = () => `returnStuck(${this.instance})`
}

class Heartbeat implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(model: Model, real: Real) {
    await real.queues[this.instance].heartbeat()
    model.heartbeat.set(this.instance, model.now + HEARTBEAT_TTL_MS)
    model.registered.add(this.instance)
  }
  toString = () => `heartbeat(${this.instance})`
}

class Adopt implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(model: Model, real: Real) {
    const adopted = await real.queues[this.instance].adoptOrphans()
    let expected = 0
    for (const orphan of [...model.registered]) {
      if (orphan === this.instance || alive(model, orphan)) continue
      const delayed = model.delayed[orphan]
      if (delayed.size > 0) model.registered.add(this.instance)
      for (const [id, due] of delayed) addEarlier(model.delayed[this.instance], id, due)
      expected += delayed.size + model.processing[orphan].length
      delayed.clear()
      model.ready.push(...model.processing[orphan])
      model.processing[orphan] = []
      model.taken[orphan].clear()
      model.registered.delete(orphan)
    }
    assert.equal(adopted, expected)
  }
  toString = () => `adoptOrphans(${this.instance})`
}

class Stop implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(model: Model, real: Real) {
    const { stopped, handedBack } = await real.queues[this.instance].stop()
    assert.equal(stopped, true)
    assert.equal(handedBack, model.processing[this.instance].length)
    model.ready.push(...model.processing[this.instance])
    model.processing[this.instance] = []
    model.taken[this.instance].clear()
    model.heartbeat.delete(this.instance)
  }
  toString = () => `stop(${this.instance})`
}

/** The instance's process dies and starts again with the same id: Redis keeps what it had. */
class Crash implements ModelCommand<Model, Real> {
  constructor(readonly instance: Instance) {}
  check = () => true
  async run(_model: Model, real: Real) {
    real.queues[this.instance] = newQueue(real.clients[this.instance], this.instance)
  }
  toString = () => `crash(${this.instance})`
}

class Advance implements ModelCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    real.server.clock.advance(this.ms)
    model.now += this.ms
  }
  toString = () => `advance(${this.ms})`
}

function loseAll(model: Model) {
  model.registered.clear()
  model.heartbeat.clear()
  model.ready = []
  for (const instance of INSTANCES) {
    model.delayed[instance].clear()
    model.processing[instance] = []
    model.taken[instance].clear()
  }
}

const instance = fc.constantFrom(...INSTANCES)
const id = fc.constantFrom(...IDS)

modelTest<Model, Real>({
  name: 'delayed-queue',
  runs: 40,
  maxCommands: 35,
  commands: [
    fc
      .tuple(instance, id, fc.constantFrom(-500, 0, 1, 500, 1000, 4000))
      .map(([i, j, ms]) => new Schedule(i, j, ms)),
    fc.tuple(instance, id).map(([i, j]) => new Remove(i, j)),
    instance.map((i) => new Move(i)),
    instance.map((i) => new Take(i)),
    instance.map((i) => new Take(i)),
    fc.tuple(instance, fc.boolean()).map(([i, fails]) => new ConsumeOne(i, fails)),
    fc.tuple(instance, id).map(([i, j]) => new Ack(i, j)),
    fc.tuple(instance, id, fc.constantFrom(0, 700, 2000)).map(([i, j, ms]) => new Nack(i, j, ms)),
    instance.map((i) => new ReturnStuck(i)),
    instance.map((i) => new Heartbeat(i)),
    instance.map((i) => new Adopt(i)),
    instance.map((i) => new Stop(i)),
    instance.map((i) => new Crash(i)),
    fc.constantFrom(1, 499, 500, 999, 1000, 1001, 3000, 3001).map((ms) => new Advance(ms)),
    ...dataLosses<Model, Real>(loseAll),
  ],
  async setup() {
    if (!shared) {
      const server = await startModelRedis()
      shared = {
        server,
        admin: await server.client(),
        clients: { a: await server.client(), b: await server.client() },
      }
    }
    await shared.server.flushAll()
    shared.server.clock.set(MODEL_EPOCH_MS)
    const { server, admin, clients } = shared
    return {
      model: {
        now: MODEL_EPOCH_MS,
        registered: new Set(),
        heartbeat: new Map(),
        delayed: { a: new Map(), b: new Map() },
        ready: [],
        processing: { a: [], b: [] },
        taken: { a: new Map(), b: new Map() },
      },
      real: {
        server,
        admin,
        clients,
        queues: { a: newQueue(clients.a, 'a'), b: newQueue(clients.b, 'b') },
      },
    }
  },
  async teardown() {},
  async invariant(model, real) {
    const { admin } = real
    const keys = real.queues.a.keys
    const sorted = (ids: string[]) => [...ids].sort()
    assert.deepEqual(
      sorted(await admin.lrange(keys.ready, 0, -1)),
      sorted(model.ready.map((entry) => entry.id)),
      'ready list',
    )
    for (const instance of INSTANCES) {
      const entries = await admin.zrange(keys.delayed(instance), '0', '-1', 'WITHSCORES')
      const delayed = new Map<string, number>()
      for (let i = 0; i < entries.length; i += 2) delayed.set(entries[i]!, Number(entries[i + 1]))
      assert.deepEqual(delayed, model.delayed[instance], `delayed set of ${instance}`)
      assert.deepEqual(
        sorted(await admin.lrange(keys.processing(instance), 0, -1)),
        sorted(model.processing[instance].map((entry) => entry.id)),
        `processing list of ${instance}`,
      )
      assert.equal(
        (await admin.exists(keys.heartbeat(instance))) === 1,
        alive(model, instance),
        `heartbeat of ${instance}`,
      )
    }
    assert.deepEqual(sorted(await admin.smembers(keys.instances)), sorted([...model.registered]), 'registry')
  },
})
