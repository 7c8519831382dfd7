import assert from 'node:assert/strict'
import { Writable } from 'node:stream'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import rateLimit, { type RateLimitPolicy, type RateLimitResult } from '../../src/plugins/rate-limit/index.ts'
import { identityTag } from '../../src/plugins/rate-limit/keys.ts'
import { hashSlot } from '../../src/redis/keys.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { Advance, dataLosses, type ModelRedis, stallAfterNextCommand, startModelRedis } from './redis.ts'

/**
 * Every rate-limit algorithm against an exact reference on a controlled clock. Three plugin
 * instances: `a` and `b` share one Redis (the model's redis-server, whose clock the model sets; `b`
 * reads its own clock with a skew the model draws), `m` keeps its counters in memory. Each request's
 * answer (allowed, remaining, reset, retry after, limit) must be the reference's. Faults: FLUSHALL,
 * the loss of one identity's hash slot, a Redis restart, an instance restart (its over-limit cache,
 * or the memory store, is lost), a jump of `b`'s clock, and a rolling deploy that changes a policy's
 * limit and window on one instance while the other still runs the old settings. Each instance also
 * has a shadow twin of every policy (same settings, its own keys) on a route: through it a request is
 * always answered 200, with the twin's headers as the reference says, and logged as a would-be
 * refusal exactly when the reference refuses it. And a stalled process: `a` bounds its Redis calls
 * by `timeoutMs`, and a request whose process blocks past that bound after its call left (its
 * reply in the socket meanwhile) is still answered by Redis, as the reference says.
 */

type Algorithm = 'fixed-window' | 'sliding-log' | 'sliding-counter' | 'token-bucket' | 'gcra'
const ALGORITHMS: Algorithm[] = ['fixed-window', 'sliding-log', 'sliding-counter', 'token-bucket', 'gcra']
type InstanceName = 'a' | 'b' | 'm'
const IDENTITIES = ['x', 'y'] as const

/** limit and window (ms) per algorithm, two settings each (a deploy switches); token buckets refill 1/256 or 1/128 per ms, exact in binary. */
interface Setting {
  limit: number
  windowMs: number
  refillPerSecond: number
}
const SETTINGS: Record<Algorithm, [Setting, Setting]> = {
  'fixed-window': [
    { limit: 3, windowMs: 1000, refillPerSecond: 0 },
    { limit: 5, windowMs: 600, refillPerSecond: 0 },
  ],
  'sliding-log': [
    { limit: 3, windowMs: 1000, refillPerSecond: 0 },
    { limit: 5, windowMs: 600, refillPerSecond: 0 },
  ],
  'sliding-counter': [
    { limit: 4, windowMs: 1000, refillPerSecond: 0 },
    { limit: 6, windowMs: 800, refillPerSecond: 0 },
  ],
  'token-bucket': [
    { limit: 3, windowMs: 0, refillPerSecond: 1000 / 256 },
    { limit: 5, windowMs: 0, refillPerSecond: 1000 / 128 },
  ],
  gcra: [
    { limit: 4, windowMs: 1000, refillPerSecond: 0 },
    { limit: 5, windowMs: 800, refillPerSecond: 0 },
  ],
}

const policyName = (algorithm: Algorithm) => `model-${algorithm}`
const shadowName = (algorithm: Algorithm) => `shadow-${algorithm}`
/** The model's name of an identity as the shadow twin counts it: its own keys, the same slot. */
const SHADOW = 'shadow:'
const baseIdentity = (identity: string) =>
  identity.startsWith(SHADOW) ? identity.slice(SHADOW.length) : identity

/** The shadow twin of each policy, keyed by `?id=` and costing `?cost=`, its headers shown. */
function shadowsOf(settings: Record<Algorithm, 0 | 1>): RateLimitPolicy[] {
  return policiesOf(settings).map((policy) => ({
    ...policy,
    name: shadowName(policy.algorithm as Algorithm),
    key: (request) => (request.query as { id: string }).id,
    cost: (request) => Number((request.query as { cost: string }).cost),
    shadow: { headers: true },
  }))
}

function policiesOf(settings: Record<Algorithm, 0 | 1>): RateLimitPolicy[] {
  return ALGORITHMS.map((algorithm) => {
    const { limit, windowMs, refillPerSecond } = SETTINGS[algorithm][settings[algorithm]]
    return algorithm === 'token-bucket'
      ? { name: policyName(algorithm), algorithm, limit, refillPerSecond }
      : { name: policyName(algorithm), algorithm, limit, windowMs }
  })
}

