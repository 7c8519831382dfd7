import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { Redis } from 'ioredis'
import { type RedisServerProcess, startRedisServer } from '../../src/embedded/redis-server.ts'
import { createStreamConsumer, type StreamConsumer, type StreamEntry } from '../../src/index.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

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

test('a claim among entries this consumer already holds handles every claimed entry, dead-letters none', async () => {
  const stream = `${prefix}interleaved`
  const dead = `${stream}:dead`
  await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
  const ids = await addEntries(stream, 5)
  await redis.xreadgroup('GROUP', 'g', 'dead', 'COUNT', 10, 'STREAMS', stream, '>')
  // The second and fourth are this consumer's, failed a moment ago (not idle yet); the others a
  // dead consumer's, idle for a minute: a claim takes those three, with these two in their range.
  await redis.call('XCLAIM', stream, 'g', 'alive', '0', ids[1]!, ids[3]!, 'IDLE', '0', 'JUSTID')
  await redis.call('XCLAIM', stream, 'g', 'dead', '0', ids[0]!, ids[2]!, ids[4]!, 'IDLE', '60000', 'JUSTID')
  const handled: string[] = []
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'alive',
    visibilityTimeoutMs: 30_000,
    deadLetterStream: dead,
    handler: async (entry) => void handled.push(entry.id),
  })
  await consumer.start()
  await until(async () => (await pendingCount(stream, 'g')) === 2, 'the claimed three handled')
  await consumer.stop()
  assert.deepEqual(handled, [ids[0], ids[2], ids[4]])
  assert.equal(await redis.xlen(dead), 0)
})

test('an onError that throws does not stop the consumer', async () => {
  const stream = `${prefix}throwing-on-error`
  const handled: string[] = []
  let reported = 0
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c1',
    onError: () => {
      reported++
      throw new Error('the error callback failed too')
    },
    handler: async (entry) => {
      if (entry.fields.bad) throw new Error('cannot handle this')
      handled.push(entry.id)
    },
  })
  await consumer.start()
  await addEntries(stream, 1, { bad: 'yes' })
  await until(() => reported === 1, 'the failure reported')
  const later = await addEntries(stream, 2)
  await until(() => handled.length === 2, 'later entries handled')
  assert.deepEqual(handled, later)
  await consumer.stop()
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

test('the dead-letter stream keeps about deadLetterMaxLen entries, the newest', async () => {
  const stream = `${prefix}many-poisons`
  const dead = `${stream}:dead`
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c1',
    maxDeliveries: 1,
    deadLetterMaxLen: 10,
    batch: 50,
    handler: async () => {
      throw new Error('every entry is poison')
    },
  })
  await consumer.start()
  const add = redis.multi()
  for (let i = 0; i < 250; i++) add.xadd(stream, '*', 'n', String(i))
  const ids = ((await add.exec()) ?? []).map(([, id]) => id as string)
  const last = async () =>
    ((await redis.xrevrange(dead, '+', '-', 'COUNT', 1)) as Array<[string, string[]]>)[0]
  await until(async () => (await last())?.[1].includes(ids.at(-1)!) === true, 'the last dead letter')
  await consumer.stop()
  assert.equal(await pendingCount(stream, 'g'), 0)
  // MAXLEN ~ trims whole nodes (100 entries by default): at least the cap, at most a node more.
  const length = await redis.xlen(dead)
  assert.ok(length >= 10 && length <= 110, `${length} dead letters kept of 250`)
  for (const deadLetterMaxLen of [0, 1.5, '10'])
    assert.throws(
      () =>
        createStreamConsumer(redis, {
          stream,
          group: 'g',
          consumer: 'c2',
          handler: async () => {},
          deadLetterMaxLen,
        } as never),
      { code: 'FRG_INVALID_OPTION', message: /deadLetterMaxLen/ },
    )
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

