import assert from 'node:assert/strict'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { settleDatabaseIdentity } from '../../src/db/identity.ts'
import { createNotifier, notificationKeys } from '../../src/events/notifier.ts'
import { createOutboxRelay, type OutboxRelay } from '../../src/events/outbox-relay.ts'
import type { StreamConsumer } from '../../src/index.ts'
import { executeTransfer } from '../../src/ledger/ledger.ts'
import { createTestDatabase, type TestDatabase } from '../helpers/gateway.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { type ModelRedis, startModelRedis } from './redis.ts'

// The demo's transfer events (docs/demo/events.md) on a real Postgres and a private Redis: transfers
// committed with their outbox rows, two gateway instances each with a relay (its passes are the
// model's commands, the loss check included) and a notifier (running on its own), and a customer
// who watches their notification stream all along. The promise checked: every committed transfer's
// event reaches both parties once, none is lost while Postgres keeps it, and none of a previous
// database ever shows. Faults: FLUSHALL, the loss of the stream's hash slot, a failover that lost
// the stream's last entries, a Redis restart, an instance restart, the notifiers down (events pile
// up unread, so a loss meets them), and a restore (the database back to a backup taken before any
// transfer: ids start again, the instances restart on it, Redis keeps what it had). Overlaps: an
// instance boots, or its relay checks the database, while the other instance commits a transfer and
// relays it between two of its calls; the check must not take that transfer for a restore.
//
// Faults come at the notifiers' quiet points (each is stopped, which finishes its read, and started
// again after): docs/demo/events.md allows a duplicate only when Redis loses its data in the
// milliseconds between a notification's append and its record in Postgres.

/** Three customers, one account each; transfers go between any two. */
const CUSTOMERS = 3
/** Relay batch: small, so that passes take several batches and the loss check's window is short. */
const BATCH = 3
const RETENTION = 1000

interface Transfer {
  fromCustomer: number
  toCustomer: number
  fromAccountId: number
  toAccountId: number
  amount: number
}

interface Model {
  /** The committed transfers of the current database, by id. */
  transfers: Map<number, Transfer>
  /**
   * No Redis data loss and no restore yet in this run: the relays owe the events stream each event
   * exactly once (a refill after a loss may append one twice, which consumers absorb).
   */
  lossless: boolean
}

interface Instance {
  prefix: string
  relay: OutboxRelay
  notifier: StreamConsumer
  /** Holds the boot's and the relay's calls (see \`holding\`); idle unless an Overlap arms it. */
  hold: Hold
}

/** After the \`at\`-th database or Redis call resolves, \`during\` runs before the caller goes on. */
interface Hold {
  at: number
  calls: number
  during: (() => Promise<void>) | null
}

const idle = (): Hold => ({ at: 0, calls: 0, during: null })

/** \`target\` whose calls returning a promise count towards \`hold\`, and the \`at\`-th waits for its \`during\`. */
function holding<T extends object>(target: T, hold: Hold): T {
  return new Proxy(target, {
    get(object, key) {
      const value = Reflect.get(object, key, object) as unknown
      if (typeof value !== 'function') return value
      return (...args: unknown[]) => {
        const result = value.apply(object, args) as unknown
        if (!hold.during || !(result instanceof Promise)) return result
        return result.then(async (resolved: unknown) => {
          const during = hold.during
          if (++hold.calls === hold.at && during) {
            hold.during = null
            await during()
          }
          return resolved
        })
      }
    },
  })
}

interface Real {
  db: TestDatabase
  redis: Redis
  server: ModelRedis
  basePrefix: string
  customers: Array<{ customerId: number; accountId: number }>
  instances: Instance[]
  /** What the watching customers have been shown: `<customer>|<event>|<eventId>` → its stream id. */
  seen: Map<string, string>
  errors: unknown[]
  started: number
  /** Whether the notifiers run: down, the stream fills and the faults meet entries nobody read yet. */
  notifiersUp: boolean
}

let server: ModelRedis | undefined
let database: TestDatabase | undefined
let run = 0
after(async () => {
  await server?.stop()
  await database?.drop()
})

