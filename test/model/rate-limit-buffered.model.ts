import assert from 'node:assert/strict'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import rateLimit, { type RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { dataLosses, type ModelRedis, startModelRedis } from './redis.ts'

/**
 * Buffered mode against a plain model: three instances (`a`, `b`, `c`) share one Redis (the model's
 * redis-server, on a clock the model sets, which the instances read too) and decide a fixed window
 * and a token bucket from leases. Requests, sync ticks and time are commands; so are the faults:
 * FLUSHALL, a Redis restart, an instance crashing with its leases (its Redis client cut, never
 * closed), and a long pause after which a crashed instance's heartbeat has expired.
 *
 * What must hold after every command:
 * - a fixed window never admits more than its limit (unless Redis lost its data in that window);
 * - Redis counts every admitted unit: its counter is at least what was admitted plus what the live
 *   instances hold, and at most that plus what crashed instances took with them;
 * - a token bucket never admits more than its capacity plus its refill since the last loss of data
 *   (plus the units instances held at that loss);
 * - a crashed instance stops counting toward the others' shares once its heartbeat expires.
 */

const INSTANCES = ['a', 'b', 'c'] as const
type InstanceName = (typeof INSTANCES)[number]
const IDENTITY = 'x'
const WINDOW_MS = 1000
const FIXED: RateLimitPolicy = {
  name: 'fixed',
  algorithm: 'fixed-window',
  limit: 12,
  windowMs: WINDOW_MS,
  // No timer tick during a run (a tick is the Sync command); heartbeats live 3 hours of the model's clock.
  sync: { intervalMs: 3_600_000, batch: 4 },
}
const BUCKET: RateLimitPolicy = {
  name: 'bucket',
  algorithm: 'token-bucket',
  limit: 8,
  // 1/128 token per ms: exact in binary.
  refillPerSecond: 1000 / 128,
  sync: { intervalMs: 3_600_000, batch: 3 },
}
const HEARTBEAT_MS = 3 * 3_600_000

interface Model {
  now: number
  /** The fixed window on the Redis clock: [start, end), units admitted in it, and whether data was lost in it. */
  window: { start: number; end: number; admitted: number; lost: boolean } | null
  /** Units crashed instances held in the current window (Redis counted them; nobody will spend them). */
  strandedFixed: number
  /** Leases taken before a data loss live until then: a window starting earlier may spend them uncounted. */
  taintedUntil: number
  /** Token bucket: admitted since the last data loss, from when, and what instances held then. */
  bucket: { since: number; admitted: number; heldAtStart: number }
  /** Crashed instances whose heartbeat has not expired yet: until when (Redis clock). */
  ghosts: number[]
  /** Per instance, the most instances it may count: those alive at its last heartbeat. */
  counted: Record<InstanceName, number>
}

const aliveNow = (model: Model) => INSTANCES.length + model.ghosts.length

interface Real {
  server: ModelRedis
  clock: { now: number }
  apps: Record<InstanceName, { app: FastifyInstance; client: Redis }>
  /** A client of the model's own, for reading keys. */
  reader: Redis
  /** Crashed instances' apps, closed at the end of the run. */
  dead: FastifyInstance[]
}

async function buildInstance(real: Pick<Real, 'server' | 'clock'>): Promise<Real['apps'][InstanceName]> {
  const client = await real.server.client({ enableOfflineQueue: false, maxRetriesPerRequest: 0 })
  const app = Fastify()
  await app.register(rateLimit, {
    redis: client,
    keyPrefix: 'rlb:',
    namedPolicies: [FIXED, BUCKET],
    // Requests are asked through app.rateLimiter: no route, and every decision on the model's clock.
    now: () => real.clock.now,
  })
  await app.ready()
  return { app, client }
}

const held = (real: Real, policy: string) =>
  INSTANCES.reduce(
    (sum, name) => sum + (real.apps[name].app.rateLimiter.leases().policies[policy]?.unitsHeld ?? 0),
    0,
  )

async function fixedCounter(real: Real): Promise<{ count: number; ttl: number } | null> {
  const keys = await real.reader.keys('rlb:*:fixed:fixed-window')
  if (keys.length === 0) return null
  const [count, ttl] = await Promise.all([real.reader.get(keys[0]!), real.reader.pttl(keys[0]!)])
  return { count: Number(count), ttl }
}

/** The model's window follows the Redis key: one starts when the key appears after none or after the last one's end. */
async function followWindow(model: Model, real: Real): Promise<void> {
  const counter = await fixedCounter(real)
  if (model.window && model.now >= model.window.end) {
    model.window = null
    model.strandedFixed = 0
  }
  // Redis keeps a key through the millisecond it expires at (PTTL 0): its window has ended.
  if (counter && counter.ttl > 0 && !model.window)
    model.window = {
      start: model.now,
      end: model.now + counter.ttl,
      admitted: 0,
      lost: model.now < model.taintedUntil,
    }
}

class Request implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly policy: 'fixed' | 'bucket',
    readonly cost: number,
  ) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    await followWindow(model, real)
    const result = await real.apps[this.instance].app.rateLimiter.consume(this.policy, IDENTITY, this.cost)
    await followWindow(model, real)
    if (!result.allowed || result.degraded) return
    if (this.policy === 'bucket') model.bucket.admitted += this.cost
    else if (model.window) model.window.admitted += this.cost
    // Without a counter only a lease taken before Redis lost its data may admit.
    else assert.ok(model.now < model.taintedUntil, 'a fixed-window unit admitted with no counter in Redis')
  }
  toString() {
    return `request(${this.instance}, ${this.policy}, cost ${this.cost})`
  }
}