test('a stop hands back entries Redis delivered to it whose read reply never arrived', async () => {
  const stream = `${prefix}lost-reply`
  await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
  const ids = await addEntries(stream, 3)
  // What a stop racing a blocked read leaves: the entries are pending under c1's name, and c1 never saw them.
  await redis.xreadgroup('GROUP', 'g', 'c1', 'COUNT', 10, 'STREAMS', stream, '>')
  const handled: string[] = []
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c1',
    visibilityTimeoutMs: 600_000,
    handler: async (entry) => void handled.push(entry.id),
  })
  await consumer.start()
  await consumer.stop()
  assert.equal(handled.length, 0)
  const pending = (await redis.xpending(stream, 'g', '-', '+', 10)) as Array<[string, string, number, number]>
  assert.deepEqual(
    pending.map(([id, , idle, deliveries]) => ({ id, handedBack: idle >= 600_000, deliveries })),
    ids.map((id) => ({ id, handedBack: true, deliveries: 1 })),
  )
  // Another consumer's first claim takes them at once, not after ten minutes.
  const other = start({
    stream,
    group: 'g',
    consumer: 'c2',
    visibilityTimeoutMs: 600_000,
    handler: async (entry) => void handled.push(entry.id),
  })
  await other.start()
  await until(async () => handled.length === 3 && (await pendingCount(stream, 'g')) === 0, 'the claim')
  assert.deepEqual(handled, ids)
  await other.stop()
})

test('handleBatch: a read is handled in one call and acknowledged in one XACK; a failing entry is isolated', async () => {
  const stream = `${prefix}batch`
  await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
  const ids = await addEntries(stream, 6, {})
  const [poison] = await addEntries(stream, 1, { poison: 'yes' })
  const calls: string[][] = []
  const done = new Set<string>()
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c1',
    batch: 50,
    visibilityTimeoutMs: 600_000,
    handleBatch: async (entries) => {
      calls.push(entries.map((e) => e.id))
      if (entries.some((e) => e.fields.poison)) throw new Error('cannot parse this')
      for (const e of entries) done.add(e.id)
    },
  })
  await consumer.start()
  // The poison entry's own call comes after the sixth good one: wait for all eight calls.
  await until(() => done.size === 6 && calls.length === 8, 'the good entries and the poison alone')
  // All seven together, then each alone: six succeed and are acknowledged, the poison stays pending.
  assert.deepEqual(calls[0], [...ids, poison])
  assert.deepEqual(
    calls.slice(1),
    [...ids, poison].map((id) => [id]),
  )
  await until(async () => (await pendingCount(stream, 'g')) === 1, 'the acknowledgements')
  const pending = (await redis.xpending(stream, 'g', '-', '+', 10)) as Array<[string]>
  assert.deepEqual(
    pending.map(([id]) => id),
    [poison],
  )
  await consumer.stop()
})

test('appendEachOnce: several entries in one call, each once per marker, published once', async (t) => {
  const { appendEachOnce } = await import('../../src/index.ts')
  const stream = `${prefix}append:{c}`
  const channel = `${prefix}append-channel:{c}`
  const listener = new Redis(TEST_REDIS_URL)
  const messages: string[] = []
  await listener.subscribe(channel)
  listener.on('message', (_channel, message) => messages.push(message))
  t.after(() => listener.quit())
  const entries = ['e1', 'e2', 'e3'].map((event) => ({
    marker: `${prefix}append-seen:{c}:${event}`,
    fields: { event },
    message: { event },
  }))
  const first = await appendEachOnce(redis, { stream, channel, markerTtlMs: 60_000, entries })
  const again = await appendEachOnce(redis, {
    stream,
    channel,
    markerTtlMs: 60_000,
    entries: [entries[1]!, { marker: `${prefix}append-seen:{c}:e4`, fields: { event: 'e4' } }],
  })
  assert.deepEqual(
    first.map((r) => r.appended),
    [true, true, true],
  )
  assert.deepEqual(again[0], { id: first[1]!.id, appended: false })
  assert.equal(again[1]!.appended, true)
  const stored = (await redis.xrange(stream, '-', '+')) as Array<[string, string[]]>
  assert.deepEqual(
    stored.map(([id, fields]) => [id, fields[1]]),
    [...first.map((r, i) => [r.id, `e${i + 1}`]), [again[1]!.id, 'e4']],
  )
  await until(() => messages.length === 4, 'the messages')
  assert.deepEqual(JSON.parse(messages[0]!), { id: first[0]!.id, event: 'e1' })
  assert.deepEqual(JSON.parse(messages[3]!), { id: again[1]!.id })
})

