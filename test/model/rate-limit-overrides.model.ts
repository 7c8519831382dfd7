import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Redis } from 'ioredis'
import rateLimit, { overrideKeys, type RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'
import { AUDIT_LENGTH, MAX_OVERRIDES, OVERRIDE } from '../../src/plugins/rate-limit/override-store.ts'
import { callScript } from '../../src/redis/scripts.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { Advance, dataLosses, MODEL_EPOCH_MS, type ModelRedis, startModelRedis } from './redis.ts'

// Rate-limit overrides (docs/rate-limit.md, "Overrides") against a plain table of them: two
// instances on one Redis (the model's server; its clock, which the instances read too, is the
// model's) and one on the memory store (overrides of its own). Changes are made through an
// instance's API, or written to Redis by an operator whose message is lost (only the version
// moves). Faults: FLUSHALL and a Redis restart (every override lost: the policy's limit applies
// again). Checked: the instance that made a change applies it before the call resolves; every
// instance applies the model's table within the poll bound; for each probed identity, the limit is
// its own override's, else the most specific IP range's in force, else the policy's.

const POLL_MS = 100
/** What "within the bound" is given here: the poll, and time for a loaded machine. */
const BOUND_MS = 3000
const POLICY_LIMIT = 2
const KEYS = ['customer:1', 'ip:10.1.2.3', 'ip:10.1.0.0/16', 'ip:10.0.0.0/8', 'ip:10.1.2.0/24'] as const
const PROBES = [
  'customer:1',
  'customer:2',
  'ip:10.1.2.3',
  'ip:10.1.2.9',
  'ip:10.1.9.9',
  'ip:10.9.9.9',
  'ip:11.0.0.1',
]
type InstanceName = 'a' | 'b' | 'm'
type Store = 'redis' | 'memory'

interface Entry {
  limit: number
  expiresAt: number
}

interface Model {
  now: number
  tables: Record<Store, Map<string, Entry>>
}

interface Real {
  server: ModelRedis
  clients: Redis[]
  apps: Record<InstanceName, FastifyInstance>
  prefix: string
}

const storeOf = (instance: InstanceName): Store => (instance === 'm' ? 'memory' : 'redis')

/** An IPv4 address or network as 32 binary digits, and its prefix length. */
function bitsOf(text: string): { bits: string; prefix: number } {
  const [address, prefix] = text.split('/')
  const bits = address!
    .split('.')
    .map((octet) => Number(octet).toString(2).padStart(8, '0'))
    .join('')
  return { bits, prefix: prefix === undefined ? 32 : Number(prefix) }
}

/** The reference: the identity's own override, else the longest range holding it, else the policy's. */
function expectedLimit(model: Model, store: Store, identity: string): number {
  const live = [...model.tables[store]].filter(([, e]) => e.expiresAt > model.now)
  const own = live.find(([key]) => key === identity)
  if (own) return own[1].limit
  if (!identity.startsWith('ip:')) return POLICY_LIMIT
  const address = bitsOf(identity.slice(3))
  let best: { prefix: number; limit: number } | null = null
  for (const [key, entry] of live) {
    if (!key.includes('/')) continue
    const range = bitsOf(key.slice(3))
    if (range.prefix > address.prefix) continue
    if (address.bits.slice(0, range.prefix) !== range.bits.slice(0, range.prefix)) continue
    if (!best || range.prefix > best.prefix) best = { prefix: range.prefix, limit: entry.limit }
  }
  return best?.limit ?? POLICY_LIMIT
}

const limitSeen = async (app: FastifyInstance, identity: string) =>
  (await app.rateLimiter.consume('plan', identity, 0)).limit

async function mismatches(model: Model, real: Real, instances: readonly InstanceName[]): Promise<string[]> {
  const found: string[] = []
  for (const instance of instances)
    for (const identity of PROBES) {
      const expected = expectedLimit(model, storeOf(instance), identity)
      const seen = await limitSeen(real.apps[instance], identity)
      if (seen !== expected) found.push(`${instance} ${identity}: limit ${seen}, the model ${expected}`)
    }
  return found
}

/** Every instance applies the model's table within the bound. */
async function applied(model: Model, real: Real, what: string): Promise<void> {
  const deadline = Date.now() + BOUND_MS
  for (;;) {
    const found = await mismatches(model, real, ['a', 'b', 'm'])
    if (found.length === 0) return
    assert.ok(Date.now() < deadline, `${what}, after ${BOUND_MS} ms: ${found.join('; ')}`)
    await sleep(20)
  }
}

class SetOverride implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly key: string,
    readonly limit: number,
    readonly ttlMs: number,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    model.tables[storeOf(this.instance)].set(this.key, {
      limit: this.limit,
      expiresAt: model.now + this.ttlMs,
    })
    const app = real.apps[this.instance]
    const set = await app.rateLimiter.overrides.set('plan', this.key, { limit: this.limit, ttl: this.ttlMs })
    assert.equal(set.expiresAt, model.now + this.ttlMs, `${this}: expiry on the Redis clock`)
    // The instance that made the change applies it before set() resolves.
    assert.deepEqual(await mismatches(model, real, [this.instance]), [], `${this}: applied by its instance`)
  }
  toString = () => `set(${this.instance}, ${this.key}, ${this.limit}, ${this.ttlMs})`
}