class Sync implements ModelCommand<Model, Real> {
  constructor(readonly instance: InstanceName) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    await real.apps[this.instance].app.rateLimiter.sync()
    model.counted[this.instance] = aliveNow(model)
    await followWindow(model, real)
  }
  toString() {
    return `sync(${this.instance})`
  }
}

class Advance implements ModelCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    model.now += this.ms
    real.clock.now = model.now
    real.server.clock.set(model.now)
    model.ghosts = model.ghosts.filter((until) => until > model.now)
    await followWindow(model, real)
  }
  toString() {
    return `advance(${this.ms})`
  }
}

/** Every key lost: the window and the bucket start again, with what instances hold still spendable. */
function loseData(model: Model, real: Real) {
  // A lease ends with the window it was taken in, at the latest a window's length from now.
  model.taintedUntil = model.now + WINDOW_MS
  model.window = null
  model.strandedFixed = 0
  model.bucket = { since: model.now, admitted: 0, heldAtStart: held(real, 'bucket') }
  // The instances' heartbeats went too: each renews its own at its next sync.
  model.ghosts = []
}

/** An instance dies with its leases: its client is cut, its app never closed; a new one takes its place. */
class Crash implements ModelCommand<Model, Real> {
  constructor(readonly instance: InstanceName) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    const dead = real.apps[this.instance]
    const report = dead.app.rateLimiter.leases().policies
    if (model.window) model.strandedFixed += report.fixed?.unitsHeld ?? 0
    dead.client.disconnect()
    real.dead.push(dead.app)
    model.ghosts.push(model.now + HEARTBEAT_MS)
    real.apps[this.instance] = await buildInstance(real)
    model.counted[this.instance] = aliveNow(model)
  }
  toString() {
    return `crash(${this.instance})`
  }
}

modelTest<Model, Real>({
  name: 'rate-limit-buffered',
  runs: 30,
  maxCommands: 50,
  commands: [
    ...Array.from({ length: 6 }, () =>
      fc
        .tuple(
          fc.constantFrom(...INSTANCES),
          fc.constantFrom<'fixed' | 'bucket'>('fixed', 'bucket'),
          fc.integer({ min: 1, max: 3 }),
        )
        .map(([instance, policy, cost]) => new Request(instance, policy, cost)),
    ),
    fc.constantFrom(...INSTANCES).map((instance) => new Sync(instance)),
    fc.constantFrom(1, 100, 250, 500, 999, 1000, 1500).map((ms) => new Advance(ms)),
    fc.constant(new Advance(HEARTBEAT_MS + 1)),
    ...dataLosses<Model, Real>(loseData),
    fc.constantFrom(...INSTANCES).map((instance) => new Crash(instance)),
  ],
  async setup() {
    const server = await startModelRedis()
    const clock = { now: server.clock.now() }
    const partial = { server, clock }
    const apps = {} as Real['apps']
    for (const name of INSTANCES) apps[name] = await buildInstance(partial)
    const reader = await server.client()
    const model: Model = {
      now: clock.now,
      window: null,
      strandedFixed: 0,
      taintedUntil: 0,
      bucket: { since: clock.now, admitted: 0, heldAtStart: 0 },
      ghosts: [],
      counted: { a: 3, b: 3, c: 3 },
    }
    return { model, real: { ...partial, apps, reader, dead: [] } }
  },
  async teardown(real) {
    for (const app of real.dead) await app.close().catch(() => {})
    for (const { app, client } of Object.values(real.apps)) {
      await app.close().catch(() => {})
      client.disconnect()
    }
    await real.server.stop()
  },
  async invariant(model, real) {
    const { window } = model
    if (window && !window.lost) {
      assert.ok(
        window.admitted <= (FIXED.limit as number),
        `fixed window: ${window.admitted} admitted of ${FIXED.limit}`,
      )
      const counter = await fixedCounter(real)
      if (counter && counter.ttl > 0) {
        const counted = window.admitted + held(real, 'fixed')
        assert.ok(counter.count >= counted, `Redis counts ${counter.count}, admitted and held ${counted}`)
        assert.ok(
          counter.count <= counted + model.strandedFixed,
          `Redis counts ${counter.count}: more than admitted and held ${counted} and stranded ${model.strandedFixed}`,
        )
      }
    }
    const { since, admitted, heldAtStart } = model.bucket
    const refill = Math.floor(((model.now - since) * (BUCKET.refillPerSecond as number)) / 1000)
    assert.ok(
      admitted <= (BUCKET.limit as number) + refill + heldAtStart,
      `token bucket: ${admitted} admitted since ${since}, capacity ${BUCKET.limit} + refill ${refill} + held ${heldAtStart}`,
    )
    // An instance counts those alive at its last heartbeat: never a crashed one whose heartbeat expired.
    for (const name of INSTANCES) {
      const { instances } = real.apps[name].app.rateLimiter.leases()
      assert.ok(
        instances <= model.counted[name],
        `${name} counts ${instances} instances of ${model.counted[name]}`,
      )
    }
  },
})
