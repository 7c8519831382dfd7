import assert from 'node:assert/strict'
import { createHook } from 'node:async_hooks'
import { test } from 'node:test'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { freePort, startRedisServer } from '../../../src/embedded/redis-server.ts'
import redisPlugin, { createRedisClient } from '../../../src/plugins/redis/index.ts'
import { scriptSources } from '../../../src/redis/scripts.ts'
import { TEST_REDIS_URL } from '../../helpers/index.ts'

test('every src/lua script loads under the SHA callScript sends, and each opens with a header naming KEYS, ARGV and the reply', async () => {
  const app = Fastify()
  await app.register(redisPlugin, { url: TEST_REDIS_URL })
  try {
    assert.ok(scriptSources.size > 0)
    for (const [name, { lua, sha }] of scriptSources) {
      // SCRIPT LOAD compiles it on Redis and answers its SHA1: the digest EVALSHA is sent with.
      assert.equal(await app.redis.script('LOAD', lua), sha, name)
      const header = lua
        .split('\n')
        .filter((line) => line.startsWith('--'))
        .join('\n')
      assert.match(header, /KEYS/, `${name}: header names KEYS`)
      assert.match(header, /ARGV/, `${name}: header names ARGV`)
      assert.match(header, /reply/i, `${name}: header names the reply`)
      const code = lua
        .split('\n')
        .filter((line) => !line.trimStart().startsWith('--'))
        .join('\n')
      assert.doesNotMatch(code, /math\.random|os\.time/, `${name}: no Lua randomness or app clock`)
    }
  } finally {
    await app.close()
  }
  await assert.rejects(app.redis.ping(), 'the client is closed on shutdown')
})

test('an unreachable Redis fails the boot with a message naming it', async () => {
  const port = await freePort()
  const app = Fastify()
  await assert.rejects(
    async () => {
      await app.register(redisPlugin, { url: `redis://127.0.0.1:${port}`, connectTimeoutMs: 300 })
      await app.ready()
    },
    (err: Error & { code?: string; address?: string; cause?: Error }) => {
      assert.equal(err.code, 'FRG_REDIS_UNREACHABLE')
      assert.equal(err.address, `127.0.0.1:${port}`)
      assert.match(err.message, new RegExp(`Redis at 127\\.0\\.0\\.1:${port} is unreachable: .*ECONNREFUSED`))
      assert.match(String(err.cause?.message), /ECONNREFUSED/, 'the underlying cause is kept')
      return true
    },
  )
})

test('while Redis is down commands fail at once instead of queueing, and work again when it returns', async (t) => {
  const server = await startRedisServer()
  const client = createRedisClient({ url: server.url })
  await client.connect()
  t.after(() => server.stop())
  assert.equal(await client.set('k', '1'), 'OK')
  await server.stop()
  await assert.rejects(client.incr('k'))
  const restarted = await startRedisServer(server.port)
  try {
    let value: string | null = null
    for (let i = 0; i < 50 && value === null; i++) {
      value = await client.set('k', '2').catch(() => null)
      if (value === null) await new Promise((r) => setTimeout(r, 100))
    }
    assert.equal(value, 'OK', 'reconnected')
    assert.equal(await client.get('k'), '2', 'the failed INCR was not replayed after the reconnect')
  } finally {
    client.disconnect()
    await restarted.stop()
  }
})

/** How many timers (setTimeout) `work` creates. */
async function timersCreatedBy(work: () => Promise<unknown>): Promise<number> {
  let timers = 0
  const hook = createHook({
    init(_id, type) {
      if (type === 'Timeout') timers++
    },
  })
  hook.enable()
  try {
    await work()
  } finally {
    hook.disable()
  }
  return timers
}

const thousandGets = (client: Redis) => () =>
  Promise.all(Array.from({ length: 1000 }, (_, i) => client.get(`bound:${i % 10}`)))

test("createRedisClient's command timeout costs one timer per client, not one per command", async (t) => {
  const bounded = createRedisClient({ url: TEST_REDIS_URL, commandTimeoutMs: 500 }) as Redis
  const perCommand = new Redis(TEST_REDIS_URL, { commandTimeout: 500, lazyConnect: true })
  await Promise.all([bounded.connect(), perCommand.connect()])
  t.after(() => {
    bounded.disconnect()
    perCommand.disconnect()
  })
  await bounded.get('bound:warm')
  assert.ok(
    (await timersCreatedBy(thousandGets(bounded))) <= 2,
    'at most the one timer of the oldest command',
  )
  // The control: ioredis's own commandTimeout sets a timer for each command.
  assert.ok((await timersCreatedBy(thousandGets(perCommand))) >= 1000)
})

test('a reply that came in time is not failed by a timeout that fired while the process was blocked', async (t) => {
  const client = createRedisClient({ url: TEST_REDIS_URL, commandTimeoutMs: 50 }) as Redis
  t.after(() => client.disconnect())
  await client.connect()
  await client.set('bound:blocked', 'a')
  for (let round = 0; round < 5; round++) {
    const reply = client.get('bound:blocked')
    // A starved or busy process: the command leaves (the client sends a turn's commands from a
    // setImmediate queued before this one) and its reply reaches the socket within the bound, but
    // the event loop gets back to the socket only after the command's deadline has passed.
    await new Promise<void>((resolve) =>
      setImmediate(() => {
        const until = performance.now() + 200
        while (performance.now() < until);
        resolve()
      }),
    )
    assert.equal(await reply, 'a')
  }
})

test('a command unanswered for commandTimeoutMs fails; answered ones do not, and its late reply goes to nobody else', async (t) => {
  const server = await startRedisServer()
  const client = createRedisClient({ url: server.url, commandTimeoutMs: 200 }) as Redis
  const admin = new Redis(server.url)
  t.after(async () => {
    client.disconnect()
    admin.disconnect()
    await server.stop()
  })
  await client.connect()
  await client.mset('first', 'a', 'second', 'b')
  // Answered before the pause, and while the timer runs for later commands: none of them fails.
  assert.deepEqual(await Promise.all([client.get('first'), client.get('second')]), ['a', 'b'])
  await admin.client('PAUSE', 1000, 'ALL')
  await assert.rejects(client.get('first'), { message: 'Command timed out' })
  await assert.rejects(client.get('second'), { message: 'Command timed out' })
  // Once Redis answers again, each command gets its own reply: the timed-out ones' replies are
  // matched to them (and dropped), not to the commands sent after.
  let value: string | null = null
  for (let i = 0; i < 30 && value === null; i++) {
    value = await client.get('second').catch(() => null)
    if (value === null) await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(value, 'b')
  assert.equal(await client.get('first'), 'a')
})
