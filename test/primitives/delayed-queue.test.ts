import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { createDelayedQueue, type DelayedQueueOptions } from '../../src/primitives/delayed-queue.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

// The races of a naive delayed queue, replayed on a real Redis with real concurrency: a producer
// postponing an item, a mover swallowing what was added while it ran, competing workers, a worker
// that never acknowledges, an instance SIGKILLed with its sets. No assertion is about durations.

const clients: Redis[] = []
const prefixes: string[] = []
const connect = () => {
  const client = new Redis(TEST_REDIS_URL)
  clients.push(client)
  return client
}
const redis = connect()

/** A queue on its own connection, under a key prefix the suite deletes at the end. */
function queue(options: Partial<DelayedQueueOptions> & { keyPrefix: string }, client = connect()) {
  return createDelayedQueue(client, { name: 'jobs', ...options })
}
function prefix() {
  const p = uniquePrefix('dq')
  prefixes.push(p)
  return p
}

after(async () => {
  for (const p of prefixes) {
    const keys = await scanKeys(redis, p)
    if (keys.length > 0) await redis.del(...keys)
  }
  await Promise.all(clients.map((client) => client.quit().catch(() => client.disconnect())))
})

/** Polls until `check` holds (the test's own timeout bounds it). */
async function until(check: () => Promise<boolean> | boolean, pollMs = 10) {
  while (!(await check())) await sleep(pollMs)
}

const ids = (n: number, label = 'job') => Array.from({ length: n }, (_, i) => `${label}-${i}`)

function countEach(list: string[]) {
  const counts = new Map<string, number>()
  for (const id of list) counts.set(id, (counts.get(id) ?? 0) + 1)
  return counts
}

test('anti-postpone: scheduling the same id again keeps its first due time', async () => {
  const q = queue({ keyPrefix: prefix() })
  const first = Date.now() + 60_000
  assert.equal(await q.schedule('invoice-7', first), true)
  assert.equal(await q.schedule('invoice-7', first + 3_600_000), false)
  assert.equal(await q.schedule('invoice-7', new Date(first + 86_400_000)), false)
  assert.equal(Number(await redis.zscore(q.keys.delayed(q.instanceId), 'invoice-7')), first)
  assert.equal(await redis.zcard(q.keys.delayed(q.instanceId)), 1)
  // Not due yet: the mover leaves it.
  assert.equal(await q.move(), 0)
})

test('the mover never loses an id scheduled while it runs: every id ends in ready exactly once', async () => {
  const keyPrefix = prefix()
  // One instance, two connections: the producer's commands interleave with the mover's on the server.
  const producer = queue({ keyPrefix, instanceId: 'node-1' })
  const mover = queue({ keyPrefix, instanceId: 'node-1', batch: 7 })
  const all = ids(1500)
  let producing = true
  let moves = 0
  const produce = (async () => {
    for (let i = 0; i < all.length; i += 10) {
      await Promise.all(all.slice(i, i + 10).map((id) => producer.schedule(id, Date.now() - 1)))
    }
    producing = false
  })()
  const move = (async () => {
    while (producing) {
      await mover.move()
      moves++
    }
    while ((await mover.move()) > 0) moves++
  })()
  await Promise.all([produce, move])
  assert.ok(moves > 1)
  const ready = await redis.lrange(mover.keys.ready, 0, -1)
  assert.equal(ready.length, all.length)
  const counts = countEach(ready)
  for (const id of all) assert.equal(counts.get(id), 1, id)
  assert.equal(await redis.zcard(mover.keys.delayed('node-1')), 0)
})