/** Every command `client` sends from now on, once connected (its ready check is not one). */
async function commandsSentBy(client: Redis): Promise<Array<{ name: string; args: unknown[] }>> {
  await client.ping()
  const commands: Array<{ name: string; args: unknown[] }> = []
  const send = client.sendCommand.bind(client)
  client.sendCommand = (command, stream) => {
    commands.push(command)
    return send(command, stream)
  }
  return commands
}

/** Customers' notifications in one call: entries name their own stream and channel. */
const acrossStreams = (tags: string[], event: string) =>
  tags.map((tag) => ({
    stream: `${prefix}across:{${tag}}`,
    channel: `${prefix}across-channel:{${tag}}`,
    marker: `${prefix}across-seen:{${tag}}:${event}`,
    fields: { event },
    message: { event },
  }))

test('appendEachOnce: entries of several streams in one script call, each once, each on its own channel', async (t) => {
  const { appendEachOnce } = await import('../../src/index.ts')
  const client = new Redis(TEST_REDIS_URL)
  const listener = new Redis(TEST_REDIS_URL)
  const messages: Array<[string, string]> = []
  await listener.subscribe(`${prefix}across-channel:{a}`, `${prefix}across-channel:{b}`)
  listener.on('message', (channel, message) => messages.push([channel, message]))
  const commands = await commandsSentBy(client)
  t.after(async () => {
    client.disconnect()
    await listener.quit()
  })
  const first = await appendEachOnce(client, {
    markerTtlMs: 60_000,
    entries: acrossStreams(['a', 'b', 'a'], 'e1'),
  })
  // The third entry repeats the first's marker: it is the first's, not appended again.
  assert.deepEqual(
    first.map((r) => r.appended),
    [true, true, false],
  )
  assert.equal(first[2]!.id, first[0]!.id)
  // One script call: EVALSHA, and EVAL only if the server did not know the script yet.
  assert.deepEqual(
    commands.map((c) => c.name).filter((name) => name !== 'eval'),
    ['evalsha'],
  )
  const again = await appendEachOnce(client, {
    markerTtlMs: 60_000,
    entries: [...acrossStreams(['b'], 'e1'), ...acrossStreams(['b'], 'e2')],
  })
  assert.deepEqual(again[0], { id: first[1]!.id, appended: false })
  assert.equal(again[1]!.appended, true)
  const a = (await redis.xrange(`${prefix}across:{a}`, '-', '+')) as Array<[string, string[]]>
  const b = (await redis.xrange(`${prefix}across:{b}`, '-', '+')) as Array<[string, string[]]>
  assert.deepEqual(
    a.map(([id, fields]) => [id, fields[1]]),
    [[first[0]!.id, 'e1']],
  )
  assert.deepEqual(
    b.map(([id, fields]) => [id, fields[1]]),
    [
      [first[1]!.id, 'e1'],
      [again[1]!.id, 'e2'],
    ],
  )
  await until(() => messages.length === 3, 'the messages')
  assert.deepEqual(
    messages.map(([channel, message]) => [channel, JSON.parse(message)]),
    [
      [`${prefix}across-channel:{a}`, { id: first[0]!.id, event: 'e1' }],
      [`${prefix}across-channel:{b}`, { id: first[1]!.id, event: 'e1' }],
      [`${prefix}across-channel:{b}`, { id: again[1]!.id, event: 'e2' }],
    ],
  )
  await assert.rejects(
    appendEachOnce(client, { markerTtlMs: 1000, entries: [{ marker: `${prefix}x`, fields: { a: '1' } }] }),
    { code: 'FRG_INVALID_OPTION', message: /an entry has no stream/ },
  )
})

