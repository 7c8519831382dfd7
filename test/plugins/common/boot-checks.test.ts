import assert from 'node:assert/strict'
import { createConnection, createServer, type Server, type Socket } from 'node:net'
import { test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { freePort, startRedisServer } from '../../../src/embedded/redis-server.ts'
import { cache, idempotency, metrics, rateLimit, redis as redisPlugin, session } from '../../../src/index.ts'
import { InvalidOptionError, UnknownOptionError } from '../../../src/plugins/common/errors.ts'
import { optionChecker } from '../../../src/plugins/common/options.ts'
import { closest } from '../../../src/plugins/common/spelling.ts'
import { TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from '../../helpers/index.ts'

// The library's boot-time checks that no single plugin owns: the option checker, the Redis client
// a plugin is handed, the shared boot wait, the server's version, and the metrics route.

/** A Fastify app whose log lines the test reads. */
function loggedApp(): {
  app: FastifyInstance
  lines: Array<{ level: number; msg: string; [k: string]: unknown }>
} {
  const lines: Array<{ level: number; msg: string }> = []
  const stream = { write: (line: string) => void lines.push(JSON.parse(line)) }
  return { app: Fastify({ logger: { level: 'info', stream } }), lines }
}

test('the option checker names the unknown key, the valid ones, and the closest spelling or a hint', () => {
  const check = optionChecker('demo plugin', { max: "@fastify/rate-limit's `max` is a policy's `limit`" })
  assert.throws(
    () => check.known({ algoritm: 'gcra' }, ['algorithm', 'limit'], "policy 'ip'"),
    (err: UnknownOptionError) => {
      assert.ok(err instanceof UnknownOptionError && err instanceof InvalidOptionError)
      assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
      assert.equal(err.option, 'algoritm')
      assert.deepEqual(err.validOptions, ['algorithm', 'limit'])
      assert.equal(
        err.message,
        "demo plugin: policy 'ip': unknown option `algoritm`. Did you mean `algorithm`? Valid options: algorithm, limit.",
      )
      return true
    },
  )
  assert.throws(
    () => check.known({ max: 3 }, ['limit']),
    /`max`\. @fastify\/rate-limit's `max` is a policy's `limit`\./,
  )
  assert.throws(() => check.known({ constructor: 1 }, ['limit']), /unknown option `constructor`\. Valid/)
  assert.doesNotThrow(() => check.known({ limit: 3 }, ['limit']))
  assert.throws(() => check.fail('`limit` must be positive'), { code: 'FRG_INVALID_OPTION' })
  assert.equal(closest('tl', ['ttlMs', 'jitter']), undefined, 'too far to guess')
  assert.equal(closest('ttl', ['ttlMs', 'jitter']), 'ttlMs', 'the name with its unit')
  assert.equal(closest('TTLMS', ['ttlMs', 'jitter']), 'ttlMs')
  assert.equal(closest('keyprefx', ['keyPrefix']), 'keyPrefix')
})

test('a URL string, an options object or nothing as `redis` fails with the type it got', async () => {
  const cases: Array<[unknown, RegExp]> = [
    [
      'redis://127.0.0.1:6379',
      /`redis` must be an ioredis client .*got a string \('redis:\/\/127\.0\.0\.1:6379'\).*new Redis\(url\)/,
    ],
    [{ host: '127.0.0.1' }, /`redis` must be an ioredis client .*got an object \(Object\)/],
    [undefined, /no Redis client: pass `redis` .* or register the redis plugin before this one/],
  ]
  for (const [value, message] of cases) {
    const app = Fastify()
    await assert.rejects(
      async () => {
        await app.register(idempotency, value === undefined ? {} : { redis: value as never })
        await app.ready()
      },
      (err: Error & { code?: string }) => {
        assert.equal(err.code, 'FRG_REDIS_CLIENT_INVALID')
        assert.match(err.message, message)
        return true
      },
    )
    await app.close()
  }
})

test('the redis plugin refuses a URL that is not redis:// and names a cluster that is not one', async () => {
  const app = Fastify()
  await assert.rejects(
    async () => {
      await app.register(redisPlugin, { url: 'localhost:6379' })
      await app.ready()
    },
    {
      code: 'FRG_INVALID_OPTION',
      message: /`url` must be a redis:\/\/ or rediss:\/\/ URL, got a string \('localhost:6379'\)/,
    },
  )
  await app.close()
  const { port } = new URL(TEST_REDIS_URL)
  const clusterApp = Fastify()
  await assert.rejects(
    async () => {
      await clusterApp.register(redisPlugin, { clusterNodes: [{ host: '127.0.0.1', port: Number(port) }] })
      await clusterApp.ready()
    },
    (err: Error & { code?: string; cause?: Error }) => {
      assert.equal(err.code, 'FRG_REDIS_UNREACHABLE')
      assert.match(err.message, new RegExp(`cluster 127\\.0\\.0\\.1:${port} is unreachable`))
      assert.match(String(err.cause?.message), /cluster support disabled/, 'the node says why')
      return true
    },
  )
  await clusterApp.close()
})

test('four plugins on a Redis that is down wait for it once, and the warning names the address and the cause', async () => {
  const port = await freePort()
  const client = new Redis({ port, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => 200 })
  client.on('error', () => {})
  const { app, lines } = loggedApp()
  await app.register(rateLimit, {
    redis: client,
    connectTimeoutMs: 300,
    policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 10, windowMs: 1000 }],
  })
  await app.register(idempotency, { redis: client, connectTimeoutMs: 300 })
  await app.register(session, { redis: client, secrets: [TEST_SECRET], connectTimeoutMs: 300 })
  await app.register(cache, { redis: client, connectTimeoutMs: 300 })
  await app.ready()
  const warnings = lines.filter((line) => /not ready at boot/.test(line.msg))
  assert.equal(warnings.length, 1, 'one wait for the client, not one per plugin')
  assert.match(
    warnings[0]!.msg,
    new RegExp(`Redis at (127\\.0\\.0\\.1|localhost):${port} is not ready at boot`),
  )
  assert.match(warnings[0]!.msg, /ECONNREFUSED/, 'the last error says why')
  await app.close()
  client.disconnect()
})