class Remove implements ModelCommand<Model, Real> {
  constructor(
    readonly instance: InstanceName,
    readonly key: string,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const table = model.tables[storeOf(this.instance)]
    const entry = table.get(this.key)
    const existed = entry !== undefined && entry.expiresAt > model.now
    table.delete(this.key)
    assert.equal(
      await real.apps[this.instance].rateLimiter.overrides.remove('plan', this.key),
      existed,
      `${this}`,
    )
    assert.deepEqual(await mismatches(model, real, [this.instance]), [], `${this}: applied by its instance`)
  }
  toString = () => `remove(${this.instance}, ${this.key})`
}

/** An operator's change written to Redis whose message reaches nobody: only the poll sees it. */
class SetUnannounced implements ModelCommand<Model, Real> {
  constructor(
    readonly key: string,
    readonly limit: number,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    model.tables.redis.set(this.key, { limit: this.limit, expiresAt: model.now + 600_000 })
    const keys = overrideKeys(real.prefix)
    await callScript(
      real.clients[0]!,
      OVERRIDE,
      { entries: keys.entries, expiry: keys.expiry, version: keys.version, audit: keys.audit },
      {
        action: 'set',
        policy: 'plan',
        key: this.key,
        limit: this.limit,
        ttlMs: 600_000,
        reason: '',
        by: 'operator',
        maxEntries: MAX_OVERRIDES,
        auditLength: AUDIT_LENGTH,
        channel: `${keys.channel}:nobody`,
        version: `operator-${Date.now()}-${Math.random()}`,
      },
    )
  }
  toString = () => `setUnannounced(${this.key}, ${this.limit})`
}

const instances = fc.constantFrom<InstanceName>('a', 'b', 'm')
const keys = fc.constantFrom(...KEYS)
const limits = fc.integer({ min: 1, max: 9 })

modelTest<Model, Real>({
  name: 'rate-limit-overrides',
  runs: 20,
  maxCommands: 25,
  commands: [
    fc
      .tuple(instances, keys, limits, fc.constantFrom(500, 1000, 60_000))
      .map(([i, k, l, t]) => new SetOverride(i, k, l, t)),
    fc
      .tuple(instances, keys, limits, fc.constantFrom(500, 1000, 60_000))
      .map(([i, k, l, t]) => new SetOverride(i, k, l, t)),
    fc.tuple(instances, keys).map(([i, k]) => new Remove(i, k)),
    fc.tuple(keys, limits).map(([k, l]) => new SetUnannounced(k, l)),
    fc.constantFrom(1, 499, 500, 1000).map((ms) => new Advance<Model, Real>(ms)),
    ...dataLosses<Model, Real>((model) => {
      model.tables.redis.clear()
    }),
  ],
  async setup() {
    const server = await startModelRedis()
    server.clock.set(MODEL_EPOCH_MS)
    const clients = [await server.client(), await server.client()]
    const prefix = `rlo${Date.now().toString(36)}:`
    const policy: RateLimitPolicy = {
      name: 'plan',
      algorithm: 'fixed-window',
      limit: POLICY_LIMIT,
      windowMs: '1 hour',
      key: () => 'unused',
    }
    const build = async (client: Redis | null) => {
      const app = Fastify()
      const now = () => server.clock.now()
      await app.register(
        rateLimit,
        client
          ? // The private server never stalls: a slow answer on a loaded machine is not an outage.
            {
              redis: client,
              keyPrefix: prefix,
              namedPolicies: [policy],
              timeoutMs: 60_000,
              now,
              overrides: { pollMs: POLL_MS },
            }
          : { store: 'memory', keyPrefix: prefix, namedPolicies: [policy], now, overrides: true },
      )
      await app.ready()
      return app
    }
    const apps = { a: await build(clients[0]!), b: await build(clients[1]!), m: await build(null) }
    return {
      model: { now: MODEL_EPOCH_MS, tables: { redis: new Map(), memory: new Map() } },
      real: { server, clients, apps, prefix },
    }
  },
  async teardown(real) {
    for (const app of Object.values(real.apps)) await app.close()
    await real.server.stop()
  },
  async invariant(model, real) {
    await applied(model, real, 'overrides applied')
  },
})