// ---------------------------------------------------------------------------------------------
// The reference: what each algorithm promises (docs/rate-limit.md), on whole milliseconds. A key
// lives until its expiry time, excluded: a window of W ms that starts at t covers [t, t + W).

interface KeyState {
  expiresAt: number
  /** fixed window: units counted in the window */
  count: number
  /** sliding log: admitted unit times, ascending */
  times: number[]
  /** sliding counter: window index, its count, the previous window's */
  index: number
  current: number
  previous: number
  /** token bucket: tokens at `at` */
  tokens: number
  at: number
  /** GCRA: theoretical arrival time */
  tat: number
}

interface Answer {
  allowed: boolean
  remaining: number
  resetMs: number
  /** when rejected: ms until the same request passes, time alone passing */
  retryMs: number
  next: KeyState | undefined
}

const blank = (): KeyState => ({
  expiresAt: 0,
  count: 0,
  times: [],
  index: 0,
  current: 0,
  previous: 0,
  tokens: 0,
  at: 0,
  tat: 0,
})

/** One request of `cost` at `now` against a key in `state` (undefined or expired: none). */
function decide(
  algorithm: Algorithm,
  setting: Setting,
  stored: KeyState | undefined,
  now: number,
  cost: number,
): Omit<Answer, 'retryMs'> {
  const state = stored && now < stored.expiresAt ? stored : undefined
  const { limit, windowMs: window } = setting
  switch (algorithm) {
    case 'fixed-window': {
      const count = state?.count ?? 0
      const end = state ? state.expiresAt : now + window
      if (count + cost <= limit)
        return {
          allowed: true,
          remaining: limit - count - cost,
          resetMs: end - now,
          next: { ...blank(), count: count + cost, expiresAt: end },
        }
      return { allowed: false, remaining: Math.max(0, limit - count), resetMs: end - now, next: state }
    }
    case 'sliding-log': {
      const times = (state?.times ?? []).filter((t) => t > now - window)
      const oldest = times[0]
      if (times.length + cost <= limit) {
        const after = [...times, ...Array(cost).fill(now)]
        return {
          allowed: true,
          remaining: limit - after.length,
          resetMs: oldest === undefined ? window : Math.max(1, oldest + window - now),
          // The log's TTL is never shortened: an instance with a longer window still counts it.
          next: { ...blank(), times: after, expiresAt: Math.max(state?.expiresAt ?? 0, now + window) },
        }
      }
      return {
        allowed: false,
        remaining: Math.max(0, limit - times.length),
        resetMs: oldest === undefined ? window : Math.max(1, oldest + window - now),
        next: state && times.length > 0 ? { ...state, times } : undefined,
      }
    }
    case 'sliding-counter': {
      const index = Math.floor(now / window)
      const elapsed = now - index * window
      let current = 0
      let previous = 0
      if (state && state.index === index) {
        current = state.current
        previous = state.previous
      } else if (state && state.index === index - 1) previous = state.current
      const estimate = (previous * (window - elapsed)) / window + current
      if (estimate + cost <= limit)
        return {
          allowed: true,
          remaining: Math.max(0, Math.floor(limit - (estimate + cost))),
          resetMs: window - elapsed,
          next: { ...blank(), index, current: current + cost, previous, expiresAt: (index + 2) * window },
        }
      return {
        allowed: false,
        remaining: Math.max(0, Math.floor(limit - estimate)),
        resetMs: window - elapsed,
        next: state,
      }
    }
    case 'token-bucket': {
      const rate = setting.refillPerSecond / 1000
      const tokens = state ? Math.min(limit, state.tokens + Math.max(0, now - state.at) * rate) : limit
      const untilFull = (left: number) => Math.ceil((limit - left) / rate)
      if (tokens >= cost) {
        const left = tokens - cost
        return {
          allowed: true,
          remaining: Math.floor(left),
          resetMs: untilFull(left),
          next: { ...blank(), tokens: left, at: now, expiresAt: now + Math.max(1, untilFull(left)) },
        }
      }
      return { allowed: false, remaining: Math.floor(tokens), resetMs: untilFull(tokens), next: state }
    }
    case 'gcra': {
      const interval = window / limit
      const tat = Math.max(state?.tat ?? now, now)
      const next = tat + cost * interval
      const left = (at: number) => Math.max(0, Math.floor((window - (at - now)) / interval + 1e-6))
      if (next - now <= window)
        return {
          allowed: true,
          remaining: left(next),
          resetMs: Math.ceil(next - now),
          next: { ...blank(), tat: next, expiresAt: now + Math.max(1, Math.ceil(next - now)) },
        }
      return { allowed: false, remaining: left(tat), resetMs: Math.ceil(tat - now), next: state }
    }
  }
}

