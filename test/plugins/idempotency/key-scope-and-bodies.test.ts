import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import fc from 'fast-check'
import Fastify, { type FastifyInstance } from 'fastify'
import type { PrincipalFunction } from '../../../src/plugins/common/principal.ts'
import idempotency, {
  canonicalJson,
  type IdempotencyPluginOptions,
} from '../../../src/plugins/idempotency/index.ts'
import redisPlugin, { createRedisClient } from '../../../src/plugins/redis/index.ts'
import session from '../../../src/plugins/session/index.ts'
import type { RedisClient } from '../../../src/redis/client.ts'
import { scanKeys, TEST_SECRET, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { answerProblems } from '../../helpers/plain-app.ts'

let shared: RedisClient
before(async () => {
  shared = createRedisClient(testRedisConnection())
})
after(() => shared.quit())

interface HardeningApp {
  app: FastifyInstance
  prefix: string
  /** Handler runs per route, counted in Redis: a run is a write. */
  runs(name: string): Promise<number>
}

/**
 * The plugin on a bare app with its default scope. `principal` is the `x-user` header unless
 * options say otherwise; the handlers never echo the body (a deep body would fail the serializer,
 * which is not the plugin's business).
 */
async function hardeningApp(
  options: Partial<IdempotencyPluginOptions> & { session?: boolean } = {},
): Promise<HardeningApp> {
  const prefix = uniquePrefix('idemh')
  const app = Fastify()
  answerProblems(app)
  await app.register(redisPlugin, { redis: shared })
  const { session: withSession, ...pluginOptions } = options
  if (withSession) await app.register(session, { secrets: [TEST_SECRET], keyPrefix: `${prefix}sess:` })
  await app.register(idempotency, { keyPrefix: `${prefix}idem:`, ...pluginOptions })
  const counter = (name: string) => `${prefix}runs:${name}`
  const run = (name: string) => shared.incr(counter(name))
  app.post<{ Params: { id: string } }>(
    '/orders/:id/pay',
    { config: { idempotency: true } },
    async (request, reply) => {
      const n = await run('pay')
      return reply.code(201).send({ order: request.params.id, query: request.query, run: n })
    },
  )
  app.post('/things', { config: { idempotency: true } }, async (_request, reply) =>
    reply.code(201).send({ run: await run('things') }),
  )
  app.post('/open', { config: { idempotency: { anonymous: true } } }, async (_request, reply) =>
    reply.code(201).send({ run: await run('open') }),
  )
  app.post('/optional', { config: { idempotency: { required: false } } }, async (_request, reply) =>
    reply.code(201).send({ run: await run('optional') }),
  )
  await app.ready()
  return {
    app,
    prefix,
    runs: async (name) => Number((await shared.get(counter(name))) ?? 0),
  }
}

const send = (
  app: FastifyInstance,
  url: string,
  key: string | undefined,
  payload: string,
  headers: Record<string, string> = { 'x-user': 'u1' },
  remoteAddress = '127.0.0.1',
) =>
  app.inject({
    method: 'POST',
    url,
    remoteAddress,
    headers: {
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
      ...headers,
    },
    payload,
  })

const byHeader = {
  principal: ((request) => request.headers['x-user'] as string | undefined) as PrincipalFunction,
}

describe('a key is bound to the request target: path parameters and query string', () => {
  test('the same key and body on another order, or with another query, is 422 and never runs', async () => {
    const { app, runs } = await hardeningApp(byHeader)
    const body = '{"amount":10}'
    const first = await send(app, '/orders/1/pay', 'k1', body)
    assert.equal(first.statusCode, 201)
    assert.equal(first.json().order, '1')
    for (const url of ['/orders/2/pay', '/orders/1/pay?refund=true']) {
      const other = await send(app, url, 'k1', body)
      assert.equal(other.statusCode, 422, url)
      assert.equal(other.json().type, '/problems/idempotency-key-mismatch')
      assert.equal(other.headers['idempotent-replayed'], undefined)
    }
    const retry = await send(app, '/orders/1/pay', 'k1', body)
    assert.equal(retry.headers['idempotent-replayed'], 'true')
    assert.equal(retry.body, first.body)
    assert.equal(await runs('pay'), 1)
    await app.close()
  })

  test('the order of query fields does not matter; their values do', async () => {
    const { app, runs } = await hardeningApp(byHeader)
    const first = await send(app, '/orders/7/pay?a=1&b=2&b=3', 'q1', '{}')
    assert.equal(first.statusCode, 201)
    const reordered = await send(app, '/orders/7/pay?b=2&b=3&a=1', 'q1', '{}')
    assert.equal(reordered.headers['idempotent-replayed'], 'true')
    assert.equal(reordered.body, first.body)
    assert.equal((await send(app, '/orders/7/pay?b=3&b=2&a=1', 'q1', '{}')).statusCode, 422)
    assert.equal((await send(app, '/orders/7/pay?a=1&b=2&b=3&c=', 'q1', '{}')).statusCode, 422)
    assert.equal(await runs('pay'), 1)
    await app.close()
  })

  test('a percent-encoded parameter is the same target as its decoded spelling', async () => {
    const { app, runs } = await hardeningApp(byHeader)
    const first = await send(app, '/orders/a%20b/pay', 'enc', '{}')
    assert.equal(first.statusCode, 201)
    assert.equal(first.json().order, 'a b')
    assert.equal((await send(app, '/orders/a%20b/pay', 'enc', '{}')).headers['idempotent-replayed'], 'true')
    assert.equal(await runs('pay'), 1)
    await app.close()
  })

  test('routes sharing a pattern but not a host constraint are different targets', async () => {
    const app = Fastify()
    answerProblems(app)
    await app.register(redisPlugin, { redis: shared })
    await app.register(idempotency, { keyPrefix: uniquePrefix('idemh'), ...byHeader })
    let runs = 0
    for (const host of ['a.example', 'b.example'])
      app.post('/hosted', { constraints: { host }, config: { idempotency: true } }, async () => ({
        host,
        run: ++runs,
      }))
    await app.ready()
    const at = (host: string) =>
      app.inject({
        method: 'POST',
        url: '/hosted',
        headers: { host, 'x-user': 'u1', 'idempotency-key': 'h1' },
        payload: {},
      })
    const a = await at('a.example')
    assert.equal(a.json().host, 'a.example')
    const b = await at('b.example')
    assert.equal(b.statusCode, 422)
    assert.equal(b.json().type, '/problems/idempotency-key-mismatch')
    assert.equal((await at('a.example')).headers['idempotent-replayed'], 'true')
    assert.equal(runs, 1)
    await app.close()
  })
})

/** `[[[...]]]` and `{"a":{"a":...}}`, `depth` levels, innermost `leaf`. */
const deepArray = (depth: number, leaf = '') => `${'['.repeat(depth)}${leaf}${']'.repeat(depth)}`
const deepObject = (depth: number, leaf = '1') => `${'{"a":'.repeat(depth)}${leaf}${'}'.repeat(depth)}`

describe('deeply nested bodies', () => {
  test('100,000 levels of arrays or objects run once, replay, and mismatch: never a 5xx', async () => {
    const { app, runs, prefix } = await hardeningApp(byHeader)
    const cases: Array<[string, string, string]> = [
      ['arrays', deepArray(100_000), deepArray(100_000, '1')],
      ['objects', deepObject(100_000), deepObject(100_000, '2')],
    ]
    for (const [name, body, other] of cases) {
      const first = await send(app, '/things', `deep-${name}`, body)
      assert.equal(first.statusCode, 201, `${name}: ${first.body}`)
      const retry = await send(app, '/things', `deep-${name}`, body)
      assert.equal(retry.statusCode, 201)
      assert.equal(retry.headers['idempotent-replayed'], 'true')
      assert.equal(retry.body, first.body)
      const mismatch = await send(app, '/things', `deep-${name}`, other)
      assert.equal(mismatch.statusCode, 422, name)
    }
    assert.equal(await runs('things'), 2)
    assert.equal((await scanKeys(shared, `${prefix}idem:`)).length, 2)
    await app.close()
  })

  test('canonical JSON of deep values: keys sorted at every depth, no call-stack limit', () => {
    assert.equal(canonicalJson({ b: [1, { d: 1, c: 2 }], a: null }), '{"a":null,"b":[1,{"c":2,"d":1}]}')
    assert.equal(canonicalJson(JSON.parse(deepObject(200_000))).length, deepObject(200_000).length)
    assert.equal(canonicalJson(JSON.parse(deepArray(200_000))), deepArray(200_000))
    assert.equal(canonicalJson({ a: undefined, b: [undefined, 1], '': 2 }), '{"":2,"b":[null,1]}')
    // For any JSON value, the same text as the plain recursive definition (fine at shallow depths).
    const reference = (value: unknown): string => {
      if (Array.isArray(value)) return `[${value.map((v) => reference(v ?? null)).join(',')}]`
      if (value !== null && typeof value === 'object') {
        const record = value as Record<string, unknown>
        const fields = Object.keys(record)
          .filter((k) => record[k] !== undefined)
          .sort()
          .map((k) => `${JSON.stringify(k)}:${reference(record[k])}`)
        return `{${fields.join(',')}}`
      }
      return JSON.stringify(value) ?? 'null'
    }
    fc.assert(
      fc.property(fc.jsonValue(), (v) => canonicalJson(v) === reference(v)),
      { numRuns: 1000 },
    )
  })

  test('values JSON.stringify writes alike are told apart: Infinity (1e400) is not null', async () => {
    const { app, runs } = await hardeningApp(byHeader)
    assert.equal((await send(app, '/things', 'inf', '{"a":1e400}')).statusCode, 201)
    assert.equal((await send(app, '/things', 'inf', '{"a":null}')).statusCode, 422)
    assert.equal((await send(app, '/things', 'inf', '{"a":-1e400}')).statusCode, 422)
    assert.equal(await runs('things'), 1)
    await app.close()
  })
})

describe('anonymous callers', () => {
  test('with a principal source, a key without a principal is refused with 401 and writes nothing', async () => {
    const { app, runs, prefix } = await hardeningApp(byHeader)
    const anonymous = await send(app, '/things', 'anon-1', '{}', {})
    assert.equal(anonymous.statusCode, 401)
    assert.equal(anonymous.json().type, '/problems/idempotency-principal-required')
    assert.match(String(anonymous.headers['content-type']), /^application\/problem\+json/)
    // A required key that is absent: the caller first needs a principal.
    assert.equal((await send(app, '/things', undefined, '{}', {})).statusCode, 401)
    // An optional key: without one the route runs as any route; with one it needs a principal.
    assert.equal((await send(app, '/optional', undefined, '{}', {})).statusCode, 201)
    assert.equal((await send(app, '/optional', 'anon-2', '{}', {})).statusCode, 401)
    assert.equal(await runs('things'), 0)
    assert.equal(await runs('optional'), 1)
    assert.deepEqual(await scanKeys(shared, `${prefix}idem:`), [])
    assert.equal((await send(app, '/things', 'anon-1', '{}')).statusCode, 201)
    await app.close()
  })

  test("the session plugin's principal is a principal source: no session, no key", async () => {
    const { app, runs } = await hardeningApp({ session: true })
    const res = await send(app, '/things', 'sess-1', '{}', {})
    assert.equal(res.statusCode, 401)
    assert.equal(res.json().type, '/problems/idempotency-principal-required')
    assert.equal(await runs('things'), 0)
    await app.close()
  })

  test('a route open to anonymous callers scopes their keys by client IP', async () => {
    const { app, runs } = await hardeningApp(byHeader)
    const a = await send(app, '/open', 'ip-1', '{}', {}, '10.0.0.1')
    const b = await send(app, '/open', 'ip-1', '{}', {}, '10.0.0.2')
    assert.deepEqual([a.statusCode, b.statusCode], [201, 201])
    assert.notEqual(a.body, b.body)
    const again = await send(app, '/open', 'ip-1', '{}', {}, '10.0.0.1')
    assert.equal(again.headers['idempotent-replayed'], 'true')
    assert.equal(again.body, a.body)
    // A caller with a principal is scoped by it, not by its IP.
    const user = await send(app, '/open', 'ip-1', '{}', { 'x-user': 'u9' }, '10.0.0.1')
    assert.equal(user.headers['idempotent-replayed'], undefined)
    assert.equal(await runs('open'), 3)
    await app.close()
  })

  test('without any principal source, keys are scoped by client IP on every route', async () => {
    const { app, runs } = await hardeningApp()
    const a = await send(app, '/things', 'nat-1', '{}', {}, '10.0.0.1')
    const b = await send(app, '/things', 'nat-1', '{}', {}, '10.0.0.2')
    assert.deepEqual([a.statusCode, b.statusCode], [201, 201])
    const sameIp = await send(app, '/things', 'nat-1', '{}', {}, '10.0.0.1')
    assert.equal(sameIp.headers['idempotent-replayed'], 'true')
    assert.equal(await runs('things'), 2)
    await app.close()
  })

  test('config.idempotency.anonymous must be true or false', async () => {
    const app = Fastify()
    await assert.rejects(
      async () => {
        await app.register(redisPlugin, { redis: shared })
        await app.register(idempotency, {})
        app.post('/x', { config: { idempotency: { anonymous: 'yes' as unknown as boolean } } }, async () => 1)
        await app.ready()
      },
      {
        message:
          "idempotency plugin: route POST /x: config.idempotency: `anonymous` must be true or false, got a string ('yes')",
      },
    )
    await app.close()
  })
})

/** JSON text, written by hand so that -0, 1e308, 1e400 and lone surrogates reach the parser as sent. */
const jsonText: fc.Arbitrary<string> = fc.letrec<{ value: string }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constantFrom('null', 'true', 'false', '-0', '0', '1e308', '-1e308', '1e400', '5e-324', '1E2', '0.1'),
    fc.double({ noNaN: true, noDefaultInfinity: true }).map((n) => JSON.stringify(n)),
    fc.bigInt({ min: -(10n ** 40n), max: 10n ** 40n }).map(String),
    fc
      .oneof(
        fc.string({ unit: 'binary', maxLength: 40 }),
        fc.constantFrom(
          '\u0000',
          'a\u0000b',
          '\ud800',
          '\udc00x',
          '\ud83d\ude00',
          '__proto__',
          'constructor',
        ),
        fc.string({ minLength: 1000, maxLength: 3000 }),
      )
      .map((s) => JSON.stringify(s)),
    fc.array(tie('value'), { maxLength: 30 }).map((items) => `[${items.join(',')}]`),
    fc
      .array(
        fc.tuple(
          fc.oneof(
            fc.string({ unit: 'binary', maxLength: 20 }),
            fc.string({ minLength: 500, maxLength: 2000 }),
            fc.constantFrom('', '\u0000', '\ud800', '__proto__', 'constructor', 'prototype', 'toJSON'),
          ),
          tie('value'),
        ),
        { maxLength: 20 },
      )
      .map((fields) => `{${fields.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(',')}}`),
    fc
      .tuple(fc.integer({ min: 1, max: 20_000 }), fc.boolean())
      .map(([depth, objects]) => (objects ? deepObject(depth) : deepArray(depth))),
  ),
})).value

