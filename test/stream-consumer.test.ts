import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { Redis } from 'ioredis'
import { createStreamConsumer, type StreamConsumer, type StreamEntry } from '../src/index.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from './helpers.ts'

// The consumer-group runtime on a real Redis: at-least-once across a dead consumer, the dead-letter
// stream, several groups on one stream, a graceful stop.

let redis: Redis
const prefix = uniquePrefix('sc')
const consumers: StreamConsumer[] = []

before(() => {
  redis = new Redis(TEST_REDIS_URL)
})
after(async () => {
  for (const c of consumers) await c.stop()
  const keys = await scanKeys(redis, prefix)
  if (keys.length) await redis.del(...keys)
  await redis.quit()
})

async function until(check: () => Promise<boolean> | boolean, what: string, ms = 15_000): Promise<void> {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

async function addEntries(stream: string, n: number, extra: Record<string, string> = {}): Promise<string[]> {
  const ids: string[] = []
  for (let i = 0; i < n; i++) {
    ids.push((await redis.xadd(stream, '*', 'n', String(i), ...Object.entries(extra).flat())) as string)
  }
  return ids
}

function start(options: Parameters<typeof createStreamConsumer>[1]): StreamConsumer {
  const consumer = createStreamConsumer(redis, { blockMs: 200, ...options })
  consumers.push(consumer)
  return consumer
}

const pendingCount = async (stream: string, group: string) =>
  Number(((await redis.xpending(stream, group)) as [number])[0])

test('entries a dead consumer held are claimed after the visibility timeout and handled (at-least-once)', async () => {
  const stream = `${prefix}crash`
  await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
  const ids = await addEntries(stream, 5)
  // A consumer that read everything and died: all five pending under its name, never acknowledged.
  const taken = (await redis.xreadgroup(
    'GROUP',
    'g',
    'dead',
    'COUNT',
    10,
    'STREAMS',
    stream,
    '>',
  )) as unknown[]
  assert.equal(taken.length, 1)
  assert.equal(await pendingCount(stream, 'g'), 5)

  const handled: StreamEntry[] = []
  const survivor = start({
    stream,
    group: 'g',
    consumer: 'alive',
    visibilityTimeoutMs: 200,
    handler: async (entry) => void handled.push(entry),
  })
  await survivor.start()
  await until(async () => handled.length >= 5 && (await pendingCount(stream, 'g')) === 0, 'the claim')
  assert.deepEqual(
    handled.map((e) => e.id),
    ids,
  )
  assert.ok(handled.every((e) => e.deliveries === 2))
  await survivor.stop()
})

test('a poison entry goes to the dead-letter stream after maxDeliveries and the group moves on', async () => {
  const stream = `${prefix}poison`
  const dead = `${prefix}poison:dead`
  const attempts = new Map<string, number>()
  const handled: string[] = []
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c1',
    visibilityTimeoutMs: 100,
    maxDeliveries: 3,
    deadLetterStream: dead,
    handler: async (entry) => {
      attempts.set(entry.id, (attempts.get(entry.id) ?? 0) + 1)
      if (entry.fields.poison) throw new Error('cannot parse this')
      handled.push(entry.id)
    },
  })
  await consumer.start()
  const [before] = await addEntries(stream, 1)
  const [poison] = await addEntries(stream, 1, { poison: 'yes' })
  const afterIds = await addEntries(stream, 2)
  await until(async () => (await redis.xlen(dead)) === 1, 'the dead letter')
  await until(async () => handled.length === 3 && (await pendingCount(stream, 'g')) === 0, 'the rest')
  assert.deepEqual(handled, [before, ...afterIds])
  assert.equal(attempts.get(poison!), 3)
  const [entry] = (await redis.xrange(dead, '-', '+')) as Array<[string, string[]]>
  const fields = entry![1]
  const record: Record<string, string> = {}
  for (let i = 0; i + 1 < fields.length; i += 2) record[fields[i]!] = fields[i + 1]!
  assert.equal(record._id, poison)
  assert.equal(record._group, 'g')
  assert.equal(record._deliveries, '3')
  assert.equal(record.poison, 'yes')
  assert.match(record._error!, /cannot parse this/)
  // Entries added after the dead letter are still handled.
  const [late] = await addEntries(stream, 1)
  await until(() => handled.includes(late!), 'a later entry')
  await consumer.stop()
})

test('two groups on one stream each see every entry; consumers within a group share them', async () => {
  const stream = `${prefix}groups`
  const seen: Record<string, string[]> = { audit: [], mail: [] }
  const group = (name: 'audit' | 'mail', consumer: string) =>
    start({ stream, group: name, consumer, handler: async (e) => void seen[name]!.push(e.id) })
  const all = [group('audit', 'a1'), group('mail', 'm1'), group('mail', 'm2')]
  await Promise.all(all.map((c) => c.start()))
  const ids = await addEntries(stream, 20)
  await until(() => seen.audit!.length === 20 && seen.mail!.length === 20, 'both groups')
  assert.deepEqual(seen.audit, ids)
  assert.deepEqual([...seen.mail!].sort(), [...ids].sort())
  assert.equal(await pendingCount(stream, 'audit'), 0)
  assert.equal(await pendingCount(stream, 'mail'), 0)
  await Promise.all(all.map((c) => c.stop()))
})

test('a graceful stop lets the entry in hand finish and acknowledges it', async () => {
  const stream = `${prefix}stop`
  let release!: () => void
  const gate = new Promise<void>((r) => {
    release = r
  })
  let started = false
  let finished = false
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c1',
    handler: async () => {
      started = true
      await gate
      finished = true
    },
  })
  await consumer.start()
  await addEntries(stream, 1)
  await until(() => started, 'the handler')
  const stopping = consumer.stop()
  release()
  await stopping
  assert.equal(finished, true)
  assert.equal(consumer.running, false)
  assert.equal(await pendingCount(stream, 'g'), 0)
})