/** The request decided, with its retry time found by trying each later millisecond. */
function answer(
  algorithm: Algorithm,
  setting: Setting,
  state: KeyState | undefined,
  now: number,
  cost: number,
): Answer {
  const decided = decide(algorithm, setting, state, now, cost)
  // Cost 0 is a peek: it changes nothing.
  if (cost === 0) decided.next = state
  let retryMs = 0
  if (!decided.allowed) {
    const horizon =
      3 * Math.max(setting.windowMs, Math.ceil((setting.limit * 1000) / (setting.refillPerSecond || 1)))
    for (retryMs = 1; retryMs <= horizon; retryMs++)
      if (decide(algorithm, setting, state, now + retryMs, cost).allowed) break
  }
  return { ...decided, retryMs }
}

// ---------------------------------------------------------------------------------------------

interface Cached {
  until: number
  cost: number
  remaining: number
  limit: number
}

interface History {
  /** Admitted units of a store's key since its last loss, with their times. */
  units: Array<{ at: number; cost: number }>
  setting: Setting
}

interface Model {
  now: number
  skew: number
  settings: Record<InstanceName, Record<Algorithm, 0 | 1>>
  /** Redis keys and the memory store's, by `algorithm|identity|setting key`. */
  redis: Map<string, KeyState>
  memory: Map<string, KeyState>
  /** The over-limit cache of each Redis instance, by `algorithm|identity`, until that instance's clock. */
  cache: Record<'a' | 'b', Map<string, Cached>>
  /** Admissions per key since the key was last lost or its setting changed: the docs' bounds hold over them. */
  history: Map<string, History>
  /** The previous request's instance, algorithm and identity. */
  last: { instance: InstanceName; algorithm: Algorithm; identity: string } | null
}

interface Real {
  server: ModelRedis
  client: Redis
  stall: ReturnType<typeof stallAfterNextCommand>
  apps: Record<InstanceName, FastifyInstance>
  skew: { ms: number }
  prefix: string
  /** Per instance: the shadow twins' would-be refusals logged since the last shadow request. */
  wouldReject: Record<InstanceName, string[]>
}

/**
 * The sliding counter's key carries its window: a deploy that changes the window starts a fresh
 * counter. The other algorithms keep their key and read its state under the new setting.
 */
function stateKey(algorithm: Algorithm, identity: string, setting: Setting): string {
  return algorithm === 'sliding-counter'
    ? `${algorithm}|${identity}|${setting.windowMs}`
    : `${algorithm}|${identity}`
}

/** Instance a's bound on a Redis call, and how long a stalled request blocks its process: longer. */
const A_TIMEOUT_MS = 1000
const STALL_MS = 1100

async function buildInstance(
  real: Pick<Real, 'client' | 'skew' | 'server' | 'prefix' | 'wouldReject'>,
  name: InstanceName,
  settings: Record<Algorithm, 0 | 1>,
) {
  const logged = real.wouldReject[name]
  const stream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split('\n')) {
        if (!line) continue
        const entry = JSON.parse(line) as { msg: string; policy: string; key: string }
        if (entry.msg === 'shadow rate-limit policy would reject') logged.push(`${entry.policy}|${entry.key}`)
      }
      done()
    },
  })
  const app = Fastify({ logger: { level: 'info', stream }, disableRequestLogging: true })
  const now = name === 'b' ? () => real.server.clock.now() + real.skew.ms : () => real.server.clock.now()
  await app.register(
    rateLimit,
    name === 'm'
      ? { store: 'memory', keyPrefix: real.prefix, namedPolicies: policiesOf(settings), now }
      : {
          redis: real.client,
          keyPrefix: real.prefix,
          namedPolicies: policiesOf(settings),
          now,
          // The private server never stalls: a slow answer on a loaded machine is not an outage.
          // Instance a's bound is what a stalled request outlasts (long enough for a loaded machine).
          timeoutMs: name === 'a' ? A_TIMEOUT_MS : 60_000,
        },
  )
  await app.register(async (scope) => {
    for (const policy of shadowsOf(settings))
      scope.get(`/shadow/${policy.algorithm}`, { config: { rateLimits: policy } }, async () => 'ok')
  })
  await app.ready()
  return app
}

