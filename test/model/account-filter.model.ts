import assert from 'node:assert/strict'
import { after } from 'node:test'
import fc from 'fast-check'
import type { Redis } from 'ioredis'
import { type AccountFilter, createAccountFilter } from '../../src/ledger/account-filter.ts'
import { createTestDatabase, type TestDatabase } from '../helpers/gateway.ts'
import { type ModelCommand, modelTest } from './harness.ts'
import { dataLosses, type ModelRedis, startModelRedis } from './redis.ts'

// The demo's account filter (src/ledger/account-filter.ts) on a real Postgres and a private Redis,
// against the one thing it promises: no account that exists is ever reported missing. Accounts come
// through the gateway's code (insert, then `add`) and behind its back (bulk imports past one call
// of the Bloom filter's `add`, inserts rolled back that leave gaps in the ids), and catch-ups,
// instance restarts (a build or a catch-up from Postgres) and a probe that the filter still
// filters are drawn among them. Faults: FLUSHALL, the filter's bits or its catch-up marker lost,
// a Redis restart, and a restore (the database replaced by one whose ids start again, the
// instance restarted on it, Redis keeping the old filter).

interface Model {
  /** Account ids Postgres has, as [first, last] ranges (a bulk import is one range). */
  accounts: Array<[number, number]>
  /** Ids rolled-back inserts took: no account has them, until a restored database fills them. */
  gaps: number[]
}

interface Real {
  db: TestDatabase
  redis: Redis
  server: ModelRedis
  key: string
  customerId: number
  filter: AccountFilter
  errors: unknown[]
}

let server: ModelRedis | undefined
let database: TestDatabase | undefined
let run = 0
after(async () => {
  await server?.stop()
  await database?.drop()
})

function startFilter(real: Pick<Real, 'db' | 'redis' | 'key' | 'errors'>): AccountFilter {
  const filter = createAccountFilter({
    db: real.db.db,
    redis: real.redis,
    key: real.key,
    capacity: 20_000,
    // Catch-ups are the model's commands, not a timer's.
    catchUpIntervalMs: 3_600_000,
    onError: (err) => real.errors.push(err),
  })
  filter.start()
  return filter
}

async function insert(real: Real, count: number): Promise<[number, number]> {
  const rows = await real.db.db.query<{ id: number }>(
    `INSERT INTO accounts (customer_id, currency) SELECT $1, 'VND' FROM generate_series(1, $2::integer)
     RETURNING id`,
    [real.customerId, count],
  )
  const ids = rows.map((row) => row.id)
  return [Math.min(...ids), Math.max(...ids)]
}

/** The ids the invariant reads: every id of small ranges, the ends and a few inner ids of large ones. */
function sampled(model: Model): number[] {
  return model.accounts.flatMap(([first, last]) =>
    last - first < 20
      ? Array.from({ length: last - first + 1 }, (_, i) => first + i)
      : [
          first,
          first + 1,
          Math.floor((first + last) / 2),
          last - 1,
          last,
          ...model.gaps.filter((id) => id >= first && id <= last),
        ],
  )
}

class CreateThroughGateway implements ModelCommand<Model, Real> {
  constructor(readonly count: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    const range = await insert(real, this.count)
    const ids = Array.from({ length: range[1] - range[0] + 1 }, (_, i) => range[0] + i)
    await real.filter.add(ids)
    model.accounts.push(range)
  }
  toString = () => `createThroughGateway(${this.count})`
}

class InsertBehindItsBack implements ModelCommand<Model, Real> {
  constructor(readonly count: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    model.accounts.push(await insert(real, this.count))
  }
  toString = () => `insertBehindItsBack(${this.count})`
}

class RolledBack implements ModelCommand<Model, Real> {
  constructor(readonly count: number) {}
  check = () => true
  async run(model: Model, real: Real) {
    // Ids taken and never used: a gap a restored database may fill.
    await assert.rejects(
      real.db.db.transaction(async (tx) => {
        const rows = await tx.query<{ id: number }>(
          `INSERT INTO accounts (customer_id, currency) SELECT $1, 'VND' FROM generate_series(1, $2::integer)
           RETURNING id`,
          [real.customerId, this.count],
        )
        model.gaps.push(...rows.map((row) => row.id))
        throw new Error('rolled back')
      }),
      /rolled back/,
    )
  }
  toString = () => `rolledBack(${this.count})`
}