/** An instance booting as the gateway does: its keys under the database's identity (renewed after a restore). */
async function startInstance(real: Real, hold = idle()): Promise<Instance> {
  const basePrefix = real.basePrefix
  const db = holding(real.db.db, hold)
  const redis = holding(real.redis, hold)
  const identity = await settleDatabaseIdentity(db, redis, basePrefix, () => {})
  const prefix = `${basePrefix}${identity}:`
  const stream = `${prefix}events:transfers`
  const onError = (err: unknown) => real.errors.push(err)
  const relay = createOutboxRelay({
    db,
    redis,
    stream,
    retention: RETENTION,
    batch: BATCH,
    // Passes are the model's commands, not a timer's.
    intervalMs: 3_600_000,
    database: { basePrefix, identity },
    onError,
  })
  const notifier = createNotifier({
    db: real.db.db,
    redis: real.redis,
    prefix,
    stream,
    consumer: `instance-${real.started++}`,
    refillReach: RETENTION,
    retention: RETENTION,
    dedupTtlMs: 86_400_000,
    blockMs: 200,
    onError,
  })
  if (real.notifiersUp) await notifier.start()
  return { prefix, relay, notifier, hold }
}

/** The watching customers read what their notification streams hold now (as an open SSE stream would show it). */
async function observe(model: Model, real: Real): Promise<void> {
  const prefixes = new Set(real.instances.map((instance) => instance.prefix))
  assert.equal(prefixes.size, 1, `the instances disagree on the database's identity: ${[...prefixes]}`)
  const [prefix] = prefixes
  for (const { customerId } of real.customers) {
    const entries = (await real.redis.xrange(
      notificationKeys(prefix!, customerId).stream,
      '-',
      '+',
    )) as Array<[string, string[]]>
    for (const [streamId, fields] of entries) {
      const f = Object.fromEntries(fields.flatMap((_, i) => (i % 2 ? [] : [[fields[i]!, fields[i + 1]!]])))
      const data = JSON.parse(f.data!) as {
        transferId: number
        fromAccountId: number
        toAccountId: number
        amount: number
      }
      const transfer = model.transfers.get(Number(f.eventId))
      assert.ok(
        transfer,
        `customer ${customerId} shown event ${f.eventId}, which this database never committed`,
      )
      assert.deepEqual(
        { transferId: data.transferId, from: data.fromAccountId, to: data.toAccountId, amount: data.amount },
        {
          transferId: Number(f.eventId),
          from: transfer.fromAccountId,
          to: transfer.toAccountId,
          amount: transfer.amount,
        },
        `customer ${customerId} shown event ${f.eventId} with another transfer's data`,
      )
      const party = f.event === 'transfer.sent' ? transfer.fromCustomer : transfer.toCustomer
      assert.equal(customerId, party, `customer ${customerId} shown ${f.event} of transfer ${f.eventId}`)
      const key = `${customerId}|${f.event}|${f.eventId}`
      const before = real.seen.get(key)
      assert.ok(
        before === undefined || before === streamId,
        `customer ${customerId} shown ${f.event} of transfer ${f.eventId} twice (${before}, then ${streamId})`,
      )
      real.seen.set(key, streamId)
    }
  }
}

/** With no loss in the run, no event is on the events stream twice. */
async function relayedOnce(model: Model, real: Real): Promise<void> {
  if (!model.lossless) return
  const stream = `${real.instances[0]!.prefix}events:transfers`
  const entries = (await real.redis.xrange(stream, '-', '+')) as Array<[string, string[]]>
  const ids = entries.map(([, fields]) => fields[fields.indexOf('eventId') + 1])
  const twice = ids.filter((id, i) => ids.indexOf(id) !== i)
  assert.deepEqual(twice, [], `events relayed twice with no loss in the run: ${twice.join(', ')}`)
}

/** What a committed transfer owes the customers and they have not been shown. */
function undelivered(model: Model, real: Real): string[] {
  const missing: string[] = []
  for (const [id, t] of model.transfers) {
    if (!real.seen.has(`${t.fromCustomer}|transfer.sent|${id}`))
      missing.push(`${id} sent to ${t.fromCustomer}`)
    if (!real.seen.has(`${t.toCustomer}|transfer.received|${id}`))
      missing.push(`${id} received by ${t.toCustomer}`)
  }
  return missing
}

/** Stops every notifier (each finishes its read), lets the customers read, runs `fault`, starts them again. */
async function atQuietPoint(model: Model, real: Real, fault: () => Promise<void>): Promise<void> {
  model.lossless = false
  for (const instance of real.instances) await instance.notifier.stop()
  await observe(model, real)
  // Stream ids made after the fault are never those made before it.
  real.server.clock.advance(1000)
  await fault()
  if (real.notifiersUp) for (const instance of real.instances) await instance.notifier.start()
}

