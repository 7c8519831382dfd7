import assert from 'node:assert/strict'
import { test } from 'node:test'
import Fastify from 'fastify'
import { freePort, startRedisServer } from '../src/embedded/redis-server.ts'
import { scriptSources } from '../src/lua/index.ts'
import redisPlugin, { createRedisClient } from '../src/plugins/redis/index.ts'
import { TEST_REDIS_URL } from './helpers.ts'

test('every src/lua script loads under the SHA runScript sends, and each opens with a header naming KEYS, ARGV and the reply', async () => {
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
    { message: new RegExp(`^Redis is unreachable at redis://127\\.0\\.0\\.1:${port}: `) },
  )
})

test('while Redis is down commands fail at once instead of queueing, and work again when it returns', async () => {
  const server = await startRedisServer()
  const client = createRedisClient({ url: server.url })
  await client.connect()
  try {
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
  } finally {
    await server.stop()
  }
})