describe('property: arbitrary JSON on a schema-less route behind the plugin', () => {
  test('never a 5xx; the handler writes only on a 2xx; a replay and a mismatch never write', async () => {
    const { app, runs } = await hardeningApp(byHeader)
    let n = 0
    await fc.assert(
      fc.asyncProperty(jsonText, fc.boolean(), async (body, wide) => {
        const payload = wide ? `[${Array.from({ length: 100 }, () => body).join(',')}]` : body
        const key = `prop-${n++}`
        const before = await runs('things')
        const first = await send(app, '/things', key, payload)
        assert.ok(first.statusCode < 500, `${first.statusCode} ${first.body}`)
        const afterFirst = await runs('things')
        if (first.statusCode < 300) assert.equal(afterFirst, before + 1)
        else assert.equal(afterFirst, before, `${first.statusCode}: no write on a 4xx`)
        const retry = await send(app, '/things', key, payload)
        assert.equal(retry.statusCode, first.statusCode)
        if (first.statusCode < 300) {
          assert.equal(retry.headers['idempotent-replayed'], 'true')
          assert.equal(retry.body, first.body)
        }
        // Another body under the same key (within the body limit): 422, never a run.
        if (first.statusCode < 300 && Buffer.byteLength(payload) + 2 <= 1024 * 1024) {
          const other = await send(app, '/things', key, `[${payload}]`)
          assert.equal(other.statusCode, 422)
        }
        assert.equal(await runs('things'), afterFirst)
      }),
      { numRuns: 200 },
    )
    await app.close()
  })
})