class MakeTransfers implements ModelCommand<Model, Real> {
  /** `count` transfers from one customer to another, of `amount`, `amount + 1`, ... VND. */
  constructor(
    readonly from: number,
    readonly to: number,
    readonly amount: number,
    readonly count: number,
  ) {}
  check = () => this.from !== this.to
  async run(model: Model, real: Real) {
    const from = real.customers[this.from]!
    const to = real.customers[this.to]!
    for (let i = 0; i < this.count; i++) {
      const result = await executeTransfer(real.db.db, {
        customerId: from.customerId,
        fromAccountId: from.accountId,
        toAccountId: to.accountId,
        amount: this.amount + i,
        currency: 'VND',
      })
      model.transfers.set(result.transferId, {
        fromCustomer: from.customerId,
        toCustomer: to.customerId,
        fromAccountId: from.accountId,
        toAccountId: to.accountId,
        amount: this.amount + i,
      })
    }
  }
  toString = () => `transfers(${this.from} → ${this.to}, ${this.amount}, ×${this.count})`
}

class RelayPass implements ModelCommand<Model, Real> {
  /** `both`: the two instances' relays at once; else the pass of one instance. */
  constructor(readonly which: 0 | 1 | 'both') {}
  check = () => true
  async run(model: Model, real: Real) {
    const relays = real.instances.filter((_, i) => this.which === 'both' || this.which === i)
    await Promise.all(relays.map((instance) => instance.relay.relayPending()))
    await relayedOnce(model, real)
  }
  toString = () => `relay(${this.which})`
}

class Settle implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    // A timed pass of each relay (loss check included), then the notifiers have every event to deliver.
    for (const instance of real.instances) await instance.relay.relayPending()
    await relayedOnce(model, real)
    real.notifiersUp = true
    for (const instance of real.instances) await instance.notifier.start()
    const deadline = Date.now() + 15_000
    for (;;) {
      await observe(model, real)
      const missing = undelivered(model, real)
      if (missing.length === 0) return
      assert.ok(
        Date.now() < deadline,
        `never delivered after a relay pass: ${missing.join(', ')}; errors: ${real.errors.map(String).join('; ')}`,
      )
      // Blocking reads time out on the server's clock, which moves only when the model moves it.
      real.server.clock.advance(50)
      await sleep(50)
    }
  }
  toString = () => 'settle()'
}

class FlushAll implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await atQuietPoint(model, real, () => real.server.flushAll())
  }
  toString = () => 'flushAll()'
}

class DropStreamSlot implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await atQuietPoint(model, real, async () => {
      await real.server.dropSlot(`${real.instances[0]!.prefix}events:transfers`)
    })
  }
  toString = () => 'dropStreamSlot()'
}

class RestartRedis implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    await atQuietPoint(model, real, () => real.server.restart())
  }
  toString = () => 'restartRedis()'
}

class Notifiers implements ModelCommand<Model, Real> {
  /** Both instances' notifiers stop (a deploy of the workers, say) or start again; settle() starts them too. */
  constructor(readonly up: boolean) {}
  check = () => true
  async run(_model: Model, real: Real) {
    real.notifiersUp = this.up
    for (const instance of real.instances)
      await (this.up ? instance.notifier.start() : instance.notifier.stop())
  }
  toString = () => `notifiers(${this.up ? 'up' : 'down'})`
}

class LoseTail implements ModelCommand<Model, Real> {
  /** A failover to a replica that had not received the stream's last `count` entries. */
  constructor(readonly count: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    await atQuietPoint(model, real, async () => {
      const stream = `${real.instances[0]!.prefix}events:transfers`
      const tail = (await real.redis.xrevrange(stream, '+', '-', 'COUNT', this.count)) as Array<
        [string, string[]]
      >
      if (tail.length > 0) await real.redis.xdel(stream, ...tail.map(([id]) => id))
    })
  }
  toString = () => `loseTail(${this.count})`
}

class RestartInstance implements ModelCommand<Model, Real> {
  constructor(readonly which: 0 | 1) {}
  check = () => true
  async run(_model: Model, real: Real) {
    // Graceful: the read being handled finishes, what it held pending goes back to the group.
    await real.instances[this.which]!.notifier.stop()
    real.instances[this.which] = await startInstance(real)
  }
  toString = () => `restartInstance(${this.which})`
}