test('connectTimeoutMs 0 does not wait: the boot goes on while a lazy client connects', async () => {
  const client = new Redis(TEST_REDIS_URL, { lazyConnect: true })
  const { app, lines } = loggedApp()
  await app.register(idempotency, { redis: client, connectTimeoutMs: 0 })
  assert.notEqual(client.status, 'ready', 'registration did not wait for the connection')
  await app.ready()
  assert.equal(lines.filter((line) => /not ready at boot/.test(line.msg)).length, 0)
  // It may have connected while the app got ready: wait for 'ready' only if it has not.
  if (client.status !== 'ready') await new Promise((resolve) => client.once('ready', resolve))
  assert.equal(client.status, 'ready')
  await app.close()
  client.disconnect()
})

/**
 * A real Redis behind a proxy that reports an older version in INFO: the same number of bytes, so
 * the reply's framing is unchanged.
 */
async function redisReportingVersion(version: string): Promise<{ port: number; close(): Promise<void> }> {
  const { port: target } = new URL(TEST_REDIS_URL)
  const sockets = new Set<Socket>()
  const server: Server = createServer((downstream) => {
    const upstream = createConnection({ host: '127.0.0.1', port: Number(target) })
    downstream.on('data', (chunk) => upstream.write(chunk))
    upstream.on('data', (chunk) => {
      const text = chunk
        .toString('latin1')
        .replace(/redis_version:\d+\.\d+\.\d+/, (found) =>
          `redis_version:${version}`.padEnd(found.length, '0'),
        )
      downstream.write(Buffer.from(text, 'latin1'))
    })
    for (const socket of [downstream, upstream]) {
      sockets.add(socket)
      socket.on('error', () => {})
    }
    downstream.on('close', () => upstream.destroy())
    upstream.on('close', () => downstream.destroy())
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  return {
    port,
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve())
        for (const socket of sockets) socket.destroy()
      }),
  }
}

test('a Redis older than 7.0 is a boot error naming the version found and the one needed', async (t) => {
  const old = await redisReportingVersion('6.2.14')
  t.after(() => old.close())
  const client = new Redis({ port: old.port })
  t.after(() => client.disconnect())
  const app = Fastify()
  await assert.rejects(
    async () => {
      await app.register(idempotency, { redis: client })
      await app.ready()
    },
    (err: Error & { code?: string }) => {
      assert.equal(err.code, 'FRG_REDIS_VERSION')
      assert.match(err.message, /version 6\.2\.14\d*; this library needs 7\.0\.0 or later/)
      return true
    },
  )
  await app.close()
})

test('the metrics route is not limited by a global policy registered before it', async (t) => {
  const client = new Redis(TEST_REDIS_URL)
  t.after(() => client.disconnect())
  const app = Fastify()
  t.after(() => app.close())
  await app.register(rateLimit, {
    redis: client,
    keyPrefix: uniquePrefix('rl'),
    policies: [{ name: 'ip', algorithm: 'fixed-window', limit: 1, windowMs: 60_000 }],
  })
  await app.register(metrics, { processMetrics: false })
  app.get('/', async () => ({ ok: true }))
  await app.ready()
  assert.equal((await app.inject('/')).statusCode, 200)
  assert.equal((await app.inject('/')).statusCode, 429, 'the global policy holds on the app route')
  for (let i = 0; i < 3; i++) {
    const scrape = await app.inject('/metrics')
    assert.equal(scrape.statusCode, 200)
    assert.equal(scrape.headers.ratelimit, undefined)
  }
})

test('a route asking for protection in a prefixed child context, with no plugin anywhere, refuses to be ready', async () => {
  const app = Fastify()
  await app.register(
    async (child) => {
      child.post('/orders', { config: { rateLimits: 'orders' } }, async () => ({ ok: true }))
    },
    { prefix: '/v1' },
  )
  await assert.rejects(async () => app.ready(), {
    code: 'FRG_ROUTE_NOT_PROTECTED',
    message: /route POST \/v1\/orders has `config\.rateLimits` but no rate-limit plugin covers it/,
  })
  await app.close()
})

test('a volatile-* policy is refused like allkeys-*: every record the idempotency plugin writes has a TTL', async (t) => {
  const server = await startRedisServer(undefined, 'redis-server', ['--maxmemory-policy', 'volatile-lru'])
  t.after(() => server.stop())
  const client = new Redis(server.url)
  t.after(() => client.disconnect())
  const app = Fastify()
  await assert.rejects(
    async () => {
      await app.register(idempotency, { redis: client })
      await app.ready()
    },
    { code: 'FRG_REDIS_EVICTION_POLICY', message: /maxmemory-policy volatile-lru/ },
  )
  await app.close()
})