test('appendEachOnce: a marker lifetime that is not a positive whole number is refused before anything is appended', async () => {
  const { appendEachOnce } = await import('../../src/index.ts')
  const stream = `${prefix}bad-ttl`
  for (const markerTtlMs of [0, -1, 1.5, Number.NaN])
    await assert.rejects(
      appendEachOnce(redis, {
        stream,
        markerTtlMs,
        entries: [{ marker: `${stream}:m`, fields: { a: '1' } }],
      }),
      /markerTtlMs/,
    )
  assert.equal(await redis.exists(stream), 0)
})

test('appendEachOnce with streamTtlMs: each stream appended to gets the TTL, refreshed by every append, and loses its expired entries', async () => {
  const { appendEachOnce } = await import('../../src/index.ts')
  const a = `${prefix}ttl:{a}`
  const b = `${prefix}ttl:{b}`
  const plain = `${prefix}ttl:{plain}`
  // 150 entries of two hours ago on `a`: a full node (100 entries) of them can go at once (MINID ~).
  const old = Date.now() - 7_200_000
  const fill = redis.multi()
  for (let i = 0; i < 150; i++) fill.xadd(a, `${old}-${i}`, 'n', String(i))
  await fill.exec()
  const entry = (stream: string, event: string) => ({
    stream,
    marker: `${stream}:seen:${event}`,
    fields: { event },
  })
  const first = await appendEachOnce(redis, {
    markerTtlMs: 60_000,
    streamTtlMs: 3_600_000,
    entries: [entry(a, 'e1'), entry(b, 'e1')],
  })
  for (const stream of [a, b]) {
    const ttl = await redis.pttl(stream)
    assert.ok(ttl > 0 && ttl <= 3_600_000, `${stream} TTL ${ttl} ms`)
  }
  // The first node, all older than the TTL, is gone; what is left ends with the new entry.
  const kept = (await redis.xrange(a, '-', '+')) as Array<[string, string[]]>
  assert.ok(kept.length < 151, `kept ${kept.length} of 151`)
  assert.notEqual(kept[0]![0], `${old}-0`)
  assert.equal(kept.at(-1)![0], first[0]!.id)
  // Every append refreshes the TTL; a marker seen before appends nothing and leaves it alone.
  await redis.pexpire(a, 1000)
  await redis.pexpire(b, 1000)
  const again = await appendEachOnce(redis, {
    markerTtlMs: 60_000,
    streamTtlMs: 3_600_000,
    entries: [entry(a, 'e2'), entry(b, 'e1')],
  })
  assert.deepEqual(
    again.map((r) => r.appended),
    [true, false],
  )
  assert.ok((await redis.pttl(a)) > 1000)
  assert.ok((await redis.pttl(b)) <= 1000)
  // Without the option a stream never expires.
  await appendEachOnce(redis, { markerTtlMs: 60_000, entries: [entry(plain, 'e1')] })
  assert.equal(await redis.pttl(plain), -1)
  const bad = `${prefix}ttl:{bad}`
  for (const streamTtlMs of [0, -1, 1.5, Number.NaN, '60s'])
    await assert.rejects(
      appendEachOnce(redis, {
        markerTtlMs: 60_000,
        streamTtlMs: streamTtlMs as number,
        entries: [entry(bad, 'e1')],
      }),
      { code: 'FRG_INVALID_OPTION', message: /streamTtlMs/ },
    )
  assert.equal(await redis.exists(bad), 0)
})