const instanceNow = (model: Model, name: InstanceName) => model.now + (name === 'b' ? model.skew : 0)

/**
 * The reference's answer to a request of `identity` under `algorithm` on `instance` (its over-limit
 * cache, else the store's state), the model updated as the real system must be.
 */
function expectedAnswer(
  model: Model,
  instance: InstanceName,
  algorithm: Algorithm,
  identity: string,
  cost: number,
) {
  const setting = SETTINGS[algorithm][model.settings[instance][algorithm]]
  const store = instance === 'm' ? model.memory : model.redis
  const key = stateKey(algorithm, identity, setting)
  const cacheKey = `${algorithm}|${identity}`
  const cache = instance === 'm' ? undefined : model.cache[instance]
  const local = instanceNow(model, instance)
  let expected: Omit<RateLimitResult, 'degraded' | 'banned' | 'banReached' | 'delayMs'>
  const cached = cache?.get(cacheKey)
  if (cached && cost > 0 && local < cached.until && cost >= cached.cost) {
    // Answered from the instance's over-limit cache, without Redis.
    const left = cached.until - local
    expected = {
      allowed: false,
      remaining: cached.remaining,
      retryAfterMs: left,
      limit: cached.limit,
      resetMs: left,
    }
  } else {
    if (cost > 0) cache?.delete(cacheKey)
    const decided = answer(algorithm, setting, store.get(key), model.now, cost)
    if (decided.next) store.set(key, decided.next)
    else store.delete(key)
    expected = {
      allowed: decided.allowed,
      remaining: decided.remaining,
      retryAfterMs: decided.allowed ? 0 : decided.retryMs,
      limit: setting.limit,
      resetMs: decided.resetMs,
    }
    if (!decided.allowed && cache && cost > 0)
      cache.set(cacheKey, {
        until: local + decided.retryMs,
        cost,
        remaining: decided.remaining,
        limit: setting.limit,
      })
    if (decided.allowed && cost > 0) {
      const historyKey = `${instance === 'm' ? 'm' : 'r'}|${key}`
      const history = model.history.get(historyKey)
      if (!history || history.setting !== setting) model.history.set(historyKey, { units: [], setting })
      model.history.get(historyKey)!.units.push({ at: model.now, cost })
    }
  }
  return expected
}

class Request implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly algorithm: Algorithm,
    readonly identity: string,
    readonly cost: number,
    /** The same instance, algorithm and identity as the previous request: histories long enough to reach the edges. */
    readonly again: boolean,
    /** On instance a, the process stalls past its bound once its script call has left. */
    readonly stalled = false,
  ) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    const { cost } = this
    const { instance, algorithm, identity } = this.again && model.last ? model.last : this
    model.last = { instance, algorithm, identity }
    const expected = expectedAnswer(model, instance, algorithm, identity, cost)
    if (this.stalled && instance === 'a') await real.stall.arm(STALL_MS)
    const result = await real.apps[instance].rateLimiter
      .consume(policyName(algorithm), identity, cost)
      .finally(() => real.stall.disarm())
    assert.equal(result.degraded, false, 'decided without Redis')
    const { allowed, remaining, retryAfterMs, limit, resetMs } = result
    console.log(
      this.toString(),
      JSON.stringify(expected),
      JSON.stringify({ allowed, remaining, retryAfterMs, limit, resetMs }),
    )
    assert.deepEqual({ allowed, remaining, retryAfterMs, limit, resetMs }, expected)
  }
  toString() {
    const stalled = this.stalled ? ', stalled' : ''
    if (this.again) return `request(again, cost ${this.cost}${stalled})`
    return `request(${this.instance}, ${this.algorithm}, ${this.identity}, cost ${this.cost}${stalled})`
  }
}

/** A request through the shadow twin's route: always 200, its headers and would-be refusal as the reference says. */
class ShadowRequest implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly algorithm: Algorithm,
    readonly identity: string,
    readonly cost: number,
  ) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    const { instance, algorithm, identity, cost } = this
    const expected = expectedAnswer(model, instance, algorithm, `${SHADOW}${identity}`, cost)
    const logged = real.wouldReject[instance]
    logged.length = 0
    const res = await real.apps[instance].inject({ url: `/shadow/${algorithm}?id=${identity}&cost=${cost}` })
    assert.equal(res.statusCode, 200, 'a shadow policy never refuses')
    assert.equal(
      res.headers.ratelimit,
      `"${shadowName(algorithm)}";r=${expected.remaining};t=${Math.ceil(expected.resetMs / 1000)}`,
    )
    assert.deepEqual(logged, expected.allowed ? [] : [`${shadowName(algorithm)}|${identity}`], 'would reject')
  }
  toString() {
    return `shadowRequest(${this.instance}, ${this.algorithm}, ${this.identity}, cost ${this.cost})`
  }
}