test('competing workers: 3 instances, 300 due ids, each processed exactly once', async () => {
  const keyPrefix = prefix()
  const instances = [1, 2, 3].map((n) =>
    queue({ keyPrefix, instanceId: `node-${n}`, moveIntervalMs: 10, batch: 25 }),
  )
  const all = ids(300)
  await Promise.all(all.map((id, i) => instances[i % 3]!.schedule(id, Date.now() - 1)))
  const processed: string[] = []
  const byInstance = new Map<string, number>()
  for (const q of instances) q.start()
  const consumers = instances.map((q) =>
    q.consume(
      async (id) => {
        processed.push(id)
        byInstance.set(q.instanceId, (byInstance.get(q.instanceId) ?? 0) + 1)
        await sleep(1)
      },
      { concurrency: 4, pollMs: 5 },
    ),
  )
  await until(() => processed.length >= all.length)
  await Promise.all(consumers.map((c) => c.stop()))
  const stops = await Promise.all(instances.map((q) => q.stop()))
  assert.deepEqual(stops, Array(3).fill({ stopped: true, handedBack: 0 }))
  assert.equal(processed.length, all.length)
  const counts = countEach(processed)
  for (const id of all) assert.equal(counts.get(id), 1, id)
  assert.equal(await redis.llen(instances[0]!.keys.ready), 0)
  for (const q of instances) {
    assert.equal(await redis.llen(q.keys.processing(q.instanceId)), 0)
    assert.equal(await redis.exists(q.keys.taken(q.instanceId)), 0)
  }
})

test('competing take/ack loops on 3 instances: every id taken and acknowledged exactly once', async () => {
  const keyPrefix = prefix()
  const instances = [1, 2, 3].map((n) => queue({ keyPrefix, instanceId: `w-${n}` }))
  const all = ids(300)
  await Promise.all(all.map((id, i) => instances[i % 3]!.schedule(id, Date.now() - 1)))
  const taken: string[] = []
  await Promise.all(
    instances.flatMap((q) =>
      [0, 1, 2].map(async () => {
        for (;;) {
          await q.move()
          const id = await q.take()
          if (id === null) {
            if (taken.length >= all.length) return
            continue
          }
          taken.push(id)
          assert.equal(await q.ack(id), true)
        }
      }),
    ),
  )
  const counts = countEach(taken)
  assert.equal(taken.length, all.length)
  for (const id of all) assert.equal(counts.get(id), 1, id)
})

test('a throwing handler’s id is nacked with a backoff and processed again; successes once each', async () => {
  const keyPrefix = prefix()
  const q = queue({ keyPrefix, moveIntervalMs: 10 })
  const all = ids(40)
  await Promise.all(all.map((id) => q.schedule(id, Date.now() - 1)))
  const failures = new Map<string, number>()
  const done: string[] = []
  const attempts: number[] = []
  q.start()
  q.consume(
    async (id) => {
      const failed = failures.get(id) ?? 0
      if (failed < 2) {
        failures.set(id, failed + 1)
        throw new Error(`transient failure of ${id}`)
      }
      done.push(id)
    },
    {
      concurrency: 3,
      pollMs: 5,
      retryDelayMs: (attempt) => {
        attempts.push(attempt)
        return 0
      },
    },
  )
  await until(() => done.length >= all.length)
  // stop() stops the consumer first (its items in hand finish), then hands back.
  assert.deepEqual(await q.stop(), { stopped: true, handedBack: 0 })
  const counts = countEach(done)
  for (const id of all) assert.equal(counts.get(id), 1, id)
  assert.deepEqual(
    [...new Set(attempts)].sort(),
    [1, 2],
    'the second failure of an id is its attempt 2 (a longer backoff by default)',
  )
  assert.equal(await redis.zcard(q.keys.delayed(q.instanceId)), 0)
})

