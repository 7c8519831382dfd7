import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import {
  closeWith,
  createDelayedQueue,
  createFeed,
  createStreamConsumer,
  type Lifecycle,
  LifecycleStatus,
} from '../../src/index.ts'
import { scanKeys, TEST_REDIS_URL, uniquePrefix } from '../helpers/index.ts'

// One lifecycle for every long-running part: start(), stop({ deadlineMs }) that says whether the
// part stopped or the deadline passed, health() with the state and the latest error, and closeWith
// tying a part to a Fastify app. The deadlines here pass only while a handler is held on purpose:
// no assertion is about durations.

const redis = new Redis(TEST_REDIS_URL)
const prefix = uniquePrefix('lc')

after(async () => {
  const keys = await scanKeys(redis, prefix)
  if (keys.length) await redis.del(...keys)
  await redis.quit()
})

async function until(check: () => Promise<boolean> | boolean): Promise<void> {
  while (!(await check())) await new Promise((resolve) => setTimeout(resolve, 10))
}

/** A promise and the function that settles it: a handler held until the test lets it go. */
function gate() {
  let open!: () => void
  const opened = new Promise<void>((resolve) => {
    open = resolve
  })
  return { opened, open }
}

test('a stream consumer: stopped, running, its latest error and lag, stopped again', async () => {
  const stream = `${prefix}:errors`
  let calls = 0
  const consumer = createStreamConsumer(redis, {
    stream,
    group: 'g',
    consumer: 'c1',
    blockMs: 50,
    handler: async () => {
      calls++
      throw new Error('handler failed')
    },
  })
  assert.deepEqual(consumer.health(), { state: 'stopped', lastError: null, lagMs: 0 })
  await consumer.start()
  assert.equal(consumer.health().state, 'running')
  await redis.xadd(stream, '*', 'n', '1')
  await until(() => calls > 0)
  const health = consumer.health()
  assert.equal(health.lastError?.message, 'handler failed')
  assert.equal(typeof health.lastError?.at, 'number')
  assert.equal(typeof health.lagMs, 'number')
  assert.deepEqual(await consumer.stop(), { stopped: true })
  assert.equal(consumer.health().state, 'stopped')
})

test('a stream consumer past its deadline: stop says so, stays stopping, and ends once the handler does', async () => {
  const stream = `${prefix}:held`
  const held = gate()
  let started = false
  const consumer = createStreamConsumer(redis, {
    stream,
    group: 'g',
    consumer: 'c1',
    blockMs: 50,
    handler: async () => {
      started = true
      await held.opened
    },
  })
  await consumer.start()
  await redis.xadd(stream, '*', 'n', '1')
  await until(() => started)
  assert.deepEqual(await consumer.stop({ deadlineMs: 20 }), { stopped: false })
  assert.equal(consumer.health().state, 'stopping')
  held.open()
  await until(() => consumer.health().state === 'stopped')
  // The entry finished after the deadline is still acknowledged.
  const [pending] = (await redis.xpending(stream, 'g')) as [number, ...unknown[]]
  assert.equal(pending, 0)
})

test('a delayed queue: stop within the deadline hands back; past it, handedBack is null until a later stop', async () => {
  const queue = createDelayedQueue(redis, { name: 'jobs', keyPrefix: `${prefix}:dq:`, instanceId: 'a' })
  assert.equal(queue.health().state, 'stopped')
  await queue.start()
  assert.equal(queue.health().state, 'running')
  const held = gate()
  let taken = false
  queue.consume(async () => {
    taken = true
    await held.opened
  })
  await queue.schedule('job-1', Date.now() - 1)
  await until(() => taken)
  assert.deepEqual(await queue.stop({ deadlineMs: 20 }), { stopped: false, handedBack: null })
  assert.equal(queue.health().state, 'stopping')
  held.open()
  await until(() => queue.health().state === 'stopped')
  assert.deepEqual(await queue.stop(), { stopped: true, handedBack: 0 })
  assert.equal(queue.health().lastError, null)
})

test('a fan-out worker has the same lifecycle', async () => {
  const feed = createFeed(redis, {
    keyPrefix: `${prefix}:feed:`,
    source: { followingOf: async () => [], followerCountsOf: async () => [], itemsOf: async () => [] },
  })
  const worker = feed.createFanoutWorker({ consumer: 'w1', blockMs: 50 })
  assert.equal(worker.health().state, 'stopped')
  await worker.start()
  assert.equal(worker.health().state, 'running')
  assert.deepEqual(await worker.stop({ deadlineMs: 5000 }), { stopped: true })
  assert.equal(worker.health().state, 'stopped')
})

/** A part that records its calls, and whose stop waits for `stopping` when given. */
function fakePart(stopping?: Promise<void>) {
  const status = new LifecycleStatus()
  const calls: string[] = []
  const part: Lifecycle = {
    async start() {
      calls.push('start')
      status.state = 'running'
    },
    stop(options) {
      calls.push(`stop ${options?.deadlineMs}`)
      return status.stopWithin(stopping ?? Promise.resolve(), options)
    },
    health: () => status.health(),
  }
  return { part, calls }
}

test('closeWith starts a part when the app is ready and stops it with its deadline when it closes', async () => {
  const app = Fastify()
  const { part, calls } = fakePart()
  closeWith(app, part, { name: 'fake', start: true, deadlineMs: 1000 })
  await app.ready()
  assert.deepEqual(calls, ['start'])
  await app.close()
  assert.deepEqual(calls, ['start', 'stop 1000'])
  assert.equal(part.health().state, 'stopped')
})

test('closeWith: a part past its deadline is logged and the close goes on', async () => {
  const logged: unknown[] = []
  const app = Fastify({
    logger: { level: 'warn', stream: { write: (line: string) => void logged.push(JSON.parse(line)) } },
  })
  const held = gate()
  const { part } = fakePart(held.opened)
  closeWith(app, part, { name: 'stuck', deadlineMs: 20 })
  await app.ready()
  await app.close()
  assert.equal(part.health().state, 'stopping')
  assert.ok(
    logged.some((entry) => (entry as { part?: string }).part === 'stuck'),
    'the warning names the part',
  )
  held.open()
  await until(() => part.health().state === 'stopped')
})

test('a stop that fails counts as stopped and its error is the latest', async () => {
  const { part } = fakePart(Promise.reject(new Error('hand-back failed')))
  assert.deepEqual(await part.stop(), { stopped: true })
  assert.equal(part.health().lastError?.message, 'hand-back failed')
})