/**
 * The clock moves to a moment where an answer changes (a key's expiry, a window's end, a cached
 * rejection's end, a logged unit leaving its window), or 1 ms either side: where off-by-ones live.
 */
class AdvanceToEdge implements ModelCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly offset: -1 | 0 | 1,
  ) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    const edges: number[] = []
    for (const [key, state] of [...model.redis, ...model.memory]) {
      edges.push(state.expiresAt)
      const algorithm = key.split('|')[0] as Algorithm
      for (const setting of SETTINGS[algorithm]) {
        if (algorithm === 'sliding-log') for (const t of state.times) edges.push(t + setting.windowMs)
        if (algorithm === 'sliding-counter')
          edges.push((Math.floor(model.now / setting.windowMs) + 1) * setting.windowMs)
        if (algorithm === 'gcra') edges.push(Math.ceil(state.tat - setting.windowMs))
      }
    }
    for (const name of ['a', 'b'] as const)
      for (const cached of model.cache[name].values())
        edges.push(cached.until - instanceNow(model, name) + model.now)
    const ahead = [...new Set(edges.map((edge) => edge + this.offset))]
      .filter((edge) => edge > model.now)
      .sort((x, y) => x - y)
    if (ahead.length === 0) return
    model.now = ahead[this.pick % ahead.length]!
    real.server.clock.set(model.now)
  }
  toString() {
    return `advanceToEdge(${this.pick}, ${this.offset})`
  }
}

/** Every Redis key is lost (FLUSHALL, or a restart of a server without persistence). */
function loseRedis(model: Model) {
  model.redis.clear()
  for (const key of [...model.history.keys()]) if (key.startsWith('r|')) model.history.delete(key)
}

/** One identity's hash slot loses its keys (as one Cluster node losing its data); an identity sharing the slot loses them too. */
class DropSlot implements ModelCommand<Model, Real> {
  constructor(readonly identity: string) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    const slot = hashSlot(identityTag(this.identity))
    const lost = IDENTITIES.filter((identity) => hashSlot(identityTag(identity)) === slot)
    // A shadow twin's keys share their identity's slot.
    for (const key of [...model.redis.keys()])
      if (lost.includes(baseIdentity(key.split('|')[1]!) as never)) model.redis.delete(key)
    for (const key of [...model.history.keys()])
      if (key.startsWith('r|') && lost.includes(baseIdentity(key.split('|')[2]!) as never))
        model.history.delete(key)
    await real.server.dropSlot(identityTag(this.identity))
  }
  toString() {
    return `dropSlot(${this.identity})`
  }
}

/** Instance b's clock jumps (NTP stepping it): only what that process times with its own clock moves. */
class SkewB implements ModelCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    model.skew = this.ms
    real.skew.ms = this.ms
  }
  toString() {
    return `skewB(${this.ms})`
  }
}

/** An instance restarts, with `settings` (a rolling deploy when they differ from the other instance's). */
class Deploy implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly algorithm: Algorithm,
    readonly setting: 0 | 1,
  ) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    const { instance } = this
    model.settings[instance] = { ...model.settings[instance], [this.algorithm]: this.setting }
    if (instance === 'm') {
      model.memory.clear()
      for (const key of [...model.history.keys()]) if (key.startsWith('m|')) model.history.delete(key)
    } else model.cache[instance].clear()
    await real.apps[instance].close()
    real.apps[instance] = await buildInstance(real, instance, model.settings[instance])
  }
  toString() {
    return `deploy(${this.instance}, ${this.algorithm} setting ${this.setting})`
  }
}

