import assert from 'node:assert/strict'
import http from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import rateLimit, { type RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { Advance, dataLosses, MODEL_EPOCH_MS, type ModelRedis, startModelRedis } from './redis.ts'

// Concurrency policies (docs/rate-limit.md, "Requests in flight") against a plain model of the
// slots: two instances on one Redis (the model's server, whose clock the model moves) and one on
// the memory store, each with a route whose requests run until the model finishes or aborts them.
// A request is admitted exactly when fewer than `limit` slots of its key are live (taken, not
// given back, lease not ended); a finished or aborted request's slot comes back; a lease that ends
// frees its slot while the request still runs. Faults: FLUSHALL and a Redis restart (every slot
// forgotten, the requests still running). Checked after every command: the free slots each store
// reports are the model's.

const LIMIT = 3
const LEASE_MS = 1000
const KEYS = ['k1', 'k2'] as const
type InstanceName = 'a' | 'b' | 'm'

interface Slot {
  id: number
  key: string
  /** The Redis instances share their slots; the memory instance has its own. */
  store: 'redis' | 'memory'
  end: number
  /** Still counted: not given back, not lost with Redis's data. */
  held: boolean
}

interface Model {
  now: number
  slots: Slot[]
}

interface Running {
  id: number
  instance: InstanceName
  slot: Slot
  finish(): void
  abort(): void
}

interface Real {
  server: ModelRedis
  clients: Redis[]
  apps: Record<InstanceName, { app: FastifyInstance; url: string }>
  running: Running[]
  /** Handlers waiting, by request id. */
  gates: Map<number, () => void>
  started: Map<number, () => void>
  nextId: number
}

const storeOf = (instance: InstanceName) => (instance === 'm' ? 'memory' : 'redis')

const live = (model: Model, store: 'redis' | 'memory', key: string) =>
  model.slots.filter((s) => s.store === store && s.key === key && s.held && s.end > model.now).length

const POLICY: RateLimitPolicy = {
  name: 'jobs',
  algorithm: 'concurrency',
  limit: LIMIT,
  leaseMs: LEASE_MS,
  key: (request) => String(request.headers['x-key']),
}

/** Free slots of `key` as `instance`'s store reports them (a peek: cost 0 takes none). */
const free = async (real: Real, instance: InstanceName, key: string) =>
  (await real.apps[instance].app.rateLimiter.consume('jobs', key, 0)).remaining

/** Waits until the stores report what the model says (a slot's give-back lands after the response closed). */
async function settled(model: Model, real: Real, what: string): Promise<void> {
  const deadline = Date.now() + 5000
  for (;;) {
    const mismatches: string[] = []
    for (const instance of ['a', 'm'] as const)
      for (const key of KEYS) {
        const expected = LIMIT - live(model, storeOf(instance), key)
        const seen = await free(real, instance, key)
        if (seen !== expected)
          mismatches.push(`${storeOf(instance)} ${key}: ${seen} free, the model ${expected}`)
      }
    if (mismatches.length === 0) return
    assert.ok(Date.now() < deadline, `${what}: ${mismatches.join('; ')}`)
    await sleep(10)
  }
}

class Start implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly key: string,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const store = storeOf(this.instance)
    const admitted = live(model, store, this.key) < LIMIT
    const id = real.nextId++
    const started = new Promise<void>((resolve) => real.started.set(id, resolve))
    const request = http.request(`${real.apps[this.instance].url}/`, {
      headers: { 'x-key': this.key, 'x-id': String(id) },
    })
    const answered = new Promise<number>((resolve) => {
      request.on('response', (res) => {
        res.resume()
        resolve(res.statusCode ?? 0)
      })
      request.on('error', () => resolve(0))
    })
    request.end()
    const first = await Promise.race([started.then(() => 'started' as const), answered])
    if (!admitted) {
      assert.equal(first, 429, `request ${id} on ${this.instance} (${this.key}) refused`)
      return
    }
    assert.equal(first, 'started', `request ${id} on ${this.instance} (${this.key}) admitted`)
    const slot: Slot = { id, key: this.key, store, end: model.now + LEASE_MS, held: true }
    model.slots.push(slot)
    real.running.push({
      id,
      instance: this.instance,
      slot,
      finish: () => real.gates.get(id)?.(),
      abort: () => request.destroy(),
    })
  }
  toString = () => `start(${this.instance}, ${this.key})`
}

/** A running request ends: finished (its response sent) or aborted by its client. */
class End implements ModelCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly how: 'finish' | 'abort',
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    if (real.running.length === 0) return
    const [running] = real.running.splice(this.pick % real.running.length, 1)
    running!.slot.held = false
    running![this.how]()
    await settled(model, real, `after request ${running!.id} ended (${this.how})`)
  }
  toString = () => `end(${this.pick}, ${this.how})`
}

const instances = fc.constantFrom<InstanceName>('a', 'b', 'm')
const keys = fc.constantFrom(...KEYS)

modelTest<Model, Real>({
  name: 'concurrency',
  runs: 25,
  maxCommands: 30,
  commands: [
    fc.tuple(instances, keys).map(([i, k]) => new Start(i, k)),
    fc.tuple(instances, keys).map(([i, k]) => new Start(i, k)),
    fc.tuple(instances, keys).map(([i, k]) => new Start(i, k)),
    fc
      .tuple(fc.nat(5), fc.constantFrom<'finish' | 'abort'>('finish', 'abort'))
      .map(([p, h]) => new End(p, h)),
    fc
      .tuple(fc.nat(5), fc.constantFrom<'finish' | 'abort'>('finish', 'abort'))
      .map(([p, h]) => new End(p, h)),
    fc.constantFrom(1, 500, 999, 1000, 1001).map((ms) => new Advance<Model, Real>(ms)),
    ...dataLosses<Model, Real>((model) => {
      for (const slot of model.slots) if (slot.store === 'redis') slot.held = false
    }),
  ],
  async setup() {
    const server = await startModelRedis()
    server.clock.set(MODEL_EPOCH_MS)
    const clients = [await server.client(), await server.client()]
    const gates = new Map<number, () => void>()
    const started = new Map<number, () => void>()
    const prefix = `rlc${Date.now().toString(36)}:`
    const build = async (client: Redis | null) => {
      const app = Fastify()
      await app.register(
        rateLimit,
        client
          ? // The private server never stalls: a slow answer on a loaded machine is not an outage.
            { redis: client, keyPrefix: prefix, namedPolicies: [POLICY], timeoutMs: 60_000 }
          : { store: 'memory', keyPrefix: prefix, namedPolicies: [POLICY], now: () => server.clock.now() },
      )
      app.get('/', { config: { rateLimits: 'jobs' } }, async (request) => {
        const id = Number(request.headers['x-id'])
        await new Promise<void>((resolve) => {
          gates.set(id, resolve)
          started.get(id)?.()
        })
        return 'done'
      })
      const url = await app.listen({ port: 0, host: '127.0.0.1' })
      return { app, url }
    }
    const apps = { a: await build(clients[0]!), b: await build(clients[1]!), m: await build(null) }
    return {
      model: { now: MODEL_EPOCH_MS, slots: [] },
      real: { server, clients, apps, running: [], gates, started, nextId: 1 },
    }
  },
  async teardown(real) {
    // Every handler still waiting ends (a request the model refused but the real system admitted included).
    for (const finish of real.gates.values()) finish()
    for (const { app } of Object.values(real.apps)) await app.close()
    await real.server.stop()
  },
  async invariant(model, real) {
    await settled(model, real, 'free slots')
  },
})
