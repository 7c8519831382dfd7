import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { type ClaimResult, IdempotencyStore, ownerToken } from '../../src/plugins/idempotency/store.ts'
import { interleaveCommands, type ModelCommand, modelTest } from './harness.ts'
import { Advance, type ModelRedis, startModelRedis } from './redis.ts'

// Idempotency records (claim, replay, mismatch, lease expiry and takeover, complete, release,
// renew) against a model of each record, on a Redis whose clock the model moves. Requests racing
// on one key run at once, their Redis commands released in an order the scheduler draws: their
// answers must be those of the operations run one after the other in some order. Faults: FLUSHALL,
// the loss of one record's slot, a Redis restart: the record is gone and a retry runs again.

const LEASE = 1000
const RETENTION = 5000
const KEYS = ['k1', 'k2'] as const
const PAYLOADS = ['a', 'b'] as const
const STEPS = [1, 100, 500, 999, 1000, 1001, 3000, 4999, 5000, 5001]
const SCOPE = 'model'

/** The request fingerprint of a payload: a SHA-256 digest in base64url, as the plugin makes. */
const fingerprint = (payload: string) => createHash('sha256').update(payload).digest('base64url')

type Rec =
  | { state: 'processing'; payload: string; owner: string; leaseUntil: number; expiresAt: number }
  | { state: 'done'; payload: string; status: number; body: string; expiresAt: number }

/** A request that claimed a key (whatever it got): its token completes, releases or renews. */
interface Request {
  token: string
  key: string
}

interface Model {
  now: number
  records: Map<string, Rec>
  requests: Request[]
}

interface Real {
  server: ModelRedis
  client: Redis
  store: IdempotencyStore
}

/** What a caller sees of an operation, compared between the model and the real store. */
type Seen =
  | { kind: 'new' | 'takeover' | 'mismatch' }
  | { kind: 'conflict'; retryAfterMs: number }
  | { kind: 'replay'; status: number; body: string }
  | boolean

const seen = (claim: ClaimResult): Seen =>
  claim.kind === 'replay'
    ? { kind: 'replay', status: claim.response.status, body: claim.response.body?.toString() ?? '' }
    : claim

/** The record as Redis holds it now: gone once its key expired (Redis expires a key once past its time). */
function recordOf(records: Map<string, Rec>, now: number, key: string): Rec | undefined {
  const rec = records.get(key)
  if (rec && now > rec.expiresAt) {
    records.delete(key)
    return undefined
  }
  return rec
}

type Op =
  | { op: 'claim'; key: string; payload: string; token: string }
  | { op: 'complete'; request: Request; status: number; body: string }
  | { op: 'release' | 'renew'; request: Request }

/** One operation on the model's records, as the scripts do it. */
function apply(records: Map<string, Rec>, now: number, op: Op): Seen {
  if (op.op === 'claim') {
    const rec = recordOf(records, now, op.key)
    if (!rec) {
      records.set(op.key, {
        state: 'processing',
        payload: op.payload,
        owner: op.token,
        leaseUntil: now + LEASE,
        expiresAt: now + RETENTION,
      })
      return { kind: 'new' }
    }
    if (rec.payload !== op.payload) return { kind: 'mismatch' }
    if (rec.state === 'done') return { kind: 'replay', status: rec.status, body: rec.body }
    if (rec.leaseUntil - now > 0) return { kind: 'conflict', retryAfterMs: rec.leaseUntil - now }
    records.set(op.key, { ...rec, owner: op.token, leaseUntil: now + LEASE })
    return { kind: 'takeover' }
  }
  const rec = recordOf(records, now, op.request.key)
  // Only the request whose token holds the record may complete, release or renew it.
  if (rec?.state !== 'processing' || rec.owner !== op.request.token) return false
  if (op.op === 'complete')
    records.set(op.request.key, {
      state: 'done',
      payload: rec.payload,
      status: op.status,
      body: op.body,
      expiresAt: now + RETENTION,
    })
  else if (op.op === 'release') records.delete(op.request.key)
  else records.set(op.request.key, { ...rec, leaseUntil: now + LEASE })
  return true
}

function runReal(real: Real, op: Op): Promise<Seen> {
  const { store } = real
  if (op.op === 'claim')
    return store.claim(store.recordKey(SCOPE, op.key), fingerprint(op.payload), op.token).then(seen)
  const recordKey = store.recordKey(SCOPE, op.request.key)
  if (op.op === 'complete')
    return store.complete(recordKey, op.request.token, {
      status: op.status,
      headers: [],
      body: Buffer.from(op.body),
    })
  return op.op === 'release'
    ? store.release(recordKey, op.request.token)
    : store.renew(recordKey, op.request.token)
}

const describe = (op: Op) =>
  op.op === 'claim'
    ? `claim(${op.key}, ${op.payload})`
    : `${op.op}(${op.request.key}, ${op.request.token.slice(0, 4)})`

function permutations<T>(items: T[]): T[][] {
  if (items.length <= 1) return [items]
  return items.flatMap((item, i) =>
    permutations([...items.slice(0, i), ...items.slice(i + 1)]).map((rest) => [item, ...rest]),
  )
}

