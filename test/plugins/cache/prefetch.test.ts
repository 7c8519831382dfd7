import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { peekEntry } from '../../../src/plugins/cache/cache.ts'
import cachePlugin, { type CachePluginOptions } from '../../../src/plugins/cache/index.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import rateLimit from '../../../src/plugins/rate-limit/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin from '../../../src/plugins/session/index.ts'
import { scriptSources } from '../../../src/redis/scripts.ts'
import {
  listen,
  scanKeys,
  startTcpProxy,
  TEST_REDIS_URL,
  TEST_SECRET,
  testRedisConnection,
  uniquePrefix,
} from '../../helpers/index.ts'
import { counter } from './fixtures.ts'

// What the requests measured send to Redis, on every client of the process: each command by name
// (scripts by their file's name), and round trips as the client lives them (a new one starts
// whenever a command is sent while none of the measured request's commands is in flight). Requests
// are measured one at a time.
const scriptNames = new Map([...scriptSources].map(([name, { sha }]) => [sha, name] as const))
for (const [name, { lua }] of scriptSources) scriptNames.set(lua, name)
interface Tally {
  commands: string[]
  roundTrips: number
}
let tally: Tally | null = null
let inFlight = 0
type SendCommand = (
  this: Redis,
  command: { name: string; args: unknown[]; promise: Promise<unknown> },
  stream?: unknown,
) => unknown
const original = Redis.prototype.sendCommand as unknown as SendCommand
// A connection's handshake (another client of the process connecting or reconnecting while a
// request is measured) is not the request's work.
const HANDSHAKE = new Set(['hello', 'client', 'auth', 'select', 'info'])

// Created once sendCommand is wrapped: a client's write batching holds on to the method it found.
let redis: RedisClient
const clients: RedisClient[] = []
const apps: FastifyInstance[] = []
const closers: Array<() => Promise<void>> = []
before(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, stream) {
    if (tally && !HANDSHAKE.has(command.name)) {
      const script = command.name === 'evalsha' || command.name === 'eval' ? String(command.args[0]) : ''
      tally.commands.push(script ? (scriptNames.get(script) ?? command.name) : command.name)
      if (inFlight++ === 0) tally.roundTrips++
      const settled = () => {
        inFlight--
      }
      command.promise.then(settled, settled)
    }
    return original.call(this, command, stream)
  }
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})
after(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = original
  await Promise.all(apps.map((app) => app.close()))
  for (const close of closers) await close()
  for (const client of clients) client.disconnect()
  redis.disconnect()
})

async function measure<T>(run: () => Promise<T>): Promise<T & Tally> {
  const measured: Tally = { commands: [], roundTrips: 0 }
  tally = measured
  try {
    const result = await run()
    return Object.assign(result as object, measured) as T & Tally
  } finally {
    tally = null
  }
}

/** A loader over a mutable source, counting its calls. */
function source<T>(initial: T) {
  const load = async () => {
    load.calls++
    return load.value
  }
  load.calls = 0
  load.value = initial
  return load
}

const itemKey = (request: FastifyRequest) => {
  const { id } = request.params as { id: string }
  return /^[0-9]{1,6}$/.test(id) ? `item:${id}` : undefined
}

/** The cache plugin alone, on a client of its own; `routes` adds the routes under test. */
async function cacheApp(
  options: CachePluginOptions,
  routes: (app: FastifyInstance) => void,
  client: RedisClient = createRedisClient(testRedisConnection()),
): Promise<FastifyInstance> {
  const app = Fastify()
  clients.push(client)
  apps.push(app)
  await app.register(metrics, { processMetrics: false, path: false })
  await app.register(cachePlugin, { redis: client, keyPrefix: uniquePrefix('pf'), ...options })
  routes(app)
  await app.ready()
  return app
}