/** The docs' bounds on what a key admits, over the trailing window of its last admission. */
function checkBounds(model: Model) {
  for (const [key, { units, setting }] of model.history) {
    const algorithm = key.split('|')[1] as Algorithm
    const last = units.at(-1)
    if (!last) continue
    const { limit, windowMs: window } = setting
    const within = (span: number) =>
      units.filter((u) => u.at > last.at - span).reduce((sum, u) => sum + u.cost, 0)
    if (algorithm === 'sliding-log')
      assert.ok(within(window) <= limit, `${key}: over ${limit} in ${window} ms`)
    if (algorithm === 'fixed-window')
      assert.ok(within(window) <= 2 * limit, `${key}: over 2 × ${limit} in ${window} ms`)
    if (algorithm === 'gcra') {
      const first = units[0]!.at
      const span = last.at - first
      assert.ok(
        within(span + 1) <= limit + Math.floor(span / (window / limit)),
        `${key}: over the GCRA bound`,
      )
    }
    if (algorithm === 'token-bucket') {
      const span = last.at - units[0]!.at
      assert.ok(
        within(span + 1) <= limit + span * (setting.refillPerSecond / 1000),
        `${key}: over the bucket`,
      )
    }
  }
}

const instances = fc.constantFrom<InstanceName>('a', 'b', 'm')
const algorithms = fc.constantFrom(...ALGORITHMS)
const identities = fc.constantFrom(...IDENTITIES)
const toEdges = fc
  .tuple(fc.nat(3), fc.constantFrom<-1 | 0 | 1>(-1, 0, 0, 1))
  .map(([pick, offset]) => new AdvanceToEdge(pick, offset))
// Mostly one identity, so that requests meet the same keys often enough to reach their limits.
const requests = fc
  .tuple(
    instances,
    algorithms,
    fc.constantFrom('x', 'x', 'x', 'y'),
    fc.integer({ min: 0, max: 3 }),
    fc.constantFrom(true, true, false),
    // About one request in 25 stalls (each stall costs STALL_MS of the run's time).
    fc.integer({ min: 0, max: 24 }).map((n) => n === 0),
  )
  .map(
    ([instance, algorithm, identity, cost, again, stalled]) =>
      new Request(instance, algorithm, identity, cost, again, stalled),
  )

// Costs from 1: a cost of 0 skips a route's policy (no decision, no header).
const shadowRequests = fc
  .tuple(instances, algorithms, fc.constantFrom('x', 'x', 'x', 'y'), fc.integer({ min: 1, max: 3 }))
  .map(([instance, algorithm, identity, cost]) => new ShadowRequest(instance, algorithm, identity, cost))

modelTest<Model, Real>({
  name: 'rate-limit',
  runs: 40,
  maxCommands: 60,
  commands: [
    ...Array.from({ length: 8 }, () => requests),
    ...Array.from({ length: 2 }, () => shadowRequests),
    fc
      .oneof(
        fc.constantFrom(1, 128, 160, 200, 250, 256, 400, 600, 800, 1000),
        fc.integer({ min: 0, max: 1500 }),
      )
      .map((ms) => new Advance<Model, Real>(ms)),
    ...Array.from({ length: 3 }, () => toEdges),
    ...dataLosses<Model, Real>(loseRedis),
    identities.map((identity) => new DropSlot(identity)),
    fc.constantFrom(-5000, -700, 0, 300, 5000).map((ms) => new SkewB(ms)),
    fc.tuple(instances, algorithms, fc.constantFrom<0 | 1>(0, 1)).map(([i, a, s]) => new Deploy(i, a, s)),
  ],
  async setup() {
    const server = await startModelRedis()
    const client = await server.client()
    const zero = {
      'fixed-window': 0,
      'sliding-log': 0,
      'sliding-counter': 0,
      'token-bucket': 0,
      gcra: 0,
    } as const
    const partial = {
      server,
      client,
      stall: stallAfterNextCommand(client),
      skew: { ms: 0 },
      prefix: 'rl:',
      wouldReject: { a: [], b: [], m: [] },
    }
    const apps = {
      a: await buildInstance(partial, 'a', zero),
      b: await buildInstance(partial, 'b', zero),
      m: await buildInstance(partial, 'm', zero),
    }
    const model: Model = {
      now: server.clock.now(),
      skew: 0,
      settings: { a: { ...zero }, b: { ...zero }, m: { ...zero } },
      redis: new Map(),
      memory: new Map(),
      cache: { a: new Map(), b: new Map() },
      history: new Map(),
      last: null,
    }
    return { model, real: { ...partial, apps } }
  },
  async teardown(real) {
    for (const app of Object.values(real.apps)) await app.close()
    await real.server.stop()
  },
  async invariant(model) {
    checkBounds(model)
  },
})
