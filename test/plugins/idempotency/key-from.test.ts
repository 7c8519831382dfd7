import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import idempotency, {
  type IdempotencyPluginOptions,
  type IdempotencyReplay,
  requestFingerprint,
} from '../../../src/plugins/idempotency/index.ts'
import { createRedisClient } from '../../../src/plugins/redis/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

let shared: RedisClient
before(() => {
  shared = createRedisClient(testRedisConnection())
})
after(() => shared.quit())

interface FormBody {
  idempotencyKey?: unknown
  item?: string
  size?: number
}

interface KeyFromApp {
  app: FastifyInstance
  runs: Map<string, number>
  prefix: string
  /** Error lines the app logged. */
  errors: Array<{ msg: string; plugin?: string; err?: { message: string } }>
}

/**
 * The plugin with a plugin-wide `keyFrom` reading the body's `idempotencyKey`; `/query` reads the
 * key from the query string instead, `/optional` does not require one.
 */
async function keyFromApp(options: Partial<IdempotencyPluginOptions> = {}): Promise<KeyFromApp> {
  const prefix = uniquePrefix('idemkf')
  const errors: KeyFromApp['errors'] = []
  const app = Fastify({
    logger: {
      level: 'error',
      stream: { write: (line: string) => void errors.push(JSON.parse(line)) },
    },
  })
  await app.register(idempotency, {
    redis: shared,
    keyPrefix: prefix,
    maxResponseBytes: 200,
    keyFrom: (request) => (request.body as FormBody | undefined)?.idempotencyKey as string | undefined,
    ...options,
  })
  const runs = new Map<string, number>()
  const count = (name: string) => {
    runs.set(name, (runs.get(name) ?? 0) + 1)
    return runs.get(name)!
  }
  app.post<{ Body: FormBody }>('/form', { config: { idempotency: true } }, async (request, reply) => {
    const run = count('form')
    reply.header('location', `/orders/${run}`)
    return reply.code(201).send({ run, item: request.body.item, data: 'x'.repeat(request.body.size ?? 0) })
  })
  app.post<{ Body: FormBody; Querystring: { key?: string } }>(
    '/query',
    { config: { idempotency: { keyFrom: (request) => (request.query as { key?: string }).key } } },
    async (request) => ({ run: count('query'), item: request.body.item }),
  )
  app.post('/optional', { config: { idempotency: { required: false } } }, async () => ({
    run: count('optional'),
  }))
  await app.ready()
  return { app, runs, prefix, errors }
}

const postForm = (
  app: FastifyInstance,
  payload: FormBody,
  headers: Record<string, string> = {},
  url = '/form',
) => app.inject({ method: 'POST', url, headers, payload })

describe('keyFrom and onReplay options', () => {
  const cases: Array<[Partial<IdempotencyPluginOptions> | 'route-keyFrom' | 'route-onReplay', string]> = [
    [
      { keyFrom: 'body.key' as never },
      "idempotency plugin: `keyFrom` must be a function of the request, got a string ('body.key')",
    ],
    [
      { onReplay: true as never },
      'idempotency plugin: `onReplay` must be a function of the request and the reply, got a boolean',
    ],
    [{ keyPrefix: 7 as unknown as string }, 'idempotency plugin: `keyPrefix` must be a string, got 7'],
    [
      'route-keyFrom',
      "idempotency plugin: route POST /x: config.idempotency: `keyFrom` must be a function of the request, got a string ('body.key')",
    ],
    [
      'route-onReplay',
      'idempotency plugin: route POST /x: config.idempotency: `onReplay` must be a function of the request and the reply, got 1',
    ],
  ]
  for (const [options, message] of cases) {
    test(message, async () => {
      const app = Fastify()
      await assert.rejects(
        async () => {
          await app.register(idempotency, { redis: shared, ...(typeof options === 'object' ? options : {}) })
          if (options === 'route-keyFrom')
            app.post('/x', { config: { idempotency: { keyFrom: 'body.key' as never } } }, async () => 1)
          if (options === 'route-onReplay')
            app.post('/x', { config: { idempotency: { onReplay: 1 as never } } }, async () => 1)
          await app.ready()
        },
        { message },
      )
      await app.close()
    })
  }
})