describe('the prefetch option', () => {
  test('a fresh entry is served from the peek: it is the route’s only command', async () => {
    const load = source({ name: 'one' })
    const app = await cacheApp({}, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => {
        const { id } = request.params as { id: string }
        return app.cache.getOrLoad(`item:${id}`, load)
      })
    })
    const cold = await measure(() => app.inject('/items/1'))
    assert.equal(cold.json().name, 'one')
    // The peek found nothing; the handler then read with cache-get.lua (the lease) and filled.
    assert.deepEqual(cold.commands, ['get', 'cacheGet', 'cacheFill'])
    const hit = await measure(() => app.inject('/items/1'))
    assert.deepEqual({ name: hit.json().name, commands: hit.commands }, { name: 'one', commands: ['get'] })
    assert.equal(load.calls, 1)
    assert.equal(await counter(app, 'cache_misses_total', 'item'), 1)
    assert.equal(await counter(app, 'cache_hits_total', 'item'), 1)
    assert.equal(await counter(app, 'cache_loads_total', 'item'), 1)
  })

  test('the peek is taken only for its own key, and only before the handler’s first await', async () => {
    const app = await cacheApp({}, (app) => {
      // The route prefetches item:<id> but reads item:<id + 1>.
      app.get('/next/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => {
        const id = Number((request.params as { id: string }).id)
        return { value: await app.cache.getOrLoad(`item:${id + 1}`, async () => `loaded ${id + 1}`) }
      })
      app.get('/later/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => {
        await Promise.resolve()
        const { id } = request.params as { id: string }
        return { value: await app.cache.getOrLoad(`item:${id}`, async () => `loaded ${id}`) }
      })
    })
    await app.cache.set('item:1', 'one')
    await app.cache.set('item:2', 'two')
    const other = await measure(() => app.inject('/next/1'))
    assert.deepEqual(
      { value: other.json().value, commands: other.commands },
      { value: 'two', commands: ['get', 'cacheGet'] },
    )
    // A key nobody cached: the peek of item:2 (a hit) must not answer for it.
    const missing = await measure(() => app.inject('/next/2'))
    assert.deepEqual(
      { value: missing.json().value, commands: missing.commands },
      { value: 'loaded 3', commands: ['get', 'cacheGet', 'cacheFill'] },
    )
    const late = await measure(() => app.inject('/later/1'))
    assert.deepEqual(
      { value: late.json().value, commands: late.commands },
      { value: 'one', commands: ['get', 'cacheGet'] },
    )
    // Nothing is taken outside a prefetching route's handler either.
    assert.equal(await app.cache.getOrLoad('item:1', async () => 'loaded'), 'one')
  })

  test('over HTTP, 400 concurrent reads of 20 keys through two routes: each answers its own key', async () => {
    const loads = new Map<string, number>()
    const loadOf = (key: string) => async () => {
      loads.set(key, (loads.get(key) ?? 0) + 1)
      return { key }
    }
    const app = await cacheApp({}, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => {
        const key = `item:${(request.params as { id: string }).id}`
        return app.cache.getOrLoad(key, loadOf(key))
      })
      // Prefetches item:<id>, reads item:<id + 1>: another request's key.
      app.get('/next/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => {
        const key = `item:${Number((request.params as { id: string }).id) + 1}`
        return app.cache.getOrLoad(key, loadOf(key))
      })
    })
    const base = await listen(app)
    const paths = Array.from({ length: 400 }, (_, i) => `/${i % 3 ? 'items' : 'next'}/${1 + (i % 20)}`)
    const answers = await Promise.all(
      paths.map(async (path) => ((await (await fetch(`${base}${path}`)).json()) as { key: string }).key),
    )
    paths.forEach((path, i) => {
      const [, route, id] = path.split('/')
      assert.equal(answers[i], `item:${Number(id) + (route === 'next' ? 1 : 0)}`, path)
    })
    // One load per key: a miss is filled once, and every later read finds it.
    assert.equal(loads.size, 21)
    assert.ok(
      [...loads.values()].every((n) => n === 1),
      JSON.stringify([...loads]),
    )
  })

  test('a route without the option sends no peek; no key, or an invalid one, is no prefetch', async () => {
    const app = await cacheApp({}, (app) => {
      app.get('/plain/:id', async (request) => {
        const { id } = request.params as { id: string }
        return { value: await app.cache.getOrLoad(`item:${id}`, async () => `loaded ${id}`) }
      })
      app.get(
        '/odd/:id',
        { config: { cache: { prefetch: (request) => `Item:{${(request.params as { id: string }).id}}` } } },
        async () => ({ value: await app.cache.getOrLoad('item:9', async () => 'loaded 9') }),
      )
      app.get('/none/:id', { config: { cache: { prefetch: itemKey } } }, async () => ({ value: 'static' }))
    })
    await app.cache.set('item:1', 'one')
    const plain = await measure(() => app.inject('/plain/1'))
    assert.deepEqual(
      { value: plain.json().value, commands: plain.commands },
      { value: 'one', commands: ['cacheGet'] },
    )
    const odd = await measure(() => app.inject('/odd/1'))
    assert.deepEqual(
      { value: odd.json().value, commands: odd.commands },
      { value: 'loaded 9', commands: ['cacheGet', 'cacheFill'] },
    )
    const none = await measure(() => app.inject('/none/abc'))
    assert.deepEqual({ value: none.json().value, commands: none.commands }, { value: 'static', commands: [] })
  })

  test('a request turned away before its handler takes no lease and loads nothing', async () => {
    const load = source('value')
    const keyPrefix = uniquePrefix('pf')
    const app = await cacheApp({ keyPrefix }, (app) => {
      app.get(
        '/guarded/:id',
        {
          config: { cache: { prefetch: itemKey } },
          onRequest: async (request, reply) => {
            if (request.headers['x-pass'] !== 'yes') return reply.code(401).send({ no: 'entry' })
          },
        },
        async (request) => ({
          value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
        }),
      )
    })
    const refused = await measure(() => app.inject('/guarded/5'))
    assert.deepEqual(
      { status: refused.statusCode, commands: refused.commands },
      { status: 401, commands: ['get'] },
    )
    // The peek wrote nothing: no lease, no generation, no value.
    assert.deepEqual(await scanKeys(redis, keyPrefix), [])
    assert.equal(load.calls, 0)
    assert.equal(await counter(app, 'cache_misses_total', 'item'), 0)
    const admitted = await app.inject({ url: '/guarded/5', headers: { 'x-pass': 'yes' } })
    assert.equal(admitted.json().value, 'value')
    assert.equal(load.calls, 1)
  })

  test('stale-while-revalidate: a stale entry is served and refreshed as without the option', async () => {
    const load = source(1)
    const app = await cacheApp({ ttlMs: 100, jitter: 0, staleWhileRevalidateMs: 60_000 }, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
      }))
    })
    assert.equal((await app.inject('/items/1')).json().value, 1)
    load.value = 2
    await sleep(150)
    // The peek finds no fresh entry; cache-get.lua serves the stale copy and gives this read the lease.
    const stale = await measure(() => app.inject('/items/1'))
    assert.deepEqual(
      { value: stale.json().value, first: stale.commands.slice(0, 2) },
      { value: 1, first: ['get', 'cacheGet'] },
    )
    assert.equal(await counter(app, 'cache_stale_served_total', 'item'), 1)
    let latest = 1
    for (let i = 0; i < 40 && latest === 1; i++) {
      await sleep(25)
      latest = (await app.inject('/items/1')).json().value
    }
    assert.equal(latest, 2)
    assert.equal(load.calls, 2)
  })

  test('XFetch: early refreshes happen through a prefetching route, never with beta 0', async () => {
    for (const beta of [0, 10]) {
      const load = async () => {
        load.calls++
        await sleep(200)
        return 'v'
      }
      load.calls = 0
      const app = await cacheApp({ ttlMs: 2000, jitter: 0, earlyRefreshBeta: beta }, (app) => {
        app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
          value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
        }))
      })
      await app.inject('/items/1')
      // With a 200 ms load and beta 10, each read refreshes early with probability >= e^-1.
      for (let i = 0; i < 30; i++) assert.equal((await app.inject('/items/1')).json().value, 'v')
      await sleep(250)
      if (beta === 0) assert.equal(load.calls, 1)
      else assert.ok(load.calls >= 2, `loads ${load.calls}`)
    }
  })

  test('tags: a tagged read checks its tags as without the option', async () => {
    const load = source('v1')
    const app = await cacheApp({}, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load, {
          tags: ['shop:1'],
        }),
      }))
      app.get('/untagged/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
      }))
    })
    assert.equal((await app.inject('/items/1')).json().value, 'v1')
    const hit = await measure(() => app.inject('/items/1'))
    assert.deepEqual(
      { value: hit.json().value, commands: hit.commands },
      { value: 'v1', commands: ['get', 'cacheGet', 'cacheTags'] },
    )
    load.value = 'v2'
    await app.cache.invalidateTags(['shop:1'])
    assert.equal((await app.inject('/items/1')).json().value, 'v2')
    // An untagged read of a tagged entry still honours its tags.
    load.value = 'v3'
    await app.cache.invalidateTags(['shop:1'])
    assert.equal((await app.inject('/untagged/1')).json().value, 'v3')
    assert.equal(load.calls, 3)
  })

  test('an invalidation is seen by the next request', async () => {
    const load = source('old')
    const app = await cacheApp({}, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
      }))
    })
    assert.equal((await app.inject('/items/1')).json().value, 'old')
    assert.equal((await app.inject('/items/1')).json().value, 'old')
    load.value = 'new'
    await app.cache.invalidate(['item:1'])
    assert.equal((await app.inject('/items/1')).json().value, 'new')
    await app.cache.set('item:1', 'set')
    assert.equal((await app.inject('/items/1')).json().value, 'set')
  })

  test('with the L1 on, an entry it holds is not peeked', async () => {
    const load = source('v')
    const app = await cacheApp({ l1TtlMs: 60_000 }, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
      }))
    })
    // The L1 is used once its SUBSCRIBE is confirmed: read until it answers.
    for (let i = 0; i < 100 && (await counter(app, 'cache_l1_hits_total', 'item')) === 0; i++) {
      await app.inject('/items/1')
      await sleep(10)
    }
    const local = await measure(() => app.inject('/items/1'))
    assert.deepEqual({ value: local.json().value, commands: local.commands }, { value: 'v', commands: [] })
    assert.equal(load.calls, 1)
  })

  test('Redis failures: a failed peek is counted once and the loader answers; Redis down, no peek', {
    skip: process.env.REDIS_CLUSTER_NODES ? 'the proxy fronts a single node' : false,
  }, async () => {
    const port = Number(new URL(TEST_REDIS_URL).port || 6379)
    const proxy = await startTcpProxy(port, new URL(TEST_REDIS_URL).hostname)
    closers.push(() => proxy.close())
    const client = createRedisClient({ url: `redis://127.0.0.1:${proxy.port}` })
    await connectRedis(client)
    const load = source('from the source')
    const app = await cacheApp(
      {},
      (app) => {
        app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
          value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
        }))
      },
      client,
    )
    await app.cache.set('item:1', 'cached')
    // Slower than the 500 ms command timeout: the peek fails; the read does not ask Redis again.
    proxy.delay(1500)
    const slow = await measure(() => app.inject('/items/1'))
    assert.deepEqual(
      { value: slow.json().value, commands: slow.commands },
      { value: 'from the source', commands: ['get'] },
    )
    assert.equal(await counter(app, 'cache_redis_errors_total', 'item'), 1)
    assert.equal(load.calls, 1)
    proxy.delay(0)
    proxy.cut()
    for (let i = 0; i < 100 && client.status === 'ready'; i++) await sleep(10)
    const down = await measure(() => app.inject('/items/1'))
    assert.deepEqual(
      { value: down.json().value, commands: down.commands },
      { value: 'from the source', commands: [] },
    )
    assert.equal(await counter(app, 'cache_redis_errors_total', 'item'), 2)
    assert.equal(load.calls, 2)
  })

  test('route options are checked; a disabled cache answers prefetching routes from the loader', async () => {
    for (const [config, name, message] of [
      [
        { prefetch: 'item:1' },
        'InvalidOptionError',
        "config.cache: `prefetch` must be a function of the request returning a key or undefined, got a string ('item:1')",
      ],
      [
        { prefetsh: itemKey },
        'UnknownOptionError',
        'config.cache: unknown option `prefetsh`. Did you mean `prefetch`? Valid options: prefetch.',
      ],
      ['item:1', 'InvalidOptionError', "config.cache must be an object, got a string ('item:1')"],
    ] as const) {
      for (const enabled of [true, false]) {
        const app = Fastify()
        await app.register(cachePlugin, { enabled, redis })
        assert.throws(() => app.get('/x/:id', { config: { cache: config as never } }, async () => 1), {
          name,
          message: `cache plugin: route GET /x/:id: ${message}`,
        })
        await app.close()
      }
    }
    const load = source('loaded')
    const app = await cacheApp({ enabled: false }, (app) => {
      app.get('/items/:id', { config: { cache: { prefetch: itemKey } } }, async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
      }))
    })
    const read = await measure(() => app.inject('/items/1'))
    assert.deepEqual({ value: read.json().value, commands: read.commands }, { value: 'loaded', commands: [] })
  })
})

