import assert from 'node:assert/strict'
import { createServer, type Server, type Socket } from 'node:net'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import {
  InvalidOptionError,
  idempotency,
  type MakeIdempotentOptions,
  makeIdempotent,
  RedisClientError,
  RedisServerError,
  RouteNotProtectedError,
  UnknownOptionError,
} from '../../../src/index.ts'
import { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

// What the idempotency plugin and makeIdempotent refuse at boot (or at the first call) rather than
// run without their guarantee: unknown options, wrong values, routes the plugin never sees, a
// Redis that may evict their records.

let shared: RedisClient
before(() => {
  shared = createRedisClient(testRedisConnection())
})
after(() => shared.quit())

/** Registers the plugin (and whatever `declare` adds) and waits for ready, for a test expecting it to fail. */
async function boot(app: FastifyInstance, declare: () => PromiseLike<unknown>): Promise<void> {
  await declare()
  await app.ready()
}

const unknownOption = (option: string, message: RegExp) => (err: UnknownOptionError) => {
  assert.ok(err instanceof UnknownOptionError && err instanceof InvalidOptionError)
  assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
  assert.equal(err.option, option)
  assert.match(err.message, message)
  return true
}

const invalidOption = (message: RegExp) => (err: InvalidOptionError) => {
  assert.ok(err instanceof InvalidOptionError)
  assert.equal(err.code, 'FRG_INVALID_OPTION')
  assert.match(err.message, message)
  return true
}

describe('strict options', () => {
  test('an unknown plugin option is refused, with the valid ones and a did-you-mean or a hint', async (t) => {
    const cases: Array<[Record<string, unknown>, string, RegExp]> = [
      [{ leasMs: 1000 }, 'leasMs', /unknown option `leasMs`\. Did you mean `leaseMs`\?/],
      [
        { ttl: 60_000 },
        'ttl',
        /unknown option `ttl`\. `retentionMs` is how long a result is kept \(milliseconds\)\./,
      ],
      [{ allowEvictions: true }, 'allowEvictions', /Did you mean `allowEviction`\?/],
    ]
    for (const [options, option, message] of cases) {
      const app = Fastify()
      t.after(() => app.close())
      await assert.rejects(
        boot(app, () => app.register(idempotency, { redis: shared, ...options })),
        (err: UnknownOptionError) => {
          unknownOption(option, message)(err)
          assert.match(err.message, /^idempotency plugin: /)
          for (const valid of ['redis', 'allowEviction', 'connectTimeoutMs', 'keyPrefix', 'onReplay'])
            assert.ok(err.validOptions.includes(valid), valid)
          return true
        },
      )
    }
  })

  test('an unknown key in a route config.idempotency is refused, naming the route', async (t) => {
    const app = Fastify()
    t.after(() => app.close())
    await app.register(idempotency, { redis: shared })
    assert.throws(
      () => app.post('/orders', { config: { idempotency: { requried: false } as never } }, async () => 'ran'),
      (err: UnknownOptionError) => {
        unknownOption(
          'requried',
          /^idempotency plugin: route POST \/orders: config\.idempotency: unknown option `requried`\. Did you mean `required`\?/,
        )(err)
        assert.deepEqual(err.validOptions, ['required', 'onRedisError', 'anonymous', 'keyFrom', 'onReplay'])
        return true
      },
    )
  })

  test('wrong plugin and route values are InvalidOptionError naming what was passed', async (t) => {
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ allowEviction: 'yes' }, /`allowEviction` must be true or false, got a string \('yes'\)/],
      [{ connectTimeoutMs: -1 }, /`connectTimeoutMs` must be an integer of at least 0, got -1/],
      [{ leaseMs: 50 }, /`leaseMs` must be an integer from 100 to 60000, got 50/],
    ]
    for (const [options, message] of cases) {
      const app = Fastify()
      t.after(() => app.close())
      await assert.rejects(
        boot(app, () => app.register(idempotency, { redis: shared, ...options })),
        invalidOption(message),
      )
    }
    const app = Fastify()
    t.after(() => app.close())
    await app.register(idempotency, { redis: shared })
    assert.throws(
      () => app.post('/x', { config: { idempotency: { onRedisError: 'opne' as 'open' } } }, async () => 1),
      invalidOption(
        /route POST \/x: config\.idempotency: `onRedisError` must be 'closed' or 'open', got a string/,
      ),
    )
  })

  test('makeIdempotent refuses unknown options, wrong values and a redis that is not a client', () => {
    const fn = async () => 1
    const base = { redis: shared, keyOf: () => 'k' }
    const make = (extra: object) => makeIdempotent(fn, { ...base, ...extra } as MakeIdempotentOptions<[]>)
    assert.throws(
      () => make({ keyof: () => 'k' }),
      unknownOption('keyof', /^makeIdempotent: unknown option `keyof`\. Did you mean `keyOf`\?/),
    )
    assert.throws(
      () => make({ expiresAfterSeconds: 60 }),
      unknownOption(
        'expiresAfterSeconds',
        /unknown option `expiresAfterSeconds`\. `retentionMs` is how long a result is kept/,
      ),
    )
    assert.throws(
      () => make({ allowEviction: 1 }),
      invalidOption(/^makeIdempotent: `allowEviction` must be true or false, got 1$/),
    )
    assert.throws(
      () => make({ waitMs: 1.5 }),
      invalidOption(/^makeIdempotent: `waitMs` must be an integer from 0 to 3600000, got 1\.5$/),
    )
    assert.throws(
      () => make({ redis: 'redis://127.0.0.1:6379' }),
      (err: RedisClientError) => {
        assert.ok(err instanceof RedisClientError)
        assert.equal(err.code, 'FRG_REDIS_CLIENT_INVALID')
        assert.match(err.message, /`redis` must be an ioredis client .*got a string \('redis:\/\/127/)
        return true
      },
    )
  })
})