/** What a drawn operation turns into against the model as it stands: a claim gets a new token. */
type Draw =
  | { op: 'claim'; key: string; payload: string }
  | { op: 'complete'; request: number; status: number; body: string }
  | { op: 'release' | 'renew'; request: number }

function make(model: Model, draw: Draw): Op {
  if (draw.op === 'claim') {
    const op: Op = { ...draw, token: ownerToken() }
    model.requests.push({ token: op.token, key: draw.key })
    return op
  }
  const request = model.requests[draw.request % model.requests.length]!
  return draw.op === 'complete'
    ? { op: 'complete', request, status: draw.status, body: draw.body }
    : { op: draw.op, request }
}

const drawn = (d: Draw) =>
  d.op === 'claim'
    ? `claim(${d.key}, ${d.payload})`
    : d.op === 'complete'
      ? `complete(#${d.request}, ${d.status}, '${d.body}')`
      : `${d.op}(#${d.request})`

const canRun = (model: Readonly<Model>, draws: Draw[]) =>
  draws.every((d) => d.op === 'claim' || model.requests.length > 0)

/**
 * Operations sent at once (one alone is a plain request). Their answers must be those of the
 * model run one after the other in some order; the model then takes that order's records.
 */
class Together implements ModelCommand<Model, Real> {
  constructor(readonly draws: Draw[]) {}
  check = (model: Readonly<Model>) => canRun(model, this.draws)
  async run(model: Model, real: Real) {
    const ops = this.draws.map((draw) => make(model, draw))
    const answers = await Promise.all(ops.map((op) => runReal(real, op)))
    const indexes = ops.map((_, i) => i)
    for (const order of permutations(indexes)) {
      const records = new Map(model.records)
      const expected: Seen[] = []
      for (const i of order) expected[i] = apply(records, model.now, ops[i]!)
      try {
        assert.deepEqual(answers, expected)
      } catch {
        continue
      }
      model.records = records
      return
    }
    const alone = new Map(model.records)
    assert.fail(
      `no order of ${ops.map(describe).join(', ')} answers ${JSON.stringify(answers)} (in the drawn order the model says ${JSON.stringify(ops.map((op) => apply(alone, model.now, op)))})`,
    )
  }
  toString = () => `together(${this.draws.map(drawn).join(', ')})`
}

/** FLUSHALL, a Redis restart, or the loss of one record's slot: what was kept is gone. */
class Loss implements ModelCommand<Model, Real> {
  constructor(readonly kind: 'flushAll' | 'restart' | 'dropSlot') {}
  check = () => true
  async run(model: Model, real: Real) {
    if (this.kind === 'dropSlot') {
      // The record's hash tag is its digest: `<prefix>{<digest>}`.
      const recordKey = real.store.recordKey(SCOPE, KEYS[0])
      await real.server.dropSlot(recordKey.slice(recordKey.indexOf('{') + 1, -1))
      model.records.delete(KEYS[0])
      return
    }
    await (this.kind === 'flushAll' ? real.server.flushAll() : real.server.restart())
    model.records.clear()
  }
  toString = () => `${this.kind}()`
}

const claim = fc
  .record({ key: fc.constantFrom(...KEYS), payload: fc.constantFrom(...PAYLOADS) })
  .map((d): Draw => ({ op: 'claim', ...d }))
const settle = fc.oneof(
  fc
    .record({ request: fc.nat(20), status: fc.constantFrom(201, 409), body: fc.constantFrom('ok', '') })
    .map((d): Draw => ({ op: 'complete', ...d })),
  fc.record({ request: fc.nat(20), op: fc.constantFrom<'release' | 'renew'>('release', 'renew') }),
)

let shared: Promise<ModelRedis> | undefined
after(async () => (await shared)?.stop())

modelTest<Model, Real>({
  name: 'idempotency',
  runs: 40,
  maxCommands: 30,
  scheduled: true,
  commands: [
    claim.map((d) => new Together([d])),
    settle.map((d) => new Together([d])),
    // Retries racing each other on one key, and a late owner's settle racing a takeover.
    fc
      .tuple(fc.constantFrom(...KEYS), fc.array(fc.constantFrom(...PAYLOADS), { minLength: 2, maxLength: 3 }))
      .map(
        ([key, payloads]) => new Together(payloads.map((payload): Draw => ({ op: 'claim', key, payload }))),
      ),
    fc.tuple(claim, settle).map((draws) => new Together(draws)),
    fc.constantFrom(...STEPS).map((ms) => new Advance<Model, Real>(ms)),
    fc
      .constantFrom<'flushAll' | 'restart' | 'dropSlot'>('flushAll', 'restart', 'dropSlot')
      .map((k) => new Loss(k)),
  ],
  async setup(scheduler) {
    // One server for every run, emptied first; each run's client is its own, through the scheduler.
    shared ??= startModelRedis()
    const server = await shared
    await server.flushAll()
    const client = await server.client()
    if (scheduler) interleaveCommands(client, scheduler)
    const store = new IdempotencyStore(client, { keyPrefix: 'idem:', leaseMs: LEASE, retentionMs: RETENTION })
    return {
      model: { now: server.clock.now(), records: new Map(), requests: [] },
      real: { server, client, store },
    }
  },
  async teardown(real) {
    real.client.disconnect()
  },
})