test('appendEachOnce: 250 entries go as three script calls of at most 100, appended in order', async (t) => {
  const { appendEachOnce } = await import('../../src/index.ts')
  const client = new Redis(TEST_REDIS_URL)
  const commands = await commandsSentBy(client)
  t.after(() => client.disconnect())
  const stream = `${prefix}chunked:{c}`
  const entries = Array.from({ length: 250 }, (_, i) => ({
    marker: `${prefix}chunked-seen:{c}:${i}`,
    fields: { n: String(i) },
  }))
  // The last entry repeats the first's marker: a later call sees the first call's marker.
  entries.push({ ...entries[0]!, fields: { n: 'again' } })
  const results = await appendEachOnce(client, { stream, markerTtlMs: 60_000, entries })
  // EVALSHA <sha> <numkeys> ...: two keys per entry.
  const calls = commands.filter((c) => c.name === 'evalsha').map((c) => Number(c.args[1]) / 2)
  assert.deepEqual(calls, [100, 100, 51])
  assert.deepEqual(results.at(-1), { id: results[0]!.id, appended: false })
  const stored = (await redis.xrange(stream, '-', '+')) as Array<[string, string[]]>
  assert.deepEqual(
    stored.map(([id, fields]) => [id, fields[1]]),
    results.slice(0, 250).map((r, i) => [r.id, String(i)]),
  )
})

test('appendEachOnce on a Redis Cluster: entries of streams in different slots, one call per stream; appendJsonEntries too', async (t) => {
  const { appendEachOnce } = await import('../../src/index.ts')
  const { startRedisCluster } = await import('../../scripts/redis-cluster.ts')
  const { createRedisClient } = await import('../../src/plugins/redis/index.ts')
  const cluster = await startRedisCluster()
  const client = createRedisClient({ clusterNodes: cluster.nodes })
  t.after(async () => {
    client.disconnect()
    await cluster.stop()
  })
  await client.connect()
  // Tags chosen to land on different masters of three (slots 15495, 3300, 7365).
  const tags = ['a', 'b', 'c']
  const first = await appendEachOnce(client, { markerTtlMs: 60_000, entries: acrossStreams(tags, 'e1') })
  const again = await appendEachOnce(client, { markerTtlMs: 60_000, entries: acrossStreams(tags, 'e1') })
  assert.deepEqual(
    first.map((r) => r.appended),
    [true, true, true],
  )
  assert.deepEqual(
    again,
    first.map((r) => ({ id: r.id, appended: false })),
  )
  for (const [i, tag] of tags.entries()) {
    const stored = (await client.xrange(`${prefix}across:{${tag}}`, '-', '+')) as Array<[string, string[]]>
    assert.deepEqual(
      stored.map(([id]) => id),
      [first[i]!.id],
    )
  }
  // A JSON batch goes to its stream's node.
  const { appendJsonEntries } = await import('../../src/index.ts')
  const jsonStream = `${prefix}json:{b}`
  const ids = await appendJsonEntries(client, { stream: jsonStream, entries: '[["n","1"],["n","2"]]' })
  const stored = (await client.xrange(jsonStream, '-', '+')) as Array<[string, string[]]>
  assert.deepEqual(stored, [
    [ids[0], ['n', '1']],
    [ids[1], ['n', '2']],
  ])
})