describe('keyFrom: the key from the request when the header is absent', () => {
  test('a body field is the key: the first request runs, a retry replays, another body is 422', async () => {
    const { app, runs } = await keyFromApp()
    const first = await postForm(app, { idempotencyKey: 'form-1', item: 'book' })
    assert.equal(first.statusCode, 201)
    assert.equal(first.headers['idempotent-replayed'], undefined)
    const again = await postForm(app, { idempotencyKey: 'form-1', item: 'book' })
    assert.equal(again.statusCode, 201)
    assert.equal(again.headers['idempotent-replayed'], 'true')
    assert.equal(again.body, first.body)
    assert.equal(again.headers.location, '/orders/1')
    const other = await postForm(app, { idempotencyKey: 'form-1', item: 'pen' })
    assert.equal(other.statusCode, 422)
    assert.equal(other.json().type, '/problems/idempotency-key-mismatch')
    assert.equal(runs.get('form'), 1)
    await app.close()
  })

  test('the header wins when present; a key is one key whichever way it came', async () => {
    const { app, runs } = await keyFromApp()
    const body = { idempotencyKey: 'form-h', item: 'book' }
    assert.equal((await postForm(app, body)).statusCode, 201)
    // The header's key is used, not the body's: a new key, so a new run.
    const byHeader = await postForm(app, body, { 'idempotency-key': 'header-h' })
    assert.equal(byHeader.statusCode, 201)
    assert.equal(byHeader.headers['idempotent-replayed'], undefined)
    assert.equal(runs.get('form'), 2)
    // The body's key sent as the header (bare or quoted) is the same key: a replay.
    for (const header of ['form-h', '"form-h"']) {
      const same = await postForm(app, body, { 'idempotency-key': header })
      assert.equal(same.headers['idempotent-replayed'], 'true', header)
      assert.equal(same.json().run, 1)
    }
    // The header's key with a body naming another key: that body differs from the header key's first one.
    const mismatch = await postForm(
      app,
      { ...body, idempotencyKey: 'elsewhere' },
      { 'idempotency-key': 'form-h' },
    )
    assert.equal(mismatch.statusCode, 422)
    assert.equal(runs.get('form'), 2)
    await app.close()
  })

  test('30 concurrent requests with one body key run the handler once', async () => {
    const { app, runs } = await keyFromApp()
    const results = await Promise.all(
      Array.from({ length: 30 }, () => postForm(app, { idempotencyKey: 'form-30', item: 'lamp' })),
    )
    assert.equal(runs.get('form'), 1)
    const first = results.find((r) => r.statusCode === 201 && !r.headers['idempotent-replayed'])!
    for (const r of results) {
      if (r.statusCode === 409) assert.equal(r.json().type, '/problems/idempotency-key-in-flight')
      else assert.deepEqual([r.statusCode, r.body], [201, first.body])
    }
    await app.close()
  })

  test('no key anywhere is 400 missing; a malformed one is 400 invalid naming its source; nothing is written', async () => {
    const { app, runs, prefix } = await keyFromApp()
    const missing = await postForm(app, { item: 'book' })
    assert.equal(missing.statusCode, 400)
    assert.equal(missing.json().type, '/problems/idempotency-key-missing')
    assert.equal(
      missing.json().detail,
      'Send an Idempotency-Key header, or the key where this route reads it from the request.',
    )
    for (const key of ['', 'with space', 'k'.repeat(256), 'café', '"unterminated', 42, ['a'], { k: 1 }]) {
      const res = await postForm(app, { idempotencyKey: key, item: 'book' })
      assert.equal(res.statusCode, 400, JSON.stringify(key))
      assert.equal(res.json().type, '/problems/idempotency-key-invalid')
      assert.match(res.json().detail, /^The idempotency key must be a key of 1 to 255 characters/)
    }
    const badHeader = await postForm(app, { idempotencyKey: 'fine' }, { 'idempotency-key': 'with space' })
    assert.equal(badHeader.statusCode, 400)
    assert.match(badHeader.json().detail, /^Idempotency-Key must be/)
    assert.equal(runs.get('form'), undefined)
    assert.deepEqual(await scanKeys(shared, prefix), [])
    await app.close()
  })

  test("a route's keyFrom replaces the plugin-wide one; a route that does not require a key runs without one", async () => {
    const { app, runs } = await keyFromApp()
    // /query reads the query string: the body's field is not a key there.
    const noKey = await postForm(app, { idempotencyKey: 'q-1', item: 'a' }, {}, '/query')
    assert.equal(noKey.statusCode, 400)
    assert.equal(noKey.json().type, '/problems/idempotency-key-missing')
    const first = await postForm(app, { item: 'a' }, {}, '/query?key=q-1')
    const again = await postForm(app, { item: 'a' }, {}, '/query?key=q-1')
    assert.deepEqual(
      [first.statusCode, again.statusCode, again.headers['idempotent-replayed']],
      [200, 200, 'true'],
    )
    assert.equal(runs.get('query'), 1)
    // The query is part of the target, as for any route: more of it under the key is another request.
    assert.equal((await postForm(app, { item: 'a' }, {}, '/query?key=q-1&rush=1')).statusCode, 422)
    for (let i = 0; i < 2; i++) assert.equal((await postForm(app, {}, {}, '/optional')).statusCode, 200)
    assert.equal(runs.get('optional'), 2)
    const optionalKeyed = await postForm(app, { idempotencyKey: 'opt-1' }, {}, '/optional')
    const optionalAgain = await postForm(app, { idempotencyKey: 'opt-1' }, {}, '/optional')
    assert.equal(optionalAgain.headers['idempotent-replayed'], 'true')
    assert.equal(optionalAgain.body, optionalKeyed.body)
    await app.close()
  })

  test('with a principal source, a key from the body without a principal is refused with 401', async () => {
    const { app, runs } = await keyFromApp({
      principal: (request) => request.headers['x-user'] as string | undefined,
    })
    const anonymous = await postForm(app, { idempotencyKey: 'p-1', item: 'book' })
    assert.equal(anonymous.statusCode, 401)
    assert.equal(anonymous.json().type, '/problems/idempotency-principal-required')
    const alice = await postForm(app, { idempotencyKey: 'p-1', item: 'book' }, { 'x-user': 'alice' })
    const bob = await postForm(app, { idempotencyKey: 'p-1', item: 'book' }, { 'x-user': 'bob' })
    assert.deepEqual(
      [alice.statusCode, bob.statusCode, bob.headers['idempotent-replayed']],
      [201, 201, undefined],
    )
    assert.equal(runs.get('form'), 2)
    await app.close()
  })
})

