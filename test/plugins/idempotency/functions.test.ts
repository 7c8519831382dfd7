import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { Registry } from 'prom-client'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import {
  IdempotencyError,
  IdempotencyFingerprintTooLargeError,
  IdempotencyInFlightError,
  IdempotencyKeyInvalidError,
  IdempotencyKeyMismatchError,
  IdempotencyResultNotKeptError,
  IdempotencyStoreUnavailableError,
  type MakeIdempotentOptions,
  makeIdempotent,
} from '../../../src/index.ts'
import * as subpath from '../../../src/plugins/idempotency/index.ts'
import { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { readIdempotencyRecord } from '../../helpers/idempotency-record.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { gate } from './fixtures.ts'

/** A logger keeping what it was told. */
function captureLog() {
  const lines: Array<{ level: string; details: object; message: string }> = []
  return {
    lines,
    logger: {
      warn: (details: object, message: string) => lines.push({ level: 'warn', details, message }),
      error: (details: object, message: string) => lines.push({ level: 'error', details, message }),
    },
  }
}

async function counted(registry: Registry, metric: string, label: string, value: string): Promise<number> {
  const found = registry.getSingleMetric(metric)
  if (!found) return 0
  const { values } = await found.get()
  return values.find((v) => v.labels[label] === value)?.value ?? 0
}

async function waitFor(condition: () => boolean | Promise<boolean>) {
  while (!(await condition())) await sleep(5)
}

let shared: RedisClient
before(() => {
  shared = createRedisClient(testRedisConnection())
})
after(() => shared.quit())

interface Order {
  orderId: string
  amount: number
}

/** A charge function keyed by order id, counting its runs. */
function charger(
  options: Partial<MakeIdempotentOptions<[Order]>> = {},
  body?: (order: Order) => Promise<void>,
) {
  const prefix = uniquePrefix('idemfn')
  let runs = 0
  const charge = makeIdempotent(
    async (order: Order) => {
      const run = ++runs
      await body?.(order)
      return { chargeId: `ch_${run}`, amount: order.amount, at: run }
    },
    { redis: shared, keyOf: (order) => order.orderId, keyPrefix: prefix, ...options },
  )
  return { charge, runs: () => runs, prefix }
}

describe('makeIdempotent options', () => {
  const fn = async () => 1
  const base = { redis: {} as RedisClient, keyOf: () => 'k' }
  const cases: Array<[() => unknown, string | RegExp]> = [
    [
      () => makeIdempotent('x' as unknown as () => 1, base),
      "makeIdempotent: `fn` must be a function, got a string ('x')",
    ],
    [
      () => makeIdempotent(fn, undefined as unknown as MakeIdempotentOptions<[]>),
      'makeIdempotent: `options` must be an object with `redis` and `keyOf`, got undefined',
    ],
    [
      () => makeIdempotent(fn, { keyOf: () => 'k' } as unknown as MakeIdempotentOptions<[]>),
      'makeIdempotent: `redis` is required',
    ],
    [
      () => makeIdempotent(fn, { redis: shared } as unknown as MakeIdempotentOptions<[]>),
      'makeIdempotent: `keyOf` is required',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', fingerprintOf: 'args' as never }),
      "makeIdempotent: `fingerprintOf` must be a function of the arguments, got a string ('args')",
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', name: 'n'.repeat(201) }),
      /^makeIdempotent: `name` must be a string of at most 200 characters, got a string \('n{60}…'\)$/,
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', required: 'yes' as never }),
      "makeIdempotent: `required` must be true or false, got a string ('yes')",
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', leaseMs: 50 }),
      'makeIdempotent: `leaseMs` must be an integer from 100 to 60000, got 50',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', leaseMs: 1000, retentionMs: 1000 }),
      'makeIdempotent: `retentionMs` must be an integer larger than `leaseMs` (1000), got 1000',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', onRedisError: 'maybe' as 'open' }),
      "makeIdempotent: `onRedisError` must be 'closed' or 'open', got a string ('maybe')",
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', keyPrefix: 1 as unknown as string }),
      'makeIdempotent: `keyPrefix` must be a string, got 1',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', waitMs: -1 }),
      'makeIdempotent: `waitMs` must be an integer from 0 to 3600000, got -1',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', maxResultBytes: 0 }),
      'makeIdempotent: `maxResultBytes` must be an integer from 1 to 16777216, got 0',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', logger: { warn() {} } as never }),
      'makeIdempotent: `logger` must have `warn` and `error` methods, got an object (Object)',
    ],
    [
      () => makeIdempotent(fn, { redis: shared, keyOf: () => 'k', registry: {} as Registry }),
      'makeIdempotent: `registry` must be a prom-client Registry, got an object (Object)',
    ],
  ]
  for (const [make, message] of cases) test(String(message), () => assert.throws(make, { message }))

  test('exported from the package root and the idempotency subpath', () => {
    assert.equal(subpath.makeIdempotent, makeIdempotent)
    assert.equal(subpath.IdempotencyInFlightError, IdempotencyInFlightError)
    assert.ok(new IdempotencyKeyMismatchError('k') instanceof IdempotencyError)
  })
})

describe('makeIdempotent: one run per key', () => {
  test('50 concurrent calls with one key: the function runs once and all 50 get its result', async () => {
    const registry = new Registry()
    const { charge, runs, prefix } = charger({ registry, name: 'charge' }, () => sleep(200))
    const order = { orderId: 'order-50', amount: 1250 }
    const results = await Promise.all(Array.from({ length: 50 }, () => charge({ ...order })))
    assert.equal(runs(), 1)
    for (const result of results) assert.deepEqual(result, { chargeId: 'ch_1', amount: 1250, at: 1 })
    // Later calls replay without running.
    assert.deepEqual(await charge(order), results[0])
    assert.equal(runs(), 1)
    const [recordKey, ...others] = await scanKeys(shared, prefix)
    assert.deepEqual(others, [])
    const record = await readIdempotencyRecord(shared, recordKey!)
    assert.equal(record!.state, 'done')
    assert.deepEqual(JSON.parse(record!.body!.toString()), results[0])
    const ttl = await shared.pttl(recordKey!)
    assert.ok(ttl > 10_000 && ttl <= 24 * 3_600_000, String(ttl))
    assert.equal(await counted(registry, 'idempotent_function_calls_total', 'outcome', 'new'), 1)
    assert.equal(await counted(registry, 'idempotent_function_calls_total', 'outcome', 'replayed'), 50)
    assert.equal(await counted(registry, 'idempotent_function_results_total', 'result', 'stored'), 1)
  })

  test('with waitMs 0 a concurrent call throws IdempotencyInFlightError at once', async () => {
    const running = gate()
    const { charge, runs } = charger({ waitMs: 0 }, () => running.opened)
    const order = { orderId: 'order-in-flight', amount: 10 }
    const first = charge(order)
    await waitFor(() => runs() === 1)
    const concurrent = await Promise.allSettled(Array.from({ length: 10 }, () => charge(order)))
    for (const outcome of concurrent) {
      assert.equal(outcome.status, 'rejected')
      const err = (outcome as PromiseRejectedResult).reason
      assert.ok(err instanceof IdempotencyInFlightError)
      assert.equal(err.code, 'FRG_IDEMPOTENCY_IN_FLIGHT')
      assert.equal(err.key, 'order-in-flight')
      assert.ok(err.retryAfterMs > 0 && err.retryAfterMs <= 10_000)
    }
    running.open()
    assert.deepEqual(await first, { chargeId: 'ch_1', amount: 10, at: 1 })
    assert.deepEqual(await charge(order), { chargeId: 'ch_1', amount: 10, at: 1 })
    assert.equal(runs(), 1)
  })

  test('a waiting call gives up with IdempotencyInFlightError once waitMs has passed', async () => {
    const running = gate()
    const { charge, runs } = charger({ waitMs: 300 }, () => running.opened)
    const order = { orderId: 'order-wait', amount: 10 }
    const first = charge(order)
    await waitFor(() => runs() === 1)
    await assert.rejects(charge(order), IdempotencyInFlightError)
    running.open()
    await first
    assert.equal(runs(), 1)
  })

  test('the lease is renewed while the function runs: a slow run keeps its claim', async () => {
    const running = gate()
    const { charge, runs, prefix } = charger({ leaseMs: 200, waitMs: 0 }, () => running.opened)
    const order = { orderId: 'order-slow', amount: 1 }
    const first = charge(order)
    await waitFor(() => runs() === 1)
    // Five leases later the claim is still held: another call is refused, not run.
    await sleep(1000)
    await assert.rejects(charge(order), IdempotencyInFlightError)
    const [recordKey] = await scanKeys(shared, prefix)
    assert.equal(await shared.hget(recordKey!, 'state'), 'processing')
    running.open()
    await first
    assert.equal(runs(), 1)
  })

  test('a claim whose owner crashed is taken over after its lease by exactly one of 20 waiting calls', async () => {
    const prefix = uniquePrefix('idemfn')
    const crashed = createRedisClient(testRedisConnection())
    const crashedLog = captureLog()
    const never = gate()
    let crashedRuns = 0
    let runs = 0
    const order = { orderId: 'order-crash', amount: 99 }
    const options = { keyOf: (o: Order) => o.orderId, keyPrefix: prefix, leaseMs: 300, name: 'ship' }
    // The instance that crashes: its function never finishes and its Redis connection goes away.
    const onCrashed = makeIdempotent(
      async (o: Order) => {
        crashedRuns++
        await never.opened
        return { shipped: o.orderId, by: 'crashed' }
      },
      { ...options, redis: crashed, logger: crashedLog.logger },
    )
    const registry = new Registry()
    const onSurvivor = makeIdempotent(
      async (o: Order) => {
        runs++
        await sleep(50)
        return { shipped: o.orderId, by: 'survivor' }
      },
      { ...options, redis: shared, registry, waitMs: 5000 },
    )
    const abandoned = onCrashed(order)
    await waitFor(() => crashedRuns === 1)
    crashed.disconnect()
    const results = await Promise.all(Array.from({ length: 20 }, () => onSurvivor({ ...order })))
    assert.equal(runs, 1)
    for (const result of results) assert.deepEqual(result, { shipped: 'order-crash', by: 'survivor' })
    assert.equal(await counted(registry, 'idempotent_function_calls_total', 'outcome', 'takeover'), 1)
    const [recordKey] = await scanKeys(shared, prefix)
    assert.equal((await readIdempotencyRecord(shared, recordKey!))?.state, 'done')
    // The crashed owner finishing late gets its own value, and never overwrites the record.
    never.open()
    assert.deepEqual(await abandoned, { shipped: 'order-crash', by: 'crashed' })
    assert.ok(crashedLog.lines.some((l) => l.message === 'idempotency record could not be written'))
    assert.deepEqual(
      JSON.parse((await readIdempotencyRecord(shared, recordKey!))!.body!.toString()),
      results[0],
    )
  })

  test('a claim taken over while its owner still ran is not overwritten by the owner (lost)', async () => {
    const registry = new Registry()
    const running = gate()
    const { charge, runs, prefix } = charger({ registry, name: 'lost' }, () => running.opened)
    const order = { orderId: 'order-lost', amount: 5 }
    const first = charge(order)
    await waitFor(() => runs() === 1)
    const [recordKey] = await scanKeys(shared, prefix)
    await shared.hset(recordKey!, 'token', 'another-owner')
    running.open()
    assert.deepEqual(await first, { chargeId: 'ch_1', amount: 5, at: 1 })
    assert.equal(await shared.hget(recordKey!, 'state'), 'processing')
    assert.equal(await counted(registry, 'idempotent_function_results_total', 'result', 'lost'), 1)
  })
})

describe('makeIdempotent: keys and fingerprints', () => {
  test('other arguments under a used key throw IdempotencyKeyMismatchError, after completion and while running', async () => {
    const running = gate()
    const { charge, runs } = charger({}, (o) => (o.amount === 1 ? running.opened : Promise.resolve()))
    const done = { orderId: 'order-m1', amount: 100 }
    await charge(done)
    await assert.rejects(charge({ ...done, amount: 101 }), (err: IdempotencyKeyMismatchError) => {
      assert.ok(err instanceof IdempotencyKeyMismatchError)
      assert.equal(err.code, 'FRG_IDEMPOTENCY_KEY_MISMATCH')
      assert.equal(err.key, 'order-m1')
      return true
    })
    const inFlight = charge({ orderId: 'order-m2', amount: 1 })
    await waitFor(() => runs() === 2)
    // Mismatch is decided before waiting: the call does not wait for the running one.
    await assert.rejects(charge({ orderId: 'order-m2', amount: 2 }), IdempotencyKeyMismatchError)
    running.open()
    await inFlight
    assert.equal(runs(), 2)
  })

  test('fingerprintOf binds the key to part of the arguments; key order inside objects does not matter', async () => {
    let runs = 0
    const handle = makeIdempotent(
      async (_message: { id: string; body: Record<string, number> }, attempt: number) => ({
        run: ++runs,
        attempt,
      }),
      {
        redis: shared,
        keyPrefix: uniquePrefix('idemfn'),
        keyOf: (message) => message.id,
        fingerprintOf: (message) => message.body,
      },
    )
    const first = await handle({ id: 'm-1', body: { a: 1, b: 2 } }, 1)
    // A redelivery: another attempt number, the body's fields in another order.
    assert.deepEqual(await handle({ id: 'm-1', body: { b: 2, a: 1 } }, 2), first)
    await assert.rejects(handle({ id: 'm-1', body: { a: 1, b: 3 } }, 3), IdempotencyKeyMismatchError)
    assert.equal(runs, 1)
  })

  test('no key: IdempotencyKeyInvalidError unless `required: false`, which runs unguarded; invalid keys throw', async () => {
    const prefix = uniquePrefix('idemfn')
    let runs = 0
    const options = { redis: shared, keyPrefix: prefix, keyOf: (key: unknown) => key as string | null }
    const strict = makeIdempotent(async (_key: unknown) => ++runs, options)
    const lenient = makeIdempotent(async (_key: unknown) => ++runs, { ...options, required: false })
    for (const missing of [null, undefined]) {
      await assert.rejects(strict(missing), (err: IdempotencyKeyInvalidError) => {
        assert.ok(err instanceof IdempotencyKeyInvalidError)
        assert.equal(err.code, 'FRG_IDEMPOTENCY_KEY_INVALID')
        assert.equal(err.message, 'keyOf returned no key for this call')
        return true
      })
    }
    assert.equal(runs, 0)
    assert.equal(await lenient(null), 1)
    assert.equal(await lenient(undefined), 2)
    for (const invalid of ['', 'k'.repeat(1025), 42, { id: 1 }]) {
      await assert.rejects(strict(invalid), {
        name: 'IdempotencyKeyInvalidError',
        message: 'keyOf must return a string of 1 to 1024 characters',
      })
      await assert.rejects(lenient(invalid), IdempotencyKeyInvalidError)
    }
    assert.equal(runs, 2)
    assert.deepEqual(await scanKeys(shared, prefix), [])
    // Any characters are a key: it is hashed into the record's name.
    assert.equal(await strict('clé avec espaces ✓'), 3)
    assert.equal(await strict('clé avec espaces ✓'), 3)
  })

  test('cyclic arguments without fingerprintOf throw a coded TypeError before running', async () => {
    let runs = 0
    const handle = makeIdempotent(async (_job: object) => ++runs, {
      redis: shared,
      keyPrefix: uniquePrefix('idemfn'),
      keyOf: () => 'job-1',
    })
    const job: Record<string, unknown> = { id: 'job-1' }
    job.self = job
    await assert.rejects(handle(job), (err: IdempotencyFingerprintTooLargeError) => {
      assert.ok(err instanceof IdempotencyFingerprintTooLargeError && err instanceof TypeError)
      assert.equal(err.code, 'FRG_IDEMPOTENCY_FINGERPRINT_TOO_LARGE')
      assert.match(err.message, /over 1048576 characters of JSON/)
      return true
    })
    assert.equal(runs, 0)
  })

  test('functions with different names never share records; with one name they do', async () => {
    const prefix = uniquePrefix('idemfn')
    const options = { redis: shared, keyPrefix: prefix, keyOf: (id: string) => id }
    const email = makeIdempotent(async (id: string) => `email ${id}`, { ...options, name: 'email' })
    const invoice = makeIdempotent(async (id: string) => `invoice ${id}`, { ...options, name: 'invoice' })
    const sameName = makeIdempotent(async (id: string) => `other ${id}`, { ...options, name: 'email' })
    assert.equal(await email('o-1'), 'email o-1')
    assert.equal(await invoice('o-1'), 'invoice o-1')
    assert.equal(await sameName('o-1'), 'email o-1')
    assert.equal((await scanKeys(shared, prefix)).length, 2)
  })
})

describe('makeIdempotent: failures and results', () => {
  test('the function throwing releases the claim and rethrows; a retry runs again and is kept', async () => {
    const registry = new Registry()
    const boom = new Error('card declined by the network')
    const { charge, runs, prefix } = charger({ registry }, async () => {
      if (runs() === 1) throw boom
    })
    const order = { orderId: 'order-throw', amount: 7 }
    await assert.rejects(charge(order), (err) => err === boom)
    assert.deepEqual(await scanKeys(shared, prefix), [])
    assert.deepEqual(await charge(order), { chargeId: 'ch_2', amount: 7, at: 2 })
    assert.deepEqual(await charge(order), { chargeId: 'ch_2', amount: 7, at: 2 })
    assert.equal(runs(), 2)
    assert.equal(await counted(registry, 'idempotent_function_results_total', 'result', 'released'), 1)
  })

  test('calls waiting on a run that throws: the first gets the error, one waiter runs again, the rest get its result', async () => {
    const { charge, runs } = charger({}, async () => {
      await sleep(100)
      if (runs() === 1) throw new Error('transient')
    })
    const order = { orderId: 'order-throw-waiters', amount: 3 }
    const first = charge(order)
    await waitFor(() => runs() === 1)
    const waiting = Promise.allSettled(Array.from({ length: 10 }, () => charge(order)))
    await assert.rejects(first, { message: 'transient' })
    const outcomes = await waiting
    assert.equal(runs(), 2)
    for (const outcome of outcomes)
      assert.deepEqual(outcome, { status: 'fulfilled', value: { chargeId: 'ch_2', amount: 3, at: 2 } })
  })

  test('a result over maxResultBytes or not JSON is returned once, then IdempotencyResultNotKeptError', async () => {
    const registry = new Registry()
    let runs = 0
    const big = makeIdempotent(async (size: number) => ({ run: ++runs, data: 'x'.repeat(size) }), {
      redis: shared,
      keyPrefix: uniquePrefix('idemfn'),
      keyOf: (size) => `big-${size}`,
      maxResultBytes: 100,
      registry,
    })
    // At the cap (exactly 100 bytes of JSON) it is kept; one byte over it is not.
    const atCap = 100 - JSON.stringify({ run: 1, data: '' }).length
    assert.equal((await big(atCap)).run, 1)
    assert.equal((await big(atCap)).run, 1)
    assert.equal((await big(atCap + 1)).run, 2)
    await assert.rejects(big(atCap + 1), (err: IdempotencyResultNotKeptError) => {
      assert.ok(err instanceof IdempotencyResultNotKeptError)
      assert.equal(err.code, 'FRG_IDEMPOTENCY_RESULT_NOT_KEPT')
      return true
    })
    assert.equal(runs, 2)
    const bigint = makeIdempotent(async () => 10n ** 30n, {
      redis: shared,
      keyPrefix: uniquePrefix('idemfn'),
      keyOf: () => 'bigint',
    })
    assert.equal(await bigint(), 10n ** 30n)
    await assert.rejects(bigint(), IdempotencyResultNotKeptError)
    assert.equal(await counted(registry, 'idempotent_function_results_total', 'result', 'not_kept'), 1)
  })

  test('results come back as JSON: undefined, null, numbers, strings and nested values replay alike', async () => {
    const values: unknown[] = [undefined, null, 0, 'text', [1, { a: [true, null] }], { b: 'é', n: -1.5 }]
    let runs = 0
    const echo = makeIdempotent(
      async (i: number) => {
        runs++
        return values[i]
      },
      { redis: shared, keyPrefix: uniquePrefix('idemfn'), keyOf: (i) => `v-${i}` },
    )
    for (let i = 0; i < values.length; i++) {
      assert.deepEqual(await echo(i), values[i])
      assert.deepEqual(await echo(i), values[i])
    }
    assert.equal(runs, values.length)
  })

  test("Redis down: 'closed' throws IdempotencyStoreUnavailableError without running; 'open' runs", async (t) => {
    const server = await startRedisServer()
    const redis = createRedisClient({ url: server.url })
    t.after(async () => {
      redis.disconnect()
      await server.stop()
    })
    let runs = 0
    const options = { redis, keyOf: (id: string) => id }
    const closed = makeIdempotent(async (id: string) => `${id} ${++runs}`, options)
    const open = makeIdempotent(async (id: string) => `${id} ${++runs}`, {
      ...options,
      onRedisError: 'open',
    })
    assert.equal(await closed('up'), 'up 1')
    await server.stop()
    await assert.rejects(closed('down'), (err: IdempotencyStoreUnavailableError) => {
      assert.ok(err instanceof IdempotencyStoreUnavailableError)
      assert.equal(err.code, 'FRG_IDEMPOTENCY_STORE_UNAVAILABLE')
      assert.ok(err.cause instanceof Error)
      return true
    })
    assert.equal(runs, 1)
    assert.equal(await open('down'), 'down 2')
    assert.equal(await open('down'), 'down 3')
  })

  test('a result that cannot be stored is still returned; the claim stays until its lease ends', async (t) => {
    const server = await startRedisServer()
    const redis = createRedisClient({ url: server.url, commandTimeoutMs: 200 })
    const admin = new Redis(server.url)
    const log = captureLog()
    t.after(async () => {
      redis.disconnect()
      admin.disconnect()
      await server.stop()
    })
    const running = gate()
    let runs = 0
    const ship = makeIdempotent(
      async (id: string) => {
        runs++
        await running.opened
        return `shipped ${id}`
      },
      { redis, keyOf: (id) => id, leaseMs: 10_000, waitMs: 0, logger: log.logger },
    )
    const first = ship('p-1')
    await waitFor(() => runs === 1)
    // Writes (scripts included) block past the client's command timeout; killing the connection
    // afterwards drops the blocked write, so the store really failed.
    const clientId = await redis.call('CLIENT', 'ID')
    await admin.call('CLIENT', 'PAUSE', '5000', 'WRITE')
    running.open()
    assert.equal(await first, 'shipped p-1')
    await admin.call('CLIENT', 'KILL', 'ID', String(clientId))
    await admin.call('CLIENT', 'UNPAUSE')
    await waitFor(() => redis.status === 'ready')
    assert.ok(
      log.lines.some((l) => l.level === 'error' && l.message === 'idempotency record could not be written'),
    )
    const [recordKey] = await scanKeys(admin, 'idem:')
    assert.equal(await admin.hget(recordKey!, 'state'), 'processing')
    // The live claim refuses another run until its lease ends; it was not deleted.
    await assert.rejects(ship('p-1'), IdempotencyInFlightError)
    assert.equal(runs, 1)
  })
})
