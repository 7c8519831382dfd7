import assert from 'node:assert/strict'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { type SessionLifetime, SessionStore, sessionHandle } from '../../src/plugins/session/index.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { Advance, type ModelRedis, startModelRedis } from './redis.ts'

// Sessions of two principals on several devices, served by two instances of the store (each with
// its own memory of when it last slid a session, and its own L1), against a model of every
// session's Redis expiry and of each instance's L1. The clock is the model Redis's, shared by both
// instances; the model moves it. After every command the model waits for the invalidations it
// published to arrive (a PING on each subscriber: the bound, publish to delivery). Faults: FLUSHALL
// and a Redis restart lose every session: a lost session is logged out, and never comes back,
// except from an L1 that loaded it less than its ttlMs ago (nothing names the lost sessions to it:
// the documented bound for data Redis loses on its own); a subscriber connection killed (and back),
// or down for a while (then every load reads Redis). A revoked session is never served, and a
// field is never served stale.

const IDLE = 10_000
const ABSOLUTE = 60_000
const TOUCH_AFTER = 500
const L1_TTL = 3000
const OPTIONS = {
  keyPrefix: 'sess:',
  idleTimeoutMs: IDLE,
  absoluteTimeoutMs: ABSOLUTE,
  touchAfterMs: TOUCH_AFTER,
  maxIdleTimeoutMs: 4 * IDLE,
  l1: { maxEntries: 1000, ttlMs: L1_TTL },
}
const PRINCIPALS = ['alice', 'bob'] as const
/** Lifetimes a login may ask for: the plugin's, shorter than touchAfterMs, shorter, longer, short-lived. */
const LIFETIMES: ReadonlyArray<SessionLifetime | undefined> = [
  undefined,
  { idleTimeoutMs: 200 },
  { idleTimeoutMs: 2000 },
  { idleTimeoutMs: 4 * IDLE },
  { idleTimeoutMs: 1000, absoluteTimeoutMs: 3000 },
]
const STEPS = [1, 10, 150, 199, 200, 499, 500, 1000, 1999, 2000, 9_999, 10_000, 40_000, 60_000]

/** How long after its last slide an instance slides a session of this idle timeout again. */
const touchAfter = (idle: number) => (idle >= IDLE ? TOUCH_AFTER : Math.floor((TOUCH_AFTER * idle) / IDLE))

interface ModelSession {
  id: string
  principal: string
  idle: number
  absolute: number
  /** When Redis expires its key: it exists while now <= expiry (Redis expires a key once past it). */
  expiry: number
  /** Deleted, ended or lost: never seen again. */
  gone: boolean
  /** Last request (a load that found it, or its login) and the expiry the docs promise after it. */
  lastRequest: number
  data: Record<string, number>
  /** Ended by a logout, a login on its device, "log out everywhere" or its handle while it existed. */
  revoked: boolean
}

/** A session an instance's L1 holds, as loaded. */
interface L1Entry {
  loadedAt: number
  data: Record<string, number>
  /**
   * "Log out everywhere" or an end by handle after a loss may or may not name this lost session
   * (the principal's index was lost with it, or not yet): the real L1 may have dropped it.
   */
  uncertain: boolean
}

interface Model {
  now: number
  sessions: ModelSession[]
  /** Per instance: when it last slid each session (its own loads and logins only). */
  touched: [Map<string, number>, Map<string, number>]
  /** Per instance: its L1 (what it holds), and whether its subscriber is up. */
  l1: [Map<string, L1Entry>, Map<string, L1Entry>]
  subscribed: [boolean, boolean]
}

interface Real {
  server: ModelRedis
  client: Redis
  stores: [SessionStore, SessionStore]
}

