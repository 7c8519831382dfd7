import assert from 'node:assert/strict'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { createLock, type Lock, type LockHandle, LockNotAcquiredError } from '../../src/primitives/lock.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { MODEL_EPOCH_MS, type ModelRedis, startModelRedis } from './redis.ts'

// The lock against a plain model on a Redis whose clock the model moves: who holds each name, until
// when (Redis clock), and the fence counter. Two lock instances on their own connections compete.
// Faults: FLUSHALL, the loss of one name's slot, a Redis restart, and a failover to a node whose
// clock is behind. The fence is predicted exactly (the counter plus one, floored at the Redis clock
// in µs), and checked to grow strictly while Redis keeps its data, and after a loss whenever the
// Redis clock is past every token handed out (the guarantee docs/lock.md states).

const NAMES = ['a', 'b'] as const
type Name = (typeof NAMES)[number]

interface HandleModel {
  handle: LockHandle
  instance: number
}

interface NameModel {
  /** The handle holding the name while `now <= expiresAt` (Redis expires a key once now > its time). */
  holder: HandleModel | null
  expiresAt: number
  /** The fence key's value; 0 when missing. */
  counter: number
  /** Every token handed out for the name, and whether Redis lost the name's keys since the last. */
  tokens: number[]
  lostSinceLast: boolean
}

interface Model {
  now: number
  names: Record<Name, NameModel>
  handles: HandleModel[]
}

interface Real {
  server: ModelRedis
  locks: Lock[]
}

let shared: { server: ModelRedis; clients: Redis[] } | undefined
after(async () => {
  await shared?.server.stop()
})

const held = (model: Model, name: Name) => {
  const entry = model.names[name]
  return entry.holder !== null && model.now <= entry.expiresAt ? entry.holder : null
}

const loseAll = (model: Model, names: readonly Name[] = NAMES) => {
  for (const name of names) {
    const entry = model.names[name]
    entry.holder = null
    entry.counter = 0
    entry.lostSinceLast = true
  }
}

class Acquire implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: number,
    readonly name: Name,
    readonly ttlMs: number,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const handle = await real.locks[this.instance]!.acquire(this.name, this.ttlMs)
    const entry = model.names[this.name]
    if (held(model, this.name)) {
      assert.equal(handle, null, 'a held lock was acquired a second time')
      return
    }
    assert.ok(handle, 'a free lock was not acquired')
    const fence = Math.max(entry.counter + 1, model.now * 1000)
    assert.equal(handle.fence, fence)
    // While Redis keeps the name's keys, above the previous token; after a loss, above every earlier
    // token once the Redis clock (µs) is past them.
    const previous = entry.tokens.at(-1) ?? 0
    const highest = Math.max(0, ...entry.tokens)
    if (!entry.lostSinceLast) assert.ok(fence > previous, `fence ${fence} not above the previous ${previous}`)
    else if (model.now * 1000 > highest) assert.ok(fence > highest, `fence ${fence} not above ${highest}`)
    entry.tokens.push(fence)
    entry.lostSinceLast = false
    entry.counter = fence
    entry.holder = { handle, instance: this.instance }
    entry.expiresAt = model.now + this.ttlMs
    model.handles.push(entry.holder)
    if (model.handles.length > 6) model.handles.shift()
  }
  toString = () => `acquire(#${this.instance}, ${this.name}, ${this.ttlMs})`
}

/**
 * withLock with a function that reads the holder from the other instance: it runs holding the lock
 * with the next fence and releases it at the end, or fails with LockNotAcquiredError and the
 * holder's remaining TTL. A TTL of a minute, so that no renewal or release deadline (this process's
 * clock) comes into play however loaded the machine is.
 */
class WithLock implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: number,
    readonly name: Name,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const entry = model.names[this.name]
    const run = real.locks[this.instance]!.withLock(
      this.name,
      async (_signal, handle) => ({ handle, seen: await real.locks[1 - this.instance]!.holder(this.name) }),
      { ttlMs: 60_000 },
    )
    if (held(model, this.name)) {
      await assert.rejects(run, (err) => {
        assert.ok(err instanceof LockNotAcquiredError)
        assert.equal(err.retryAfterMs, entry.expiresAt - model.now)
        return true
      })
      return
    }
    const { handle, seen } = await run
    const fence = Math.max(entry.counter + 1, model.now * 1000)
    assert.equal(handle.fence, fence)
    assert.deepEqual(seen, { owner: handle.owner, fence, expiresInMs: 60_000 })
    entry.tokens.push(fence)
    entry.lostSinceLast = false
    entry.counter = fence
    entry.holder = null
  }
  toString = () => `withLock(#${this.instance}, ${this.name})`
}