describe('route coverage', () => {
  const notProtected = (url: string) => (err: RouteNotProtectedError) => {
    assert.ok(err instanceof RouteNotProtectedError)
    assert.equal(err.code, 'FRG_ROUTE_NOT_PROTECTED')
    assert.equal(err.method, 'POST')
    assert.equal(err.url, url)
    assert.match(err.message, new RegExp(`route POST ${url} has \`config.idempotency\``))
    return true
  }

  test('a route declared before the plugin fails ready()', async (t) => {
    const app = Fastify()
    t.after(() => app.close())
    app.post('/early', { config: { idempotency: true } }, async () => 'unprotected')
    await app.register(idempotency, { redis: shared })
    await assert.rejects(async () => void (await app.ready()), notProtected('/early'))
  })

  test('a route in a sibling context registered before the plugin fails ready()', async (t) => {
    const app = Fastify()
    t.after(() => app.close())
    await app.register(async (sibling) => {
      sibling.post('/sibling', { config: { idempotency: true } }, async () => 'unprotected')
    })
    await app.register(idempotency, { redis: shared })
    await assert.rejects(async () => void (await app.ready()), notProtected('/sibling'))
  })

  test('routes declared after the plugin, in its context or a child, are ready and run once per key', async (t) => {
    const app = Fastify()
    t.after(() => app.close())
    await app.register(idempotency, { redis: shared, keyPrefix: uniquePrefix('idemboot') })
    const runs = { same: 0, child: 0 }
    app.post('/same', { config: { idempotency: true } }, async (_request, reply) =>
      reply.code(201).send({ run: ++runs.same }),
    )
    await app.register(async (child) => {
      child.post('/child', { config: { idempotency: true } }, async (_request, reply) =>
        reply.code(201).send({ run: ++runs.child }),
      )
    })
    await app.ready()
    for (const url of ['/same', '/child']) {
      for (let i = 0; i < 3; i++) {
        const response = await app.inject({
          method: 'POST',
          url,
          headers: { 'idempotency-key': `key-${url}` },
          payload: { a: 1 },
        })
        assert.equal(response.statusCode, 201, url)
        assert.deepEqual(response.json(), { run: 1 }, url)
      }
    }
    assert.deepEqual(runs, { same: 1, child: 1 })
  })
})