const exists = (model: Model, s: ModelSession) => !s.gone && model.now <= s.expiry
const alive = (model: Model, s: ModelSession) => exists(model, s) && model.now < s.absolute
/** Mostly a session that still exists (what users present), sometimes any (an old cookie). */
function pick(model: Model, index: number): ModelSession {
  const existing = model.sessions.filter((s) => exists(model, s))
  const from = existing.length > 0 && index % 4 !== 0 ? existing : model.sessions
  return from[index % from.length]!
}
const hasSessions = (model: Readonly<Model>) => model.sessions.length > 0

/**
 * The session ends for good (a load or a listing found it past its lifetime, a logout, a loss).
 * Each instance still remembers its last slide, until a load of its own finds the session gone:
 * with a loaded copy in its L1, that memory is what an L1 answer is checked against.
 */
function end(s: ModelSession) {
  s.gone = true
}

/** A store published the session's id: every subscribed L1 drops it (the model then waits for delivery). */
function invalidate(model: Model, s: ModelSession) {
  for (const l1 of model.l1) l1.delete(s.id)
}

/** Revoked by a command naming it: invalidated when it existed, else the L1s may or may not hear of it. */
function revokeByIndex(model: Model, s: ModelSession) {
  if (exists(model, s)) {
    s.revoked = true
    invalidate(model, s)
  } else for (const l1 of model.l1) for (const [id, entry] of l1) if (id === s.id) entry.uncertain = true
}

/** Waits until every subscribed L1 has applied what was published so far. */
async function settle(model: Model, real: Real) {
  await Promise.all(real.stores.filter((_, i) => model.subscribed[i]).map((store) => store.l1!.settled()))
}

class Create implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly principal: string,
    readonly lifetime: SessionLifetime | undefined,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const session = await real.stores[this.instance].create(this.principal, { n: 0 }, this.lifetime)
    const idle = this.lifetime?.idleTimeoutMs ?? IDLE
    const absolute = model.now + (this.lifetime?.absoluteTimeoutMs ?? ABSOLUTE)
    assert.equal(session.absoluteExpiresAt, absolute)
    assert.equal(session.expiresAt, Math.min(model.now + idle, absolute))
    model.sessions.push({
      id: session.id,
      principal: this.principal,
      idle,
      absolute,
      expiry: Math.min(model.now + idle, absolute),
      gone: false,
      lastRequest: model.now,
      data: { n: 0 },
      revoked: false,
    })
    model.touched[this.instance].set(session.id, model.now)
  }
  toString = () => `create(${this.instance}, ${this.principal}, ${JSON.stringify(this.lifetime ?? null)})`
}

/**
 * A request presenting the session's cookie to one instance: the load and its slide, from the L1
 * (a session it loaded less than ttlMs ago, within the idle expiry this instance slid and its
 * lifetime, while subscribed) or else from Redis.
 */