class Release implements ModelCommand<Model, Real> {
  constructor(readonly pick: number) {}
  check = (model: Readonly<Model>) => model.handles.length > 0
  async run(model: Model, real: Real) {
    const h = model.handles[this.pick % model.handles.length]!
    const name = h.handle.name as Name
    const expected = held(model, name) === h
    assert.equal(await real.locks[h.instance]!.release(h.handle), expected)
    if (expected) model.names[name].holder = null
  }
  toString = () => `release(handle ${this.pick})`
}

class Extend implements ModelCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly ttlMs: number,
  ) {}
  check = (model: Readonly<Model>) => model.handles.length > 0
  async run(model: Model, real: Real) {
    const h = model.handles[this.pick % model.handles.length]!
    const name = h.handle.name as Name
    const expected = held(model, name) === h
    assert.equal(await real.locks[h.instance]!.extend(h.handle, this.ttlMs), expected)
    if (expected) model.names[name].expiresAt = model.now + this.ttlMs
  }
  toString = () => `extend(handle ${this.pick}, ${this.ttlMs})`
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

class FlushAll implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await real.server.flushAll()
    loseAll(model)
  }
  toString = () => 'flushAll()'
}

class DropSlot implements ModelCommand<Model, Real> {
  constructor(readonly name: Name) {}
  check = () => true
  async run(model: Model, real: Real) {
    await real.server.dropSlot(this.name)
    loseAll(model, [this.name])
  }
  toString = () => `dropSlot(${this.name})`
}

class Restart implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await real.server.restart()
    loseAll(model)
  }
  toString = () => 'restart()'
}

/** A failover to a node that has none of the data and whose clock is `behindMs` behind. */
class FailoverBehind implements ModelCommand<Model, Real> {
  constructor(readonly behindMs: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    await real.server.restart()
    model.now -= this.behindMs
    real.server.clock.set(model.now)
    loseAll(model)
  }
  toString = () => `failoverBehind(${this.behindMs})`
}

const name = fc.constantFrom(...NAMES)
const ttl = fc.constantFrom(100, 1000, 2000)
const instance = fc.constantFrom(0, 1)

modelTest<Model, Real>({
  name: 'lock',
  runs: 40,
  maxCommands: 30,
  commands: [
    fc.tuple(instance, name, ttl).map(([i, n, t]) => new Acquire(i, n, t)),
    fc.tuple(instance, name, ttl).map(([i, n, t]) => new Acquire(i, n, t)),
    fc.tuple(instance, name).map(([i, n]) => new WithLock(i, n)),
    fc.nat(5).map((pick) => new Release(pick)),
    fc.tuple(fc.nat(5), ttl).map(([pick, t]) => new Extend(pick, t)),
    fc.constantFrom(1, 99, 100, 101, 900, 1000, 1001, 2500).map((ms) => new Advance(ms)),
    fc.constant(new FlushAll()),
    name.map((n) => new DropSlot(n)),
    // Restarts cost the most time: both kinds share one slot of the draw.
    fc.oneof(
      fc.constant(new Restart()),
      fc.constantFrom(1, 1000, 60_000).map((ms) => new FailoverBehind(ms)),
    ),
  ],
  async setup() {
    if (!shared) {
      const server = await startModelRedis()
      shared = { server, clients: [await server.client(), await server.client()] }
    }
    await shared.server.flushAll()
    shared.server.clock.set(MODEL_EPOCH_MS)
    const names = {} as Record<Name, NameModel>
    for (const n of NAMES)
      names[n] = { holder: null, expiresAt: 0, counter: 0, tokens: [], lostSinceLast: false }
    return {
      model: { now: MODEL_EPOCH_MS, names, handles: [] },
      real: { server: shared.server, locks: shared.clients.map((client) => createLock(client)) },
    }
  },
  async teardown() {},
  async invariant(model, real) {
    for (const n of NAMES) {
      const h = held(model, n)
      const seen = await real.locks[0]!.holder(n)
      if (!h) {
        assert.equal(seen, null, `${n}: a holder is reported where the model has none`)
        continue
      }
      assert.deepEqual(seen, {
        owner: h.handle.owner,
        fence: model.names[n].counter,
        expiresInMs: model.names[n].expiresAt - model.now,
      })
    }
  },
})