describe('onReplay', () => {
  test('called before each replay with the stored status and headers on the reply; it may add a header', async () => {
    const seen: Array<IdempotencyReplay & { statusCode: number; location: unknown }> = []
    const { app } = await keyFromApp({
      onReplay: (_request, reply, replay) => {
        seen.push({ ...replay, statusCode: reply.statusCode, location: reply.getHeader('location') })
        reply.header('x-replayed-by', 'hook')
      },
    })
    const body = { idempotencyKey: 'r-1', item: 'book' }
    const first = await postForm(app, body)
    assert.equal(first.headers['x-replayed-by'], undefined)
    assert.deepEqual(seen, [])
    const again = await postForm(app, body, { 'idempotency-key': 'r-1' })
    assert.deepEqual([again.statusCode, again.body], [201, first.body])
    assert.equal(again.headers['idempotent-replayed'], 'true')
    assert.equal(again.headers['x-replayed-by'], 'hook')
    assert.deepEqual(seen, [
      {
        key: 'r-1',
        fingerprint: requestFingerprint('POST', '/form', body),
        status: 201,
        kept: true,
        statusCode: 201,
        location: '/orders/1',
      },
    ])
    // Not called for a mismatch (422) or a first run.
    assert.equal((await postForm(app, { ...body, item: 'pen' })).statusCode, 422)
    assert.equal((await postForm(app, { idempotencyKey: 'r-2' })).statusCode, 201)
    assert.equal(seen.length, 1)
    await app.close()
  })

  test('a replay whose response was not kept (410) calls it too, with kept false and the original status', async () => {
    const seen: IdempotencyReplay[] = []
    const { app } = await keyFromApp({
      onReplay: (_request, reply, replay) => {
        seen.push(replay)
        reply.header('x-hook-status', String(reply.statusCode))
      },
    })
    const body = { idempotencyKey: 'big-1', size: 500 }
    assert.equal((await postForm(app, body)).statusCode, 201)
    const again = await postForm(app, body)
    assert.equal(again.statusCode, 410)
    assert.equal(again.json().type, '/problems/idempotency-response-not-kept')
    assert.equal(again.headers['content-type'], 'application/problem+json; charset=utf-8')
    assert.equal(again.headers['idempotent-replayed'], 'true')
    assert.equal(again.headers['x-hook-status'], '410')
    assert.deepEqual(
      seen.map(({ key, status, kept }) => ({ key, status, kept })),
      [{ key: 'big-1', status: 201, kept: false }],
    )
    await app.close()
  })

  test('a hook that throws or rejects is logged and the replay is sent all the same', async () => {
    for (const hook of [
      () => {
        throw new Error('hook broke')
      },
      async () => {
        throw new Error('hook broke')
      },
    ]) {
      const { app, errors, runs } = await keyFromApp({ onReplay: hook })
      const body = { idempotencyKey: 'boom-1', item: 'book' }
      const first = await postForm(app, body)
      const again = await postForm(app, body)
      assert.deepEqual([again.statusCode, again.body], [201, first.body])
      assert.equal(again.headers['idempotent-replayed'], 'true')
      assert.equal(runs.get('form'), 1)
      const logged = errors.find((e) => e.msg === 'onReplay hook failed; the replay is sent')
      assert.equal(logged?.err?.message, 'hook broke')
      assert.equal(logged?.plugin, 'idempotency')
      await app.close()
    }
  })

  test("a route's onReplay replaces the plugin-wide one", async () => {
    const calls: string[] = []
    const app = Fastify()
    await app.register(idempotency, {
      redis: shared,
      keyPrefix: uniquePrefix('idemkf'),
      onReplay: () => void calls.push('plugin'),
    })
    app.post('/a', { config: { idempotency: true } }, async () => ({ a: 1 }))
    app.post('/b', { config: { idempotency: { onReplay: () => void calls.push('route') } } }, async () => ({
      b: 1,
    }))
    for (const url of ['/a', '/a', '/b', '/b'])
      await app.inject({ method: 'POST', url, headers: { 'idempotency-key': 'k' }, payload: {} })
    assert.deepEqual(calls, ['plugin', 'route'])
    await app.close()
  })
})