class Load implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly index: number,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    const l1 = model.l1[this.instance]
    const entry = l1.get(s.id)
    const touched = model.touched[this.instance]
    const last = touched.get(s.id)
    const cached =
      entry !== undefined &&
      model.subscribed[this.instance] &&
      model.now - entry.loadedAt < L1_TTL &&
      last !== undefined &&
      model.now < last + s.idle &&
      model.now < s.absolute
    const loaded = await real.stores[this.instance].load(s.id)
    if (loaded) assert.ok(!s.revoked, 'a revoked session is never served')
    if (cached) {
      if (loaded) {
        assert.deepEqual(loaded.data, entry.data, 'served as the L1 loaded it')
        assert.equal(loaded.principal, s.principal)
        // Only a session Redis lost on its own (nothing published its id) may differ from the model.
        if (!s.gone) assert.deepEqual(loaded.data, s.data, 'a field is never served stale')
        entry.uncertain = false
        if (model.now - last >= touchAfter(s.idle)) {
          assert.ok(exists(model, s), 'a slide from the L1 finds the key (PEXPIRE)')
          s.expiry = Math.min(model.now + s.idle, s.absolute)
          touched.set(s.id, model.now)
        }
        s.lastRequest = model.now
        return
      }
      // The slide found no key (lost), or a message the model could not name dropped the entry.
      assert.ok(entry.uncertain || !exists(model, s), 'an L1 refuses only a session that is gone')
      l1.delete(s.id)
      if (!s.gone) end(s)
      touched.delete(s.id)
      return
    }
    // Not answered from the L1: dropped there (out of its bounds), or never held.
    l1.delete(s.id)
    if (!alive(model, s)) {
      assert.equal(loaded, null, 'a session that ended is never loaded again')
      // Past its lifetime, its key is deleted now, and its id published.
      if (exists(model, s)) invalidate(model, s)
      // Its key is gone (or deleted now, past its lifetime): no instance slides it again.
      if (!s.gone) end(s)
      touched.delete(s.id)
      return
    }
    assert.ok(loaded, `a live session loads (now ${model.now}, expiry ${s.expiry}, absolute ${s.absolute})`)
    assert.equal(loaded.principal, s.principal)
    assert.deepEqual(loaded.data, s.data, 'a field is never served stale')
    if (last === undefined || model.now - last >= touchAfter(s.idle)) {
      s.expiry = Math.min(model.now + s.idle, s.absolute)
      touched.set(s.id, model.now)
    }
    s.lastRequest = model.now
    if (model.subscribed[this.instance])
      l1.set(s.id, { loadedAt: model.now, data: { ...s.data }, uncertain: false })
  }
  toString = () => `load(${this.instance}, #${this.index})`
}

/** A user's burst: requests presenting the same session to one instance in a row (the L1's case). */
class Burst implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly index: number,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const load = new Load(this.instance, this.index)
    for (let i = 0; i < 3; i++) await load.run(model, real)
  }
  toString = () => `burst(${this.instance}, #${this.index})`
}

/** A request to one instance that changes the session's data (and, with `touch`, calls touch()) and saves. */
class Save implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly index: number,
    readonly touch: boolean,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    const n = (s.data.n ?? 0) + 1
    const saved = await real.stores[this.instance].saveFields(s.id, [['n', String(n)]], [], this.touch)
    // A save of fields publishes the id, saved or not.
    invalidate(model, s)
    if (!alive(model, s)) {
      // Never recreated: a save after logout, expiry or a loss writes nothing.
      assert.equal(saved, null)
      if (!s.gone && model.now >= s.absolute) end(s)
      return
    }
    assert.notEqual(saved, null)
    s.data = { n }
    if (this.touch) s.expiry = Math.min(model.now + s.idle, s.absolute)
  }
  toString = () => `save(${this.instance}, #${this.index}${this.touch ? ', touch' : ''})`
}

class Logout implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly index: number,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    await real.stores[this.instance].destroy(s.id, s.principal)
    s.revoked = true
    invalidate(model, s)
    end(s)
  }
  toString = () => `logout(${this.instance}, #${this.index})`
}

/** Login on a device that presented a session: the old id dies, a new one is made (as the plugin's regenerateSession). */
class Regenerate implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly index: number,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    await real.stores[this.instance].destroy(s.id, s.principal)
    s.revoked = true
    invalidate(model, s)
    end(s)
    await new Create(this.instance, s.principal, undefined).run(model, real)
    await real.stores[this.instance].pruneIndex(s.principal)
  }
  toString = () => `regenerate(${this.instance}, #${this.index})`
}

class LogoutEverywhere implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly principal: string,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const ended = await real.stores[this.instance].destroyAll(this.principal)
    const mine = model.sessions.filter((s) => s.principal === this.principal && exists(model, s))
    assert.equal(ended, mine.length, 'log out everywhere ends every session that exists')
    for (const s of model.sessions)
      if (s.principal === this.principal) {
        revokeByIndex(model, s)
        end(s)
      }
  }
  toString = () => `logoutEverywhere(${this.instance}, ${this.principal})`
}