class Overlap implements ModelCommand<Model, Real> {
  /**
   * Instance \`which\` boots again (\`boot\`) or runs a relay pass (\`relay\`), and after its \`at\`-th
   * database or Redis call the other instance commits a transfer and relays it: the identity check
   * must not take a transfer it did not see yet for a restore.
   */
  constructor(
    readonly which: 0 | 1,
    readonly kind: 'boot' | 'relay',
    readonly at: number,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    const hold: Hold = {
      at: this.at,
      calls: 0,
      during: async () => {
        await new MakeTransfers(this.which, 1 - this.which, 7, 1).run(model, real)
        await real.instances[1 - this.which]!.relay.relayPending()
      },
    }
    if (this.kind === 'relay') {
      Object.assign(real.instances[this.which]!.hold, hold)
      await real.instances[this.which]!.relay.relayPending()
      return
    }
    await real.instances[this.which]!.notifier.stop()
    real.instances[this.which] = await startInstance(real, hold)
  }
  toString = () => `overlap(${this.which}, ${this.kind}, ${this.at})`
}

class Restore implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    for (const instance of real.instances) await instance.notifier.stop()
    await observe(model, real)
    // A backup from before the first transfer: the same database identity, every transfer and event
    // gone, the ids start again. Redis keeps the old database's keys.
    await real.db.db.query('TRUNCATE transfers, outbox_events, notified_events RESTART IDENTITY CASCADE')
    await real.db.db.query('UPDATE accounts SET balance = opening_balance')
    model.transfers.clear()
    model.lossless = false
    real.seen.clear()
    real.instances = [await startInstance(real), await startInstance(real)]
  }
  toString = () => 'restore()'
}

const transfer = fc
  .tuple(
    fc.integer({ min: 0, max: CUSTOMERS - 1 }),
    fc.integer({ min: 1, max: CUSTOMERS - 1 }),
    fc.integer({ min: 1, max: 1000 }),
    // Several: a pass then takes more than one batch, and two relays' batches interleave.
    fc.integer({ min: 1, max: 2 * BATCH }),
  )
  .map(([from, step, amount, count]) => new MakeTransfers(from, (from + step) % CUSTOMERS, amount, count))

modelTest<Model, Real>({
  name: 'outbox',
  runs: 20,
  maxCommands: 20,
  // Each entry is drawn with the same weight: transfers and relay passes more often than faults.
  commands: [
    transfer,
    transfer,
    transfer,
    fc.constantFrom<0 | 1 | 'both'>(0, 1, 'both').map((which) => new RelayPass(which)),
    fc.constantFrom<0 | 1 | 'both'>(0, 1, 'both').map((which) => new RelayPass(which)),
    fc.constant(new Settle()),
    fc.oneof(
      fc.constant(new FlushAll()),
      fc.constant(new DropStreamSlot()),
      fc.integer({ min: 1, max: 8 }).map((n) => new LoseTail(n)),
      fc.constant(new RestartRedis()),
    ),
    fc.boolean().map((up) => new Notifiers(up)),
    fc.boolean().map((up) => new Notifiers(up)),
    fc.constantFrom<0 | 1>(0, 1).map((which) => new RestartInstance(which)),
    fc.constant(new Restore()),
    fc
      .tuple(fc.constantFrom<0 | 1>(0, 1), fc.constantFrom('boot', 'relay'), fc.integer({ min: 1, max: 3 }))
      .map(([which, kind, at]) => new Overlap(which, kind as 'boot' | 'relay', at)),
  ],
  async setup() {
    server ??= await startModelRedis()
    database ??= await createTestDatabase()
    await server.flushAll()
    await database.db.query(
      'TRUNCATE customers, accounts, transfers, outbox_events, notified_events RESTART IDENTITY CASCADE',
    )
    const customers: Real['customers'] = []
    for (let i = 0; i < CUSTOMERS; i++) {
      const [row] = await database.db.query<{ id: number }>(
        'INSERT INTO customers (username, password_hash) VALUES ($1, $2) RETURNING id',
        [`model${i}`, 'x'],
      )
      const [account] = await database.db.query<{ id: number }>(
        `INSERT INTO accounts (customer_id, currency, balance, opening_balance) VALUES ($1, 'VND', 1000000000, 1000000000)
         RETURNING id`,
        [row!.id],
      )
      customers.push({ customerId: row!.id, accountId: account!.id })
    }
    const real: Real = {
      db: database,
      redis: await server.client(),
      server,
      basePrefix: `outbox${run++}:`,
      customers,
      instances: [],
      seen: new Map(),
      errors: [],
      started: 0,
      // Down at first: the first faults meet relayed events that nobody has read yet.
      notifiersUp: false,
    }
    real.instances = [await startInstance(real), await startInstance(real)]
    return { model: { transfers: new Map(), lossless: true }, real }
  },
  async teardown(real) {
    for (const instance of real.instances) {
      await instance.notifier.stop()
      await instance.relay.stop()
    }
    real.redis.disconnect()
  },
  async invariant(model, real) {
    await observe(model, real)
  },
})