test('appendJsonEntries: a JSON batch goes on the stream in order, byte for byte, capped, in one script call', async () => {
  const { appendJsonEntries } = await import('../../src/index.ts')
  const stream = `${prefix}json`
  const entries = Array.from({ length: 150 }, (_, i) => [
    'n',
    String(i),
    'data',
    JSON.stringify({
      i,
      text: `quote " backslash \\ newline \n ${i % 2 ? 'đồng ₫' : ''}`,
      pad: 'x'.repeat(100),
    }),
  ])
  // The commands this client sends (INFO commandstats would count other suites' scripts too).
  type Send = (command: { name: string }) => unknown
  const send = redis.sendCommand.bind(redis) as unknown as Send
  const sent: string[] = []
  ;(redis as unknown as { sendCommand: Send }).sendCommand = (command) => {
    sent.push(command.name)
    return send(command)
  }
  const ids = await appendJsonEntries(redis, {
    stream,
    maxLen: 100,
    entries: JSON.stringify(entries),
  }).finally(() => {
    ;(redis as unknown as { sendCommand: Send }).sendCommand = send
  })
  assert.ok(
    ['evalsha', 'evalsha,eval'].includes(sent.join()),
    `one script call (EVAL after a NOSCRIPT), sent ${sent.join()}`,
  )
  assert.equal(ids.length, 150)
  const stored = (await redis.xrange(stream, '-', '+')) as Array<[string, string[]]>
  // MAXLEN ~ 100 trims whole nodes (about 20 of these entries each): at least 100 kept, the newest.
  assert.ok(stored.length >= 100 && stored.length < 150, `kept ${stored.length}`)
  const kept = entries.slice(150 - stored.length)
  assert.deepEqual(
    stored.map(([, fields]) => fields),
    kept,
  )
  assert.deepEqual(
    stored.map(([id]) => id),
    ids.slice(150 - stored.length),
  )
  assert.deepEqual(await appendJsonEntries(redis, { stream, entries: '[]' }), [])
  assert.equal(await redis.xlen(stream), stored.length, 'an empty batch appends nothing')
})

test('after a Redis outage longer than a read timeout, new entries are handled at once, not held by reads sent late', async (t) => {
  const server = await startRedisServer()
  let restarted: RedisServerProcess | undefined
  // Lazy, as the redis plugin creates its client: the consumer's own connection must connect by itself.
  const own = new Redis(server.url, { maxRetriesPerRequest: null, lazyConnect: true })
  own.on('error', () => {})
  const stream = 'outage'
  await own.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
  const handled: string[] = []
  // Claims only after a minute: an entry delivered to a read nobody awaits would wait that long.
  const consumer = createStreamConsumer(own, {
    stream,
    group: 'g',
    consumer: 'c',
    blockMs: 100,
    visibilityTimeoutMs: 60_000,
    handler: async (entry: StreamEntry) => void handled.push(entry.id),
    onError: () => {},
  })
  t.after(async () => {
    await consumer.stop()
    own.disconnect()
    await (restarted ?? server).stop()
  })
  await consumer.start()
  await server.stop()
  // Down past the read's timeout (blockMs + 5 s): the read in flight when it went down times out.
  await new Promise((r) => setTimeout(r, 6500))
  restarted = await startRedisServer(server.port)
  // The stream and its group are back with entries before the consumer reconnects.
  const admin = new Redis(restarted.url)
  await admin.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
  const ids: string[] = []
  for (let i = 0; i < 3; i++) ids.push((await admin.xadd(stream, '*', 'n', String(i))) as string)
  await until(() => handled.length === 3, 'the three entries handled', 10_000)
  assert.deepEqual(handled, ids)
  admin.disconnect()
})

test('a stop while starting starts nothing; two starts at once run one loop; a later start runs', async () => {
  const stream = `${prefix}start-stop`
  const handled: string[] = []
  const consumer = start({
    stream,
    group: 'g',
    consumer: 'c',
    handler: async (entry) => void handled.push(entry.id),
  })
  const starting = consumer.start()
  await consumer.stop()
  await starting
  assert.equal(consumer.running, false, 'stopped while its group was being created')

  await Promise.all([consumer.start(), consumer.start()])
  assert.equal(consumer.running, true)
  const ids = await addEntries(stream, 3)
  await until(() => handled.length === 3, 'the entries handled')
  assert.deepEqual(handled, ids)
  // Every entry handled once, one consumer in the group; stopped, it is no longer running.
  await consumer.stop()
  assert.equal(consumer.running, false)
  await addEntries(stream, 1)
  const consumers = (await redis.xinfo('CONSUMERS', stream, 'g')) as unknown[][]
  assert.equal(consumers.length, 1)
  assert.equal(handled.length, 3)
})
