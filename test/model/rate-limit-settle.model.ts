import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import rateLimit, { type RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { Advance, dataLosses, MODEL_EPOCH_MS, type ModelRedis, startModelRedis } from './redis.ts'

// Reserve, then reconcile (docs/rate-limit.md) against a plain token bucket: two instances on one
// Redis (the model's server, whose clock the model moves) and one on the memory store. A request
// reserves its estimate; the route settles it with the actual cost itself (`settle: true`), or a
// settle function does when the response ends. The unused part comes back (never above capacity),
// an overage is charged as debt (the balance below zero) that later requests pay. Faults: FLUSHALL,
// the loss of the key's slot and a Redis restart, as steps of their own and between a request's
// reservation and its settlement (the settlement then applies to a full bucket). Checked after
// every command: each store's balance, read through a peek's reset time, is the model's.

const CAPACITY = 8
/** Tokens per ms: 1/256, exact in binary, so balances and reset times are exact. */
const RATE = 1 / 256
const IDENTITY = 'ip:model'
type InstanceName = 'a' | 'b' | 'm'
type Path = 'route' | 'hook'

interface Bucket {
  tokens: number
  at: number
}

type Store = 'redis' | 'memory'
/** One bucket per store and policy (the policy's name is part of its key). */
type BucketName = `${Store}:${Path}`

interface Model {
  now: number
  buckets: Partial<Record<BucketName, Bucket>>
}

interface Real {
  server: ModelRedis
  clients: Redis[]
  apps: Record<InstanceName, FastifyInstance>
  urls: Record<InstanceName, string>
}

const storeOf = (instance: InstanceName): Store => (instance === 'm' ? 'memory' : 'redis')

const tokensAt = (bucket: Bucket | null, now: number) =>
  bucket ? Math.min(CAPACITY, bucket.tokens + Math.max(0, now - bucket.at) * RATE) : CAPACITY

/** The reference: a token bucket whose settlement refunds up to capacity or charges below zero. */
function decide(model: Model, bucket: BucketName, estimate: number, actual: number, lost: boolean) {
  const tokens = tokensAt(model.buckets[bucket] ?? null, model.now)
  if (tokens < estimate) return false
  // Lost between reservation and settlement (every Redis key: the other bucket too): the
  // settlement meets a full bucket.
  if (lost) for (const path of ['route', 'hook'] as const) delete model.buckets[`redis:${path}`]
  let balance = lost ? CAPACITY : tokens - estimate
  const diff = actual - estimate
  if (diff < 0) balance = Math.min(CAPACITY, balance - diff)
  else balance -= diff
  if (balance >= CAPACITY) delete model.buckets[bucket]
  else model.buckets[bucket] = { tokens: balance, at: model.now }
  return true
}

const policy = (name: string, path: Path): RateLimitPolicy => ({
  name,
  algorithm: 'token-bucket',
  limit: CAPACITY,
  refillPerSecond: RATE * 1000,
  key: () => IDENTITY,
  cost: (request) => Number((request.query as { estimate: string }).estimate),
  quotaUnit: 'tokens',
  settle: path === 'route' ? true : (_request, reply) => Number(reply.getHeader('x-actual')),
})

/** Waits until each store's balance is the model's (a hook's settlement lands after the response). */
async function balanced(model: Model, real: Real, what: string): Promise<void> {
  const deadline = Date.now() + 5000
  for (;;) {
    const mismatches: string[] = []
    for (const instance of ['a', 'm'] as const)
      for (const path of ['route', 'hook'] as const) {
        const bucket: BucketName = `${storeOf(instance)}:${path}`
        const tokens = tokensAt(model.buckets[bucket] ?? null, model.now)
        // A peek: the time until full is (capacity - balance) / rate, exact at this rate.
        const seen = await real.apps[instance].rateLimiter.consume(`tokens-${path}`, IDENTITY, 0)
        const expected = {
          resetMs: Math.ceil((CAPACITY - tokens) / RATE),
          remaining: Math.max(0, Math.floor(tokens)),
        }
        if (seen.resetMs !== expected.resetMs || seen.remaining !== expected.remaining)
          mismatches.push(
            `${bucket}: reset ${seen.resetMs} ms, ${seen.remaining} left; the model ${expected.resetMs} ms, ${expected.remaining} (balance ${tokens})`,
          )
      }
    if (mismatches.length === 0) return
    assert.ok(Date.now() < deadline, `${what}: ${mismatches.join('; ')}`)
    await sleep(10)
  }
}

class Request implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly path: Path,
    readonly estimate: number,
    readonly actual: number,
    /** Redis loses its data after the reservation, before the settlement. */
    readonly lose: boolean,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const store = storeOf(this.instance)
    const lost = this.lose && store === 'redis'
    const admitted = decide(model, `${store}:${this.path}`, this.estimate, this.actual, lost)
    const res = await fetch(
      `${real.urls[this.instance]}/${this.path}?estimate=${this.estimate}&actual=${this.actual}&lose=${lost}`,
    )
    await res.arrayBuffer()
    assert.equal(res.status, admitted ? 200 : 429, `${this} answered`)
    await balanced(model, real, `after ${this}`)
  }
  toString = () =>
    `request(${this.instance}, ${this.path}, ${this.estimate} -> ${this.actual}${this.lose ? ', lost' : ''})`
}