test('the watchdog returns an item taken but never acknowledged after the visibility timeout', async () => {
  const keyPrefix = prefix()
  const worker = queue({ keyPrefix, instanceId: 'slow', visibilityTimeoutMs: 60_000 })
  await worker.schedule('email-1', Date.now() - 1)
  assert.equal(await worker.move(), 1)
  assert.equal(await worker.take(), 'email-1')
  // Within a 60 s visibility timeout the item stays taken.
  assert.equal(await worker.returnStuck(), 0)
  assert.deepEqual(await redis.lrange(worker.keys.processing('slow'), 0, -1), ['email-1'])

  // Another instance, whose watchdog uses a 50 ms timeout, once that has passed.
  const watchdog = queue({ keyPrefix, instanceId: 'watchdog', visibilityTimeoutMs: 50 })
  await sleep(100)
  assert.equal(await watchdog.returnStuck(), 1)
  assert.deepEqual(await redis.lrange(worker.keys.ready, 0, -1), ['email-1'])
  assert.equal(await redis.llen(worker.keys.processing('slow')), 0)
  assert.equal(await redis.exists(worker.keys.taken('slow')), 0)
  // The slow worker's late ack is refused: the item is delivered again instead.
  assert.equal(await worker.ack('email-1'), false)
  assert.equal(await watchdog.take(), 'email-1')
  assert.equal(await watchdog.ack('email-1'), true)
})

test('adoption: a SIGKILLed instance’s delayed ids keep their due times and are processed once', async () => {
  const keyPrefix = prefix()
  const a = queue({ keyPrefix, instanceId: 'a', heartbeatTtlMs: 60_000 })
  // Small batches, so the two adopters' script calls interleave.
  const b = queue({ keyPrefix, instanceId: 'b', heartbeatTtlMs: 60_000, batch: 10 })
  const c = queue({ keyPrefix, instanceId: 'c', heartbeatTtlMs: 60_000, batch: 10 })
  await Promise.all([a.heartbeat(), b.heartbeat(), c.heartbeat()])
  const later = ids(100, 'later')
  const dueAt = new Map(later.map((id, i) => [id, Date.now() + 300 + i]))
  for (const id of later) assert.equal(await a.schedule(id, dueAt.get(id)!), true)
  // Three ids due now, taken by A and never acknowledged.
  const inFlight = ids(3, 'now')
  for (const id of inFlight) await a.schedule(id, Date.now() - 1)
  assert.equal(await a.move(), 3)
  for (let i = 0; i < 3; i++) assert.ok(await a.take())

  // A lives: nothing is adopted.
  assert.equal(await b.adoptOrphans(), 0)
  assert.equal(await redis.zcard(a.keys.delayed('a')), 100)

  // A is SIGKILLed: its heartbeat runs out (deleted here rather than waited for).
  await redis.del(a.keys.heartbeat('a'))
  // B and C adopt at the same time: each id lands once.
  const [byB, byC] = await Promise.all([b.adoptOrphans(), c.adoptOrphans()])
  assert.equal(byB + byC, 103)
  assert.equal(await redis.exists(a.keys.delayed('a')), 0)
  assert.equal(await redis.exists(a.keys.processing('a')), 0)
  assert.equal(await redis.exists(a.keys.taken('a')), 0)
  assert.equal(await redis.sismember(a.keys.instances, 'a'), 0)
  const adopted = new Map<string, number>()
  for (const q of [b, c]) {
    const entries = await redis.zrange(q.keys.delayed(q.instanceId), '0', '-1', 'WITHSCORES')
    for (let i = 0; i < entries.length; i += 2) {
      assert.equal(adopted.has(entries[i]!), false, `${entries[i]} adopted twice`)
      adopted.set(entries[i]!, Number(entries[i + 1]))
    }
  }
  assert.deepEqual(adopted, dueAt)
  assert.deepEqual((await redis.lrange(b.keys.ready, 0, -1)).sort(), inFlight.sort())

  // Processed once each when due.
  const lastDue = Math.max(...dueAt.values())
  await until(() => Date.now() > lastDue + 5)
  const processed: string[] = []
  for (const q of [b, c]) while ((await q.move()) > 0);
  for (let turn = 0; ; turn++) {
    const q = turn % 2 === 0 ? b : c
    const id = (await q.take()) ?? (await (q === b ? c : b).take())
    if (id === null) break
    processed.push(id)
    assert.ok((await b.ack(id)) || (await c.ack(id)))
  }
  assert.equal(processed.length, 103)
  assert.equal(new Set(processed).size, 103)
})