describe('the peek’s decision on a stored entry (a plain GET, judged here)', () => {
  const later = () => Date.now() + 60_000
  test('fresh, stale, absent and unreadable entries', () => {
    assert.deepEqual(peekEntry(`${later()}|5|{"a":1}`, 0, 1), ['{"a":1}'])
    // A payload may hold the separator itself.
    assert.deepEqual(peekEntry(`${later()}|5|a|b`, 0, 1), ['a|b'])
    assert.deepEqual(peekEntry(`${Date.now() - 1}|5|{"a":1}`, 0, 1), [])
    assert.deepEqual(peekEntry(null, 0, 1), [])
    for (const unreadable of ['', 'x', 'x|5|1', `${later()}`, `${later()}|5`, '#tags'])
      assert.deepEqual(peekEntry(unreadable, 0, 1), [], unreadable)
  })

  test('a tagged entry answers its payload with the generations it recorded', () => {
    assert.deepEqual(peekEntry(`#t=g1,u=g2|${later()}|5|1`, 0, 1), ['1', 't=g1,u=g2'])
    assert.deepEqual(peekEntry(`#t=g1|${Date.now() - 1}|5|1`, 0, 1), [])
  })

  test('XFetch: the draw decides as in cache-get.lua, and beta 0 never refreshes early', () => {
    // 1 s left, a 1 s load: with beta 1, -ln(draw) >= 1 (draw <= 1/e) refreshes early.
    const entry = `${Date.now() + 1000}|1000|1`
    assert.deepEqual(peekEntry(entry, 1, 0.01), [])
    assert.deepEqual(peekEntry(entry, 1, 0.99), ['1'])
    assert.deepEqual(peekEntry(entry, 0, 0.01), ['1'])
  })
})