const instances = fc.constantFrom<InstanceName>('a', 'b', 'm')
const request = fc
  .tuple(
    instances,
    fc.constantFrom<Path>('route', 'hook'),
    fc.integer({ min: 1, max: 4 }),
    fc.integer({ min: 0, max: 20 }),
    fc.boolean(),
  )
  .map(([i, p, e, a, l]) => new Request(i, p, e, a, l))

modelTest<Model, Real>({
  name: 'rate-limit-settle',
  runs: 25,
  maxCommands: 30,
  commands: [
    request,
    request,
    request,
    fc.constantFrom(1, 256, 1024, 4096).map((ms) => new Advance<Model, Real>(ms)),
    ...dataLosses<Model, Real>((model) => {
      delete model.buckets['redis:route']
      delete model.buckets['redis:hook']
    }),
  ],
  async setup() {
    const server = await startModelRedis()
    server.clock.set(MODEL_EPOCH_MS)
    const clients = [await server.client(), await server.client()]
    const prefix = `rls${Date.now().toString(36)}:`
    const build = async (client: Redis | null) => {
      const app = Fastify()
      const namedPolicies = [policy('tokens-route', 'route'), policy('tokens-hook', 'hook')]
      await app.register(
        rateLimit,
        client
          ? // The private server never stalls: a slow answer on a loaded machine is not an outage.
            { redis: client, keyPrefix: prefix, namedPolicies, timeoutMs: 60_000 }
          : { store: 'memory', keyPrefix: prefix, namedPolicies, now: () => server.clock.now() },
      )
      for (const path of ['route', 'hook'] as const)
        app.get(`/${path}`, { config: { rateLimits: `tokens-${path}` } }, async (request, reply) => {
          const query = request.query as { actual: string; lose: string }
          if (query.lose === 'true') await server.flushAll()
          if (path === 'route') await app.rateLimiter.settle(request, 'tokens-route', Number(query.actual))
          else reply.header('x-actual', query.actual)
          return 'ok'
        })
      return { app, url: await app.listen({ port: 0, host: '127.0.0.1' }) }
    }
    const built = { a: await build(clients[0]!), b: await build(clients[1]!), m: await build(null) }
    const pick = <T>(f: (x: (typeof built)['a']) => T) =>
      ({ a: f(built.a), b: f(built.b), m: f(built.m) }) as Record<InstanceName, T>
    return {
      model: { now: MODEL_EPOCH_MS, buckets: {} },
      real: { server, clients, apps: pick((x) => x.app), urls: pick((x) => x.url) },
    }
  },
  async teardown(real) {
    for (const app of Object.values(real.apps)) await app.close()
    await real.server.stop()
  },
  async invariant(model, real) {
    await balanced(model, real, 'balances')
  },
})