test('stop() hands back: processing ids return to ready, the heartbeat goes, the delayed set is adopted', async () => {
  const keyPrefix = prefix()
  const a = queue({ keyPrefix, instanceId: 'a', heartbeatTtlMs: 60_000, moveIntervalMs: 10 })
  const b = queue({ keyPrefix, instanceId: 'b', heartbeatTtlMs: 60_000 })
  await b.heartbeat()
  for (const id of ids(5, 'now')) await a.schedule(id, Date.now() - 1)
  for (const id of ids(10, 'later')) await a.schedule(id, Date.now() + 3_600_000)
  a.start()
  await until(async () => (await redis.exists(a.keys.heartbeat('a'))) === 1)
  await until(async () => (await redis.llen(a.keys.ready)) === 5)
  const taken = [await a.take(), await a.take(), await a.take()]
  assert.ok(taken.every((id) => id !== null))

  assert.deepEqual(await a.stop(), { stopped: true, handedBack: 3 })
  assert.equal(await redis.llen(a.keys.ready), 5)
  assert.equal(await redis.llen(a.keys.processing('a')), 0)
  assert.equal(await redis.exists(a.keys.heartbeat('a')), 0)
  assert.equal(await b.adoptOrphans(), 10)
  assert.equal(await redis.zcard(b.keys.delayed('b')), 10)
})

test('a second stop() hands back what was taken since the first', async () => {
  const keyPrefix = prefix()
  const a = queue({ keyPrefix, instanceId: 'a' })
  for (const id of ids(2, 'now')) await a.schedule(id, Date.now() - 1)
  assert.equal(await a.move(), 2)
  assert.ok(await a.take())
  assert.equal((await a.stop()).handedBack, 1)
  // Taken after the first stop (take needs no start()): the next stop() hands it back too.
  assert.ok(await a.take())
  assert.equal((await a.stop()).handedBack, 1)
  assert.equal(await redis.llen(a.keys.processing('a')), 0)
  assert.equal(await redis.llen(a.keys.ready), 2)
})

test('remove(): a waiting id leaves every delayed set and the ready list; a taken one stays', async () => {
  const keyPrefix = prefix()
  const a = queue({ keyPrefix, instanceId: 'a' })
  const b = queue({ keyPrefix, instanceId: 'b' })
  // Both instances scheduled `twice` (two sets), `ready` is due and moved, `taken` is in hand.
  await a.schedule('twice', Date.now() + 3_600_000)
  await b.schedule('twice', Date.now() + 60_000)
  // Due times far apart, so `taken` is first in the ready list however long the calls take.
  await a.schedule('ready', Date.now() - 1_000)
  await a.schedule('taken', Date.now() - 60_000)
  assert.equal(await a.move(), 2)
  assert.equal(await a.take(), 'taken')

  assert.equal(await b.remove('twice'), true)
  assert.equal(await redis.zscore(a.keys.delayed('a'), 'twice'), null)
  assert.equal(await redis.zscore(b.keys.delayed('b'), 'twice'), null)
  assert.equal(await a.remove('ready'), true)
  assert.deepEqual(await redis.lrange(a.keys.ready, 0, -1), [])
  assert.equal(await a.remove('taken'), false)
  assert.deepEqual(await redis.lrange(a.keys.processing('a'), 0, -1), ['taken'])
  assert.equal(await a.remove('never-scheduled'), false)
  await assert.rejects(() => a.remove(''), /id/)
})

test('options are checked', () => {
  assert.throws(() => createDelayedQueue(redis, { name: '' }), /name/)
  assert.throws(() => createDelayedQueue(redis, { name: 'q', batch: 5000 }), /batch/)
  assert.throws(() => createDelayedQueue(redis, { name: 'q', visibilityTimeoutMs: 0 }), /visibilityTimeoutMs/)
  const q = createDelayedQueue(redis, { name: 'q' })
  assert.match(q.keys.ready, /^dq:\{q\}:ready$/)
  assert.match(q.keys.delayed(q.instanceId), /^dq:\{q\}:delayed:[0-9a-f]{16}$/)
})
