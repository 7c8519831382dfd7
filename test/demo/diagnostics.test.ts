import assert from 'node:assert/strict'
import diagnostics from 'node:diagnostics_channel'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { CHANNELS, createDelayedQueue, createFeed, createLock } from '../../src/index.ts'
import { connectRedis, createRedisClient } from '../../src/plugins/redis/index.ts'
import { buildTestApp, createCustomer, login, type TestApp } from '../helpers/gateway.ts'
import { testRedisConnection, uniquePrefix } from '../helpers/index.ts'

// Every tracing channel, as docs/observability.md documents it: each plugin's decisions through
// the demo gateway (a login, cached reads, a transfer claimed then replayed, a refusal by the IP
// limit) and each primitive's operations, captured at asyncEnd. Each context has exactly the
// fields the docs list (plus `result`, which Node adds), with the values the operations decided.

const docs = readFileSync(join(import.meta.dirname, '../../docs/observability.md'), 'utf8')

/** The top-level fields the docs' channel table lists for `channel` (parenthesised details left out). */
function documentedFields(channel: string): string[] {
  const row = docs.split('\n').find((line) => line.startsWith(`| \`${channel}\` |`))
  assert.ok(row, `docs/observability.md has no row for ${channel}`)
  let cell = row.split(' | ')[2]!
  // Parentheses hold details (values, nested fields); drop them, innermost first.
  while (/\([^()]*\)/.test(cell)) cell = cell.replace(/\([^()]*\)/g, '')
  return [...cell.matchAll(/`([A-Za-z]+)`/g)].map((m) => m[1]!).sort()
}

const seen = new Map<string, Array<Record<string, unknown>>>()
const unsubscribe: Array<() => void> = []
for (const name of Object.values(CHANNELS)) {
  const handlers = {
    asyncEnd(context: object) {
      seen.set(name, [...(seen.get(name) ?? []), { ...(context as Record<string, unknown>) }])
    },
  }
  // Only asyncEnd: Node calls the handlers a subscriber has.
  diagnostics.tracingChannel(name).subscribe(handlers as never)
  unsubscribe.push(() => diagnostics.tracingChannel(name).unsubscribe(handlers as never))
}

let t: TestApp
const redis = createRedisClient({ ...testRedisConnection(), commandTimeoutMs: 10_000 })
before(async () => {
  await connectRedis(redis)
  t = await buildTestApp({ RATE_LIMIT_IP: '8,0.001' }, { rateLimits: 'on' })
})
after(async () => {
  for (const stop of unsubscribe) stop()
  await t?.close()
  redis.disconnect()
})

const fieldsOf = (context: Record<string, unknown>) =>
  Object.keys(context)
    .filter((k) => k !== 'result')
    .sort()