describe('a Redis that may evict any key (maxmemory-policy allkeys-lru)', () => {
  let server: Awaited<ReturnType<typeof startRedisServer>>
  let evicting: Redis
  before(async () => {
    server = await startRedisServer(undefined, 'redis-server', ['--maxmemory-policy', 'allkeys-lru'])
    evicting = new Redis(server.url)
  })
  after(async () => {
    evicting.disconnect()
    await server.stop()
  })

  const evictionRefused = (fix: RegExp) => (err: RedisServerError) => {
    assert.ok(err instanceof RedisServerError)
    assert.equal(err.code, 'FRG_REDIS_EVICTION_POLICY')
    assert.match(err.message, /maxmemory-policy allkeys-lru/)
    assert.match(err.message, fix)
    return true
  }

  test('the plugin refuses to register; with allowEviction: true it boots and runs once per key', async (t) => {
    const refused = Fastify()
    t.after(() => refused.close())
    await assert.rejects(
      boot(refused, () => refused.register(idempotency, { redis: evicting })),
      evictionRefused(/pass `allowEviction: true` to the idempotency plugin/),
    )

    const app = Fastify()
    t.after(() => app.close())
    await app.register(idempotency, { redis: evicting, allowEviction: true })
    let runs = 0
    app.post('/orders', { config: { idempotency: true } }, async (_request, reply) =>
      reply.code(201).send({ run: ++runs }),
    )
    await app.ready()
    for (let i = 0; i < 2; i++) {
      const response = await app.inject({
        method: 'POST',
        url: '/orders',
        headers: { 'idempotency-key': 'k' },
      })
      assert.equal(response.statusCode, 201)
    }
    assert.equal(runs, 1)
  })

  test('makeIdempotent refuses every call without running the function, unless allowEviction', async () => {
    let runs = 0
    const prefix = uniquePrefix('idemfn')
    const options = { redis: evicting, keyPrefix: prefix, keyOf: (id: string) => id }
    const refused = makeIdempotent(async (id: string) => `${id}:${++runs}`, options)
    const calls = await Promise.allSettled([refused('a'), refused('a'), refused('b')])
    for (const call of calls) {
      assert.equal(call.status, 'rejected')
      evictionRefused(/pass `allowEviction: true` to makeIdempotent/)((call as PromiseRejectedResult).reason)
    }
    await assert.rejects(refused('c'), evictionRefused(/allowEviction/))
    assert.equal(runs, 0)
    assert.deepEqual(await scanKeys(evicting, prefix), [], 'nothing was claimed')

    const allowed = makeIdempotent(async (id: string) => `${id}:${++runs}`, {
      ...options,
      allowEviction: true,
    })
    assert.equal(await allowed('a'), 'a:1')
    assert.equal(await allowed('a'), 'a:1')
    assert.equal(runs, 1)
  })
})

describe('connectTimeoutMs', () => {
  test('is how long registration waits for a Redis that never answers; 0 does not wait', async (t) => {
    // Accepts connections and never answers: the client connects but is never ready.
    const sockets = new Set<Socket>()
    const silent: Server = createServer((socket) => void sockets.add(socket))
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    t.after(() => {
      for (const socket of sockets) socket.destroy()
      return new Promise((resolve) => silent.close(resolve))
    })
    const { port } = silent.address() as { port: number }
    for (const connectTimeoutMs of [40, 0]) {
      const client = new Redis({ port, lazyConnect: true, enableOfflineQueue: false })
      client.on('error', () => {})
      t.after(() => client.disconnect())
      const lines: Array<{ msg: string }> = []
      const stream = { write: (line: string) => void lines.push(JSON.parse(line)) }
      const app = Fastify({ logger: { level: 'warn', stream } })
      t.after(() => app.close())
      await app.register(idempotency, { redis: client, connectTimeoutMs })
      await app.ready()
      const waited = lines.filter((line) => /not ready at boot/.test(line.msg))
      if (connectTimeoutMs === 0) assert.deepEqual(waited, [])
      else {
        assert.equal(waited.length, 1)
        assert.match(waited[0]!.msg, /not ready within 40 ms/)
      }
    }
  })
})