/** Ends one device from the principal's list, by its handle. */
class EndDevice implements ModelCommand<Model, Real> {
  constructor(readonly index: number) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    const ended = await real.stores[1].destroySession(s.principal, sessionHandle(s.id))
    assert.equal(ended, exists(model, s))
    revokeByIndex(model, s)
    end(s)
  }
  toString = () => `endDevice(#${this.index})`
}

/** FLUSHALL, or a Redis crash and restart: every session is lost. */
class Loss implements ModelCommand<Model, Real> {
  constructor(readonly kind: 'flushAll' | 'restart') {}
  check = () => true
  async run(model: Model, real: Real) {
    if (this.kind === 'flushAll') await real.server.flushAll()
    else {
      // Every subscriber drops with the server, and subscribes again (its L1 cleared) once it is back.
      const up = real.stores.filter((_, i) => model.subscribed[i]).map((store) => store.l1!)
      const dropped = up.map((l1) => new Promise((resolve) => l1.connection.once('close', resolve)))
      await real.server.restart()
      await Promise.all(dropped)
      await Promise.all(up.map((l1) => l1.whenSubscribed()))
      for (const [i, subscribed] of model.subscribed.entries()) if (subscribed) model.l1[i]!.clear()
    }
    for (const s of model.sessions) s.gone = true
  }
  toString = () => `${this.kind}()`
}

/** The instance's subscriber connection killed on the server (CLIENT KILL); it comes back, its L1 cleared. */
class KillSubscriber implements ModelCommand<Model, Real> {
  constructor(readonly instance: 0 | 1) {}
  check = (model: Readonly<Model>) => model.subscribed[this.instance]
  async run(model: Model, real: Real) {
    const l1 = real.stores[this.instance].l1!
    const port = (l1.connection as Redis).stream.localPort
    const dropped = new Promise((resolve) => l1.connection.once('close', resolve))
    await real.client.call('CLIENT', 'KILL', 'ADDR', `127.0.0.1:${port}`)
    await dropped
    await l1.whenSubscribed()
    model.l1[this.instance].clear()
  }
  toString = () => `killSubscriber(${this.instance})`
}

/** The instance's subscriber down (until SubscriberUp): its L1 is empty and bypassed meanwhile. */
class SubscriberDown implements ModelCommand<Model, Real> {
  constructor(readonly instance: 0 | 1) {}
  check = (model: Readonly<Model>) => model.subscribed[this.instance]
  async run(model: Model, real: Real) {
    const l1 = real.stores[this.instance].l1!
    const dropped = new Promise((resolve) => l1.connection.once('end', resolve))
    l1.connection.disconnect()
    await dropped
    assert.equal(l1.subscribed, false)
    model.subscribed[this.instance] = false
    model.l1[this.instance].clear()
  }
  toString = () => `subscriberDown(${this.instance})`
}

class SubscriberUp implements ModelCommand<Model, Real> {
  constructor(readonly instance: 0 | 1) {}
  check = (model: Readonly<Model>) => !model.subscribed[this.instance]
  async run(model: Model, real: Real) {
    const l1 = real.stores[this.instance].l1!
    await (l1.connection as Redis).connect()
    await l1.whenSubscribed()
    model.subscribed[this.instance] = true
    model.l1[this.instance].clear()
  }
  toString = () => `subscriberUp(${this.instance})`
}

let shared: Promise<ModelRedis> | undefined
after(async () => (await shared)?.stop())

const instance = fc.constantFrom<0 | 1>(0, 1)
const index = fc.nat(30)

