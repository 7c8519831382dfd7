import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import metrics from '../../../src/plugins/metrics/index.ts'
import redis, { createRedisClient } from '../../../src/plugins/redis/index.ts'
import { createLock } from '../../../src/primitives/lock.ts'
import { uniquePrefix } from '../../helpers/index.ts'
import { delta, scrape } from '../../helpers/metrics-scrape.ts'

const REDIS_COUNT = 'redis_command_duration_seconds_count'
const REDIS_ERRORS = 'redis_command_errors_total'

async function appWith(register: (app: FastifyInstance) => Promise<void>): Promise<FastifyInstance> {
  const app = Fastify({ logger: false })
  await app.register(metrics, { processMetrics: false })
  await register(app)
  await app.ready()
  return app
}

describe('Redis commands', () => {
  // A dedicated server: it is paused and stopped by these tests.
  let server: Awaited<ReturnType<typeof startRedisServer>>
  let app: FastifyInstance
  const prefix = uniquePrefix('m')
  before(async () => {
    server = await startRedisServer()
    app = await appWith(async (a) => {
      await a.register(redis, { url: server.url, commandTimeoutMs: 200 })
    })
  })
  after(async () => {
    await app?.close()
    await server?.stop()
  })

  test('each command is counted once under its name, scripts under their file name', async () => {
    const before = await scrape(app)
    await app.redis.set(`${prefix}a`, '1')
    await app.redis.get(`${prefix}a`)
    await app.redis.pipeline().get(`${prefix}a`).get(`${prefix}b`).exec()
    // On this fresh server the first run's EVALSHA gets NOSCRIPT and the script is sent with EVAL; the
    // second run's EVALSHA is answered: all three named after the file.
    const lock = createLock(app.redis, { keyPrefix: prefix })
    await lock.holder('s')
    await lock.holder('s')
    const moved = delta(before, await scrape(app))
    assert.equal(moved(REDIS_COUNT, { client: 'main', command: 'set' }), 1)
    assert.equal(moved(REDIS_COUNT, { client: 'main', command: 'get' }), 3)
    assert.equal(moved(REDIS_COUNT, { client: 'main', command: 'script:lockHolder' }), 3)
    assert.equal(moved(REDIS_COUNT, { client: 'main', command: 'script:unknown' }), 0)
    // The one NOSCRIPT is a script reload, not an error.
    assert.equal(moved(REDIS_ERRORS), 0)
    assert.equal(moved('redis_script_reloads_total'), 1)
    assert.equal(moved('redis_script_reloads_total', { client: 'main', command: 'script:lockHolder' }), 1)
  })

  test('a command beyond the timeout is an error with reason timeout', async (t) => {
    const admin = new Redis(server.url)
    t.after(async () => {
      await admin.client('UNPAUSE')
      admin.disconnect()
    })
    await admin.client('PAUSE', 1000, 'ALL')
    const before = await scrape(app)
    await assert.rejects(app.redis.get(`${prefix}a`), /timed out/i)
    const moved = delta(before, await scrape(app))
    assert.equal(moved(REDIS_ERRORS, { client: 'main', command: 'get', reason: 'timeout' }), 1)
    assert.equal(moved(REDIS_COUNT, { client: 'main', command: 'get' }), 1)
  })

  test('two apps sharing a client count separately; a closed app stops counting', async (t) => {
    const client = createRedisClient({ url: server.url })
    const first = await appWith(async (a) => {
      await a.register(redis, { redis: client })
    })
    const second = await appWith(async (a) => {
      await a.register(redis, { redis: client })
    })
    t.after(async () => {
      await first.close()
      await second.close()
      await client.quit()
    })
    const [before1, before2] = [await scrape(first), await scrape(second)]
    await client.get(`${prefix}shared`)
    assert.equal(delta(before1, await scrape(first))(REDIS_COUNT, { command: 'get' }), 1)
    assert.equal(delta(before2, await scrape(second))(REDIS_COUNT, { command: 'get' }), 1)
    await first.close()
    const after2 = await scrape(second)
    const closedBefore = (await first.metrics.registry.getSingleMetricAsString(
      'redis_command_duration_seconds',
    )) as string
    await client.get(`${prefix}shared`)
    assert.equal(delta(after2, await scrape(second))(REDIS_COUNT, { command: 'get' }), 1)
    assert.equal(
      await first.metrics.registry.getSingleMetricAsString('redis_command_duration_seconds'),
      closedBefore,
    )
  })

  test('observeRedis labels another client by the name it is given, once', async (t) => {
    const cacheClient = createRedisClient({ url: server.url })
    await cacheClient.connect()
    t.after(() => cacheClient.disconnect())
    app.metrics.observeRedis(cacheClient, 'cache')
    app.metrics.observeRedis(cacheClient, 'cache')
    const before = await scrape(app)
    await cacheClient.get(`${prefix}c`)
    const moved = delta(before, await scrape(app))
    assert.equal(moved(REDIS_COUNT, { client: 'cache', command: 'get' }), 1)
    assert.equal(moved(REDIS_COUNT, { client: 'main' }), 0)
  })

  test('commands to a stopped Redis fail fast and count as connection errors', async () => {
    await server.stop()
    const before = await scrape(app)
    await assert.rejects(app.redis.get(`${prefix}a`))
    const moved = delta(before, await scrape(app))
    assert.equal(moved(REDIS_ERRORS, { client: 'main', command: 'get', reason: 'connection' }), 1)
  })
})

