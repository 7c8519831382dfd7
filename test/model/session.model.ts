import assert from 'node:assert/strict'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { type SessionLifetime, SessionStore, sessionHandle } from '../../src/plugins/session/index.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { type ModelRedis, startModelRedis } from './redis.ts'

// Sessions of two principals on several devices, served by two instances of the store (each with
// its own memory of when it last slid a session), against a model of every session's Redis expiry.
// The clock is the model Redis's, shared by both instances; the model moves it. Faults: FLUSHALL
// and a Redis restart lose every session: a lost session is logged out, and never comes back.

const IDLE = 10_000
const ABSOLUTE = 60_000
const TOUCH_AFTER = 500
const OPTIONS = {
  keyPrefix: 'sess:',
  idleTimeoutMs: IDLE,
  absoluteTimeoutMs: ABSOLUTE,
  touchAfterMs: TOUCH_AFTER,
  maxIdleTimeoutMs: 4 * IDLE,
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
}

interface Model {
  now: number
  sessions: ModelSession[]
  /** Per instance: when it last slid each session (its own loads and logins only). */
  touched: [Map<string, number>, Map<string, number>]
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

/** The session ends for good (a load or a listing found it past its lifetime, a logout, a loss). */
function end(model: Model, s: ModelSession) {
  s.gone = true
  for (const touched of model.touched) touched.delete(s.id)
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
    })
    model.touched[this.instance].set(session.id, model.now)
  }
  toString = () => `create(${this.instance}, ${this.principal}, ${JSON.stringify(this.lifetime ?? null)})`
}

/** A request presenting the session's cookie to one instance: the load and its slide. */
class Load implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: 0 | 1,
    readonly index: number,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    const loaded = await real.stores[this.instance].load(s.id)
    const touched = model.touched[this.instance]
    if (!alive(model, s)) {
      assert.equal(loaded, null, 'a session that ended is never loaded again')
      // Its key is gone (or deleted now, past its lifetime): no instance slides it again.
      if (!s.gone) end(model, s)
      touched.delete(s.id)
      return
    }
    assert.ok(loaded, `a live session loads (now ${model.now}, expiry ${s.expiry}, absolute ${s.absolute})`)
    assert.equal(loaded.principal, s.principal)
    assert.deepEqual(loaded.data, s.data)
    const last = touched.get(s.id)
    if (last === undefined || model.now - last >= touchAfter(s.idle)) {
      s.expiry = Math.min(model.now + s.idle, s.absolute)
      touched.set(s.id, model.now)
    }
    s.lastRequest = model.now
  }
  toString = () => `load(${this.instance}, #${this.index})`
}

/** A request that changes the session's data (and, with `touch`, calls touch()) and saves. */
class Save implements ModelCommand<Model, Real> {
  constructor(
    readonly index: number,
    readonly touch: boolean,
  ) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    const n = (s.data.n ?? 0) + 1
    const saved = await real.stores[0].saveFields(s.id, [['n', String(n)]], [], this.touch)
    if (!alive(model, s)) {
      // Never recreated: a save after logout, expiry or a loss writes nothing.
      assert.equal(saved, null)
      if (!s.gone && model.now >= s.absolute) end(model, s)
      return
    }
    assert.notEqual(saved, null)
    s.data = { n }
    if (this.touch) s.expiry = Math.min(model.now + s.idle, s.absolute)
  }
  toString = () => `save(#${this.index}${this.touch ? ', touch' : ''})`
}

class Logout implements ModelCommand<Model, Real> {
  constructor(readonly index: number) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    await real.stores[0].destroy(s.id, s.principal)
    end(model, s)
  }
  toString = () => `logout(#${this.index})`
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
    end(model, s)
    await new Create(this.instance, s.principal, undefined).run(model, real)
    await real.stores[this.instance].pruneIndex(s.principal)
  }
  toString = () => `regenerate(${this.instance}, #${this.index})`
}

class LogoutEverywhere implements ModelCommand<Model, Real> {
  constructor(readonly principal: string) {}
  check = () => true
  async run(model: Model, real: Real) {
    const ended = await real.stores[1].destroyAll(this.principal)
    const mine = model.sessions.filter((s) => s.principal === this.principal && exists(model, s))
    assert.equal(ended, mine.length, 'log out everywhere ends every session that exists')
    for (const s of model.sessions) if (s.principal === this.principal) end(model, s)
  }
  toString = () => `logoutEverywhere(${this.principal})`
}

/** Ends one device from the principal's list, by its handle. */
class EndDevice implements ModelCommand<Model, Real> {
  constructor(readonly index: number) {}
  check = hasSessions
  async run(model: Model, real: Real) {
    const s = pick(model, this.index)
    const ended = await real.stores[1].destroySession(s.principal, sessionHandle(s.id))
    assert.equal(ended, exists(model, s))
    end(model, s)
  }
  toString = () => `endDevice(#${this.index})`
}

class Advance implements ModelCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    model.now += this.ms
    real.server.clock.set(model.now)
  }
  toString = () => `advance(${this.ms})`
}

/** FLUSHALL, or a Redis crash and restart: every session is lost. */
class Loss implements ModelCommand<Model, Real> {
  constructor(readonly kind: 'flushAll' | 'restart') {}
  check = () => true
  async run(model: Model, real: Real) {
    await (this.kind === 'flushAll' ? real.server.flushAll() : real.server.restart())
    for (const s of model.sessions) s.gone = true
  }
  toString = () => `${this.kind}()`
}

let shared: Promise<ModelRedis> | undefined
after(async () => (await shared)?.stop())

const instance = fc.constantFrom<0 | 1>(0, 1)
const index = fc.nat(30)

modelTest<Model, Real>({
  name: 'session',
  runs: 40,
  maxCommands: 40,
  commands: [
    fc
      .tuple(instance, fc.constantFrom(...PRINCIPALS), fc.constantFrom(...LIFETIMES))
      .map(([i, p, l]) => new Create(i, p, l)),
    fc.tuple(instance, index).map(([i, n]) => new Load(i, n)),
    fc.tuple(instance, index).map(([i, n]) => new Load(i, n)),
    fc.tuple(index, fc.boolean()).map(([n, touch]) => new Save(n, touch)),
    index.map((n) => new Logout(n)),
    fc.tuple(instance, index).map(([i, n]) => new Regenerate(i, n)),
    fc.constantFrom(...PRINCIPALS).map((p) => new LogoutEverywhere(p)),
    index.map((n) => new EndDevice(n)),
    fc.constantFrom(...STEPS).map((ms) => new Advance(ms)),
    fc.constantFrom(...STEPS).map((ms) => new Advance(ms)),
    fc.constantFrom<'flushAll' | 'restart'>('flushAll', 'restart').map((kind) => new Loss(kind)),
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
    return {
      model: { now: server.clock.now(), sessions: [], touched: [new Map(), new Map()] },
      real: { server, client, stores },
    }
  },
  async teardown(real) {
    real.client.disconnect()
  },
  // Each principal's devices are exactly the sessions the model has alive, with the expiry it
  // computed; and that expiry keeps the promise: no earlier than idle - touchAfter after the last request.
  async invariant(model, real) {
    for (const principal of PRINCIPALS) {
      const listed = await real.stores[0].listSessions(principal)
      // The listing deletes sessions past their lifetime, as a load does.
      for (const s of model.sessions)
        if (s.principal === principal && exists(model, s) && model.now >= s.absolute) end(model, s)
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