modelTest<Model, Real>({
  name: 'session',
  runs: 60,
  maxCommands: 40,
  commands: [
    fc
      .tuple(instance, fc.constantFrom(...PRINCIPALS), fc.constantFrom(...LIFETIMES))
      .map(([i, p, l]) => new Create(i, p, l)),
    fc.tuple(instance, index).map(([i, n]) => new Load(i, n)),
    fc.tuple(instance, index).map(([i, n]) => new Load(i, n)),
    fc.tuple(instance, index).map(([i, n]) => new Burst(i, n)),
    fc.tuple(instance, index).map(([i, n]) => new Burst(i, n)),
    fc.tuple(instance, index, fc.boolean()).map(([i, n, touch]) => new Save(i, n, touch)),
    fc.tuple(instance, index).map(([i, n]) => new Logout(i, n)),
    fc.tuple(instance, index).map(([i, n]) => new Regenerate(i, n)),
    fc.tuple(instance, fc.constantFrom(...PRINCIPALS)).map(([i, p]) => new LogoutEverywhere(i, p)),
    index.map((n) => new EndDevice(n)),
    fc.constantFrom(...STEPS).map((ms) => new Advance<Model, Real>(ms)),
    fc.constantFrom(...STEPS).map((ms) => new Advance<Model, Real>(ms)),
    fc.constantFrom<'flushAll' | 'restart'>('flushAll', 'restart').map((kind) => new Loss(kind)),
    instance.map((i) => new KillSubscriber(i)),
    instance.map((i) => new SubscriberDown(i)),
    instance.map((i) => new SubscriberUp(i)),
  ],
  async setup() {
    // One server for every run (starting one per run was most of the model's time), emptied first.
    shared ??= startModelRedis()
    const server = await shared
    await server.flushAll()
    const client = await server.client()
    const now = () => server.clock.now()
    const stores: Real['stores'] = [
      new SessionStore(client, { ...OPTIONS, now }),
      new SessionStore(client, { ...OPTIONS, now }),
    ]
    await Promise.all(stores.map((store) => store.l1!.whenSubscribed()))
    return {
      model: {
        now: server.clock.now(),
        sessions: [],
        touched: [new Map(), new Map()],
        l1: [new Map(), new Map()],
        subscribed: [true, true],
      },
      real: { server, client, stores },
    }
  },
  async teardown(real) {
    for (const store of real.stores) store.close()
    real.client.disconnect()
  },
  // Each principal's devices are exactly the sessions the model has alive, with the expiry it
  // computed; and that expiry keeps the promise: no earlier than idle - touchAfter after the last request.
  async invariant(model, real) {
    // The bound: what a command published has reached every subscribed L1 before the next one.
    await settle(model, real)
    // Each L1 holds at most what the model says it may (an entry out of its bounds may linger until looked up).
    real.stores.forEach((store, i) => {
      for (const s of model.sessions)
        if (store.l1!.holds(s.id))
          assert.ok(model.l1[i]!.has(s.id), `L1 ${i} holds only what it loaded since its last invalidation`)
    })
    for (const principal of PRINCIPALS) {
      const listed = await real.stores[0].listSessions(principal)
      // The listing deletes sessions past their lifetime, as a load does.
      for (const s of model.sessions)
        if (s.principal === principal && exists(model, s) && model.now >= s.absolute) end(s)
      const expected = model.sessions
        .filter((s) => s.principal === principal && alive(model, s))
        .map((s) => ({
          handle: sessionHandle(s.id),
          expiresAt: s.expiry,
          absolute: s.absolute,
          idle: s.idle,
        }))
      const actual = listed.map((s) => ({
        handle: s.handle,
        expiresAt: s.expiresAt,
        absolute: s.absoluteExpiresAt,
        idle: s.idleTimeoutMs,
      }))
      const order = (a: { handle: string }, b: { handle: string }) => a.handle.localeCompare(b.handle)
      assert.deepEqual(actual.sort(order), expected.sort(order), `devices of ${principal}`)
      for (const s of model.sessions.filter((x) => x.principal === principal && alive(model, x)))
        assert.ok(
          s.expiry >= Math.min(s.lastRequest + s.idle - touchAfter(s.idle), s.absolute),
          `session expires no earlier than idle - touchAfter after its last request (${s.lastRequest} + ${s.idle})`,
        )
    }
  },
})