test('each plugin publishes its decisions with the documented fields', async () => {
  const alice = await createCustomer(t.db, `diag-alice-${Date.now()}`, [1_000_000])
  const bob = await createCustomer(t.db, `diag-bob-${Date.now()}`, [0])
  const cookie = await login(t.app, alice)
  const read = () => t.app.inject({ url: `/accounts/${alice.accountIds[0]}/balance`, headers: { cookie } })
  assert.equal((await read()).statusCode, 200)
  assert.equal((await read()).statusCode, 200)
  const send = () =>
    t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': 'diag-transfer-1' },
      payload: {
        fromAccountId: alice.accountIds[0],
        toAccountId: bob.accountIds[0],
        amount: 5,
        currency: 'VND',
      },
    })
  assert.equal((await send()).statusCode, 201)
  const replay = await send()
  assert.equal(replay.headers['idempotent-replayed'], 'true')
  // The IP bucket holds 8: the login, two reads and two transfers took 5; the 9th request is refused.
  let refused = 0
  for (let i = 0; i < 5; i++) if ((await read()).statusCode === 429) refused++
  assert.ok(refused >= 1, 'the IP limit refused a request')

  for (const channel of [CHANNELS.rateLimit, CHANNELS.session, CHANNELS.idempotency, CHANNELS.cache]) {
    const contexts = seen.get(channel) ?? []
    assert.ok(contexts.length > 0, `${channel}: published`)
    for (const context of contexts) assert.deepEqual(fieldsOf(context), documentedFields(channel), channel)
  }

  const limits = seen.get(CHANNELS.rateLimit)!
  const decision = (limits[0]!.decisions as Array<Record<string, unknown>>)[0]!
  assert.deepEqual(Object.keys(decision).sort(), [
    'algorithm',
    'limit',
    'outcome',
    'policy',
    'remaining',
    'resetMs',
    'shadow',
  ])
  const rejected = limits.filter((c) => c.rejected === 'ip')
  assert.ok(rejected.length >= 1)
  assert.ok(
    (rejected[0]!.decisions as Array<{ policy: string; outcome: string }>).some(
      (d) => d.policy === 'ip' && d.outcome === 'rejected',
    ),
  )
  const transfers = limits.find((c) =>
    (c.decisions as Array<{ policy: string }>).some((d) => d.policy === 'transfers-shadow'),
  )
  assert.ok(transfers, 'the shadow policy is among a transfer’s decisions')
  assert.equal(
    (transfers.decisions as Array<{ policy: string; shadow: boolean }>).find(
      (d) => d.policy === 'transfers-shadow',
    )!.shadow,
    true,
  )

  assert.ok(seen.get(CHANNELS.session)!.some((c) => c.decision === 'found'))
  assert.deepEqual(
    seen.get(CHANNELS.idempotency)!.map((c) => c.outcome),
    ['claimed', 'replayed'],
  )
  const reads = seen.get(CHANNELS.cache)!.filter((c) => String(c.key).startsWith('account:'))
  assert.ok(reads.length >= 2)
  assert.equal(reads[0]!.usage, 'miss')
  assert.equal(reads[0]!.loaded, true)
  assert.ok(['hit', 'l1'].includes(String(reads[1]!.usage)), `second read: ${String(reads[1]!.usage)}`)
  assert.equal(reads[1]!.loaded, false)
})

test('each primitive publishes its operations with the documented fields', async () => {
  const prefix = uniquePrefix('diag')
  const lock = createLock(redis, { keyPrefix: `${prefix}lock:` })
  const handle = await lock.acquire('res', 10_000)
  assert.ok(handle)
  assert.equal(await lock.acquire('res', 10_000), null)
  await lock.release(handle)

  const queue = createDelayedQueue(redis, { name: `${prefix}q`, keyPrefix: `${prefix}dq:` })
  await queue.schedule('job-1', Date.now() - 1)
  await queue.move()
  const id = await queue.take()
  assert.equal(id, 'job-1')
  await queue.ack(id!)
  assert.equal(await queue.take(), null)

  const feed = createFeed(redis, {
    keyPrefix: `${prefix}feed:`,
    source: {
      followingOf: async () => [],
      followerCountsOf: async (producers) => producers.map(() => 0),
      itemsOf: async () => [],
    },
  })
  await feed.publish({ id: 'item-1', producer: 'p1', at: Date.now() })
  await feed.read('reader-1')

  for (const channel of [CHANNELS.lock, CHANNELS.delayedQueue, CHANNELS.feed]) {
    const contexts = seen.get(channel) ?? []
    assert.ok(contexts.length > 0, `${channel}: published`)
    for (const context of contexts) assert.deepEqual(fieldsOf(context), documentedFields(channel), channel)
  }
  const attempts = seen.get(CHANNELS.lock)!.filter((c) => c.name === 'res')
  assert.deepEqual(
    attempts.map((c) => c.acquired),
    [true, false],
  )
  assert.equal(attempts[0]!.fence, handle.fence)
  assert.equal(attempts[1]!.fence, null)
  assert.deepEqual(
    seen
      .get(CHANNELS.delayedQueue)!
      .filter((c) => c.queue === `${prefix}q`)
      .map((c) => `${c.operation}:${c.count}`),
    ['schedule:1', 'take:1', 'ack:1', 'take:0'],
  )
  assert.deepEqual(
    seen.get(CHANNELS.feed)!.map((c) => `${c.operation}:${c.id}:${c.mode}:${c.count}`),
    ['publish:p1:push:0', 'read:reader-1:null:0'],
  )
  await queue.stop()
})

test('with nobody subscribed, nothing is traced', () => {
  for (const stop of unsubscribe) stop()
  for (const name of Object.values(CHANNELS))
    assert.equal(diagnostics.tracingChannel(name).hasSubscribers, false)
})