describe('with the session and rate-limit plugins', () => {
  // Sessions, limits and the cache on one client: what a gateway built from these plugins does.
  let app: FastifyInstance
  let keyPrefix: string
  const load = source({ owner: 'alice', balance: 5 })
  before(async () => {
    keyPrefix = uniquePrefix('pfc')
    app = Fastify()
    apps.push(app)
    await app.register(metrics, { processMetrics: false, path: false })
    await app.register(cachePlugin, { redis, keyPrefix: `${keyPrefix}cache:` })
    // Without the session L1, every request loads its session from Redis: the case where that load
    // shares the round trip with the others.
    await app.register(sessionPlugin, {
      redis,
      secrets: [TEST_SECRET],
      keyPrefix: `${keyPrefix}sess:`,
      l1: false,
    })
    await app.register(rateLimit, {
      redis,
      keyPrefix: `${keyPrefix}rl:`,
      policies: [{ name: 'ip', algorithm: 'token-bucket', limit: 3, refillPerSecond: 0.001 }],
    })
    app.post('/login', { config: { rateLimits: false } }, async (_request, reply) => {
      await reply.regenerateSession('alice')
      return { ok: true }
    })
    app.get(
      '/mine/:id',
      { config: { session: 'required', cache: { prefetch: itemKey } } },
      async (request) => {
        const item = await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load)
        return item?.owner === request.session!.principal ? item : { owner: 'someone else' }
      },
    )
    // Anonymous: no session asked for, and no rate limit.
    app.get(
      '/public/:id',
      { config: { rateLimits: false, cache: { prefetch: itemKey } } },
      async (request) => ({
        value: await app.cache.getOrLoad(`item:${(request.params as { id: string }).id}`, load),
        session: request.session,
      }),
    )
    await app.ready()
  })

  test('a cached read: the session load, the per-IP bucket and the peek in one round trip', async () => {
    const login = await app.inject({ method: 'POST', url: '/login' })
    const cookie = String(login.headers['set-cookie']).split(';')[0]!
    assert.equal((await app.inject({ url: '/mine/1', headers: { cookie } })).json().balance, 5)
    const cached = await measure(() => app.inject({ url: '/mine/1', headers: { cookie } }))
    assert.deepEqual(
      { status: cached.statusCode, roundTrips: cached.roundTrips, commands: [...cached.commands].sort() },
      { status: 200, roundTrips: 1, commands: ['get', 'hgetall', 'rateLimitTokenBucket'] },
    )
    // An anonymous route: the peek alone.
    const anonymous = await measure(() => app.inject('/public/1'))
    assert.deepEqual(
      { value: anonymous.json(), roundTrips: anonymous.roundTrips, commands: anonymous.commands },
      {
        value: { value: { owner: 'alice', balance: 5 }, session: null },
        roundTrips: 1,
        commands: ['get'],
      },
    )
    assert.equal(load.calls, 1)
  })

  test('no session or no quota: no lease, nothing loaded', async () => {
    const calls = load.calls
    const anonymous = await app.inject('/mine/77')
    assert.equal(anonymous.statusCode, 401)
    const login = await app.inject({ method: 'POST', url: '/login' })
    const cookie = String(login.headers['set-cookie']).split(';')[0]!
    for (let spent = 0; (await app.rateLimiter.consume('ip', 'ip:127.0.0.1')).allowed; spent++)
      assert.ok(spent < 5)
    const limited = await app.inject({ url: '/mine/78', headers: { cookie } })
    assert.equal(limited.statusCode, 429)
    const cacheKeys = await scanKeys(redis, `${keyPrefix}cache:`)
    assert.deepEqual(
      cacheKeys.filter((key) => !key.includes('{item:1}')),
      [],
    )
    assert.equal(load.calls, calls)
  })
})