class CatchUp implements ModelCommand<Model, Real> {
  check = () => true
  async run(_model: Model, real: Real) {
    await real.filter.catchUp()
  }
  toString = () => 'catchUp()'
}

class RestartInstance implements ModelCommand<Model, Real> {
  constructor(readonly settle: boolean) {}
  check = () => true
  async run(_model: Model, real: Real) {
    await real.filter.stop()
    real.filter = startFilter(real)
    if (this.settle) await real.filter.settled()
  }
  toString = () => `restartInstance(${this.settle ? 'settled' : ''})`
}

class StillFilters implements ModelCommand<Model, Real> {
  check = () => true
  async run(model: Model, real: Real) {
    // Caught up on an intact Redis: an id above every account is answered by the filter alone,
    // "no" unless its bits happen to be set (a false positive).
    await real.filter.catchUp()
    await real.filter.settled()
    const newest = Math.max(0, ...model.accounts.map(([, last]) => last))
    for (const id of [newest + 1, newest + 1_000_003]) {
      const bits = await real.filter.bloom.check(String(id))
      assert.equal(await real.filter.mightExist(id), bits !== 'absent', `made-up id ${id} (bits: ${bits})`)
    }
  }
  toString = () => 'stillFilters()'
}

class Lose implements ModelCommand<Model, Real> {
  constructor(readonly what: 'bits' | 'marker') {}
  check = () => true
  async run(_model: Model, real: Real) {
    if (this.what === 'marker') await real.redis.del(`${real.key}:newest`)
    else for (let s = 0; s < real.filter.bloom.shards; s++) await real.server.dropSlot(`${real.key}:${s}`)
  }
  toString = () => `lose(${this.what})`
}

class Restore implements ModelCommand<Model, Real> {
  /** `count` accounts, or (`beyond`) that many more than the newest id before: its newest id exists again. */
  constructor(
    readonly count: number,
    readonly beyond: boolean,
  ) {}
  check = () => true
  async run(model: Model, real: Real) {
    await real.filter.stop()
    const newest = Math.max(0, ...model.accounts.map(([, last]) => last))
    const count = this.beyond ? newest + this.count : this.count
    // Another database with the same schema whose ids start again, e.g. a backup restored; its
    // accounts fill the gaps the old one had. The instance restarts on it, Redis kept the filter.
    await real.db.db.query('TRUNCATE accounts RESTART IDENTITY CASCADE')
    model.accounts = count > 0 ? [await insert(real, count)] : []
    real.filter = startFilter(real)
  }
  toString = () => `restore(${this.beyond ? `newest + ${this.count}` : this.count})`
}

const small = fc.integer({ min: 1, max: 30 })

modelTest<Model, Real>({
  name: 'account-filter',
  runs: 20,
  maxCommands: 25,
  commands: [
    small.map((n) => new CreateThroughGateway(n)),
    fc.oneof(small, fc.integer({ min: 4_001, max: 6_000 })).map((n) => new InsertBehindItsBack(n)),
    small.map((n) => new RolledBack(n)),
    fc.constant(new CatchUp()),
    fc.boolean().map((settle) => new RestartInstance(settle)),
    fc.constant(new StillFilters()),
    ...dataLosses<Model, Real>(),
    fc.constantFrom<'bits' | 'marker'>('bits', 'marker').map((what) => new Lose(what)),
    fc.tuple(fc.integer({ min: 0, max: 30 }), fc.boolean()).map(([n, beyond]) => new Restore(n, beyond)),
  ],
  async setup() {
    server ??= await startModelRedis()
    database ??= await createTestDatabase()
    await server.flushAll()
    await database.db.query('TRUNCATE customers, accounts RESTART IDENTITY CASCADE')
    const [customer] = await database.db.query<{ id: number }>(
      "INSERT INTO customers (username, password_hash) VALUES ('model', 'x') RETURNING id",
    )
    const redis = await server.client()
    const real = {
      db: database,
      redis,
      server,
      key: `accounts${run++}`,
      customerId: customer!.id,
      errors: [] as unknown[],
    }
    return { model: { accounts: [], gaps: [] }, real: { ...real, filter: startFilter(real) } }
  },
  async teardown(real) {
    await real.filter.stop()
    real.redis.disconnect()
  },
  async invariant(model, real) {
    for (const id of sampled(model))
      assert.equal(await real.filter.mightExist(id), true, `account ${id} exists but was reported missing`)
  },
})