test('the plugin alone: HTTP histogram by route pattern; path false serves nothing', async (t) => {
  const app = await appWith(async (a) => {
    a.get('/items/:id', async () => ({ ok: true }))
  })
  const hidden = await appWith(async () => {})
  const bare = Fastify({ logger: false })
  await bare.register(metrics, { path: false, processMetrics: false })
  t.after(() => Promise.all([app.close(), hidden.close(), bare.close()]))
  await app.inject({ url: '/items/1' })
  await app.inject({ url: '/items/2' })
  const now = await scrape(app)
  assert.equal(
    now.value('http_request_duration_seconds_count', { route: '/items/:id', status: '200', method: 'GET' }),
    2,
  )
  assert.ok((await hidden.inject({ url: '/metrics' })).body.includes('http_request_duration_seconds'))
  assert.equal((await bare.inject({ url: '/metrics' })).statusCode, 404)
})

test('names: opentelemetry keeps the latency histograms under the semantic conventions, both keeps the two', async (t) => {
  const client = new Redis({ lazyConnect: true })
  const prefix = uniquePrefix('otel-names')
  const build = async (names: 'opentelemetry' | 'both') => {
    const app = Fastify({ logger: false })
    await app.register(metrics, { processMetrics: false, names })
    app.get('/items/:id', async () => ({ ok: true }))
    app.get('/boom', async () => {
      throw new Error('boom')
    })
    await app.ready()
    app.metrics.observeRedis(client, 'own')
    return app
  }
  const otel = await build('opentelemetry')
  const both = await build('both')
  t.after(() => Promise.all([otel.close(), both.close(), client.quit()]))
  await client.connect()
  await client.get(`${prefix}a`)
  await createLock(client, { keyPrefix: prefix }).holder('s')
  for (const app of [otel, both]) {
    await app.inject({ url: '/items/1' })
    await app.inject({ url: '/boom' })
    await app.inject({ url: '/nowhere' })
    const now = await scrape(app)
    const http = 'http_server_request_duration_seconds_count'
    assert.equal(
      now.value(http, {
        http_request_method: 'GET',
        http_route: '/items/:id',
        http_response_status_code: '200',
        url_scheme: 'http',
      }),
      1,
    )
    assert.equal(
      now.value(http, { http_response_status_code: '500', error_type: '500', http_route: '/boom' }),
      1,
    )
    // No route matched: no http_route attribute, never the raw URL.
    assert.equal(now.value(http, { http_response_status_code: '404' }), 1)
    assert.equal(now.value(http, { http_route: '/nowhere' }), 0)
    const db = 'db_client_operation_duration_seconds_count'
    assert.equal(now.value(db, { db_system_name: 'redis', db_operation_name: 'GET' }), 1)
    // The script by its file's name, whether it went as EVALSHA or (after NOSCRIPT) as EVAL.
    assert.ok(now.value(db, { db_stored_procedure_name: 'lockHolder' }) >= 1)
    const text = (await app.inject({ url: '/metrics' })).body
    assert.match(text, /^# TYPE http_server_request_duration_seconds histogram$/m)
    assert.match(text, /^http_server_request_duration_seconds_bucket\{.*le="7\.5"\} /m, 'the advised buckets')
    assert.match(text, /^db_client_operation_duration_seconds_bucket\{.*le="0\.005"\} /m)
    assert.equal(/^http_request_duration_seconds_count/m.test(text), app === both)
    assert.equal(/^redis_command_duration_seconds_count/m.test(text), app === both)
  }
})

test('OpenMetrics: the same samples as the Prometheus format, counters as <family>_total, ending in # EOF', async (t) => {
  const app = await appWith(async (a) => {
    a.get('/items/:id', async () => ({ ok: true }))
    await a.register(redis, { url: 'redis://127.0.0.1:6379' })
  })
  t.after(() => app.close())
  await app.inject({ url: '/items/1' })
  await app.redis.get(uniquePrefix('om'))
  const prometheus = (await app.inject({ url: '/metrics' })).body
  const open = await app.inject({ url: '/metrics', headers: { accept: 'application/openmetrics-text' } })
  assert.match(String(open.headers['content-type']), /^application\/openmetrics-text; version=1\.0\.0/)
  assert.ok(open.body.endsWith('\n# EOF\n'))
  // The two scrapes differ only by the first scrape's own timing.
  const samples = (text: string) =>
    text.split('\n').filter((l) => /^[a-z]/.test(l) && !l.includes('route="/metrics"'))
  assert.deepEqual(samples(open.body), samples(prometheus))
  assert.match(open.body, /^# TYPE redis_command_errors counter$/m)
  assert.match(prometheus, /^# TYPE redis_command_errors_total counter$/m)
  // The Prometheus format is untouched by an OpenMetrics scrape (prom-client's own would rename).
  assert.match((await app.inject({ url: '/metrics' })).body, /^# TYPE redis_command_errors_total counter$/m)
})
