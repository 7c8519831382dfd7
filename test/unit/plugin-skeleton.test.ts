import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { Counter } from 'prom-client'
import { pluginContext } from '../../src/plugins/common/context.ts'
import { InvalidOptionError, RedisClientError, UnknownOptionError } from '../../src/plugins/common/errors.ts'
import { declareOptions, type OptionsOf, option } from '../../src/plugins/common/options.ts'
import metrics from '../../src/plugins/metrics/index.ts'

// The skeleton every plugin is built on, without Redis: options read from one declaration, and
// one context per registration whose instruments the metrics plugin exports, in either order.

const DEMO = declareOptions(
  'demo plugin',
  {
    limit: option.required(option.integer({ min: 1, doc: 'requests allowed' })),
    windowMs: option.integer({ min: 1, max: 60_000, default: 1000, doc: 'window length' }),
    share: option.number({ min: 0, max: 1, doc: 'a share' }),
    name: option.string({ default: 'demo', doc: 'a name' }),
    strict: option.boolean({ default: false, doc: 'strict or not' }),
    mode: option.oneOf(['open', 'closed', 'local'] as const, { default: 'open', doc: 'on an outage' }),
    keyOf: option.function<(request: FastifyRequest) => string>({
      type: 'a function of the request returning a key',
      doc: 'the key',
    }),
    redis: option.redisClient(),
    path: option.custom<string>({
      type: 'path',
      doc: 'a path',
      read: (value, fail, name) =>
        typeof value === 'string' && value.startsWith('/') ? value : fail(`\`${name}\` must start with /`),
    }),
  },
  {
    hints: { max: '`limit` is the number of requests allowed' },
    check: ({ limit, windowMs }, fail) => {
      if (limit > windowMs) fail('`limit` must not exceed `windowMs`')
    },
  },
)

describe('declareOptions', () => {
  test('reads frozen settings with the defaults applied, typed from the declaration', () => {
    const options: OptionsOf<typeof DEMO> = { limit: 10 }
    const settings = DEMO.read(options)
    assert.deepEqual(
      { ...settings },
      {
        limit: 10,
        windowMs: 1000,
        share: undefined,
        name: 'demo',
        strict: false,
        mode: 'open',
        keyOf: undefined,
        redis: undefined,
        path: undefined,
      },
    )
    assert.ok(Object.isFrozen(settings))
  })

  test('each kind refuses a wrong value with one message naming the owner, the option and the value', () => {
    const cases: Array<[object, string]> = [
      [{ limit: 0 }, '`limit` must be an integer of at least 1, got 0'],
      [{ limit: 1, windowMs: 1.5 }, '`windowMs` must be an integer from 1 to 60000, got 1.5'],
      [{ limit: 1, share: 2 }, '`share` must be a number from 0 to 1, got 2'],
      [{ limit: 1, name: 3 }, '`name` must be a string, got 3'],
      [{ limit: 1, strict: 'yes' }, "`strict` must be true or false, got a string ('yes')"],
      [{ limit: 1, mode: 'retry' }, "`mode` must be 'open', 'closed' or 'local', got a string ('retry')"],
      [
        { limit: 1, keyOf: 'ip' },
        "`keyOf` must be a function of the request returning a key, got a string ('ip')",
      ],
      [{ limit: 1, path: 'x' }, '`path` must start with /'],
      [{}, '`limit` is required'],
      [{ limit: 5000 }, '`limit` must not exceed `windowMs`'],
    ]
    for (const [options, message] of cases)
      assert.throws(() => DEMO.read(options), new InvalidOptionError(`demo plugin: ${message}`))
    assert.throws(() => DEMO.read('x'), {
      message: "demo plugin: options must be an object, got a string ('x')",
    })
    assert.throws(() => DEMO.read({ limit: 1, redis: 'redis://x' }), RedisClientError)
  })

  test('an unknown key is refused with the hint, or a did-you-mean, and the valid keys; nested objects are named', () => {
    assert.throws(() => DEMO.read({ limit: 1, max: 3 }), {
      name: 'UnknownOptionError',
      message:
        /^demo plugin: unknown option `max`\. `limit` is the number of requests allowed\. Valid options: limit, /,
    })
    assert.throws(
      () => DEMO.read({ limit: 1, windowMS: 3 }, 'route GET /x: config.demo'),
      (err) => {
        assert.ok(err instanceof UnknownOptionError)
        assert.match(
          err.message,
          /^demo plugin: route GET \/x: config\.demo: unknown option `windowMS`\. Did you mean `windowMs`\?/,
        )
        return true
      },
    )
    assert.throws(() => DEMO.read({ limit: 0 }, 'route GET /x: config.demo'), {
      message: 'demo plugin: route GET /x: config.demo: `limit` must be an integer of at least 1, got 0',
    })
  })

  test('the docs rows come from the declaration', () => {
    const rows = DEMO.docsRows()
    assert.deepEqual(rows[0], {
      name: 'limit',
      type: 'integer of at least 1',
      default: 'required',
      description: 'requests allowed',
    })
    assert.deepEqual(rows[1], {
      name: 'windowMs',
      type: 'integer from 1 to 60000',
      default: '1 000',
      description: 'window length',
    })
    assert.deepEqual(
      rows.find((row) => row.name === 'mode'),
      { name: 'mode', type: "'open' | 'closed' | 'local'", default: "`'open'`", description: 'on an outage' },
    )
  })
})

/** A plugin on the skeleton: one context, one counter, counting each request. */
const counting = fp(
  async (app: FastifyInstance) => {
    const context = pluginContext(app, 'demo', {
      metrics: () => ({
        requests: new Counter({ name: 'demo_requests_total', help: 'Requests seen', registers: [] }),
      }),
    })
    app.decorate('demoContext', context)
    app.addHook('onRequest', async () => context.metrics.requests.inc())
  },
  { name: 'demo' },
)

describe('pluginContext', () => {
  for (const order of ['metrics first', 'metrics last'] as const) {
    test(`the metrics plugin exports a plugin's instruments, registered in either order (${order})`, async (t) => {
      const app = Fastify()
      t.after(() => app.close())
      if (order === 'metrics first') await app.register(metrics, { processMetrics: false })
      await app.register(counting)
      if (order === 'metrics last') await app.register(metrics, { processMetrics: false })
      await app.ready()
      await app.inject('/nothing-here')
      const text = (await app.inject('/metrics')).body
      assert.match(text, /^demo_requests_total 2$/m)
    })
  }

  test('the context is frozen, logs under the plugin name and asks the session principal once ready', async (t) => {
    const app = Fastify({ logger: { level: 'silent' } })
    t.after(() => app.close())
    await app.register(counting)
    // Registered after the plugin: the context's principal still finds it.
    app.decorate('sessionPrincipal', () => 'alice')
    await app.ready()
    const context = (app as unknown as { demoContext: ReturnType<typeof pluginContext> }).demoContext
    assert.ok(Object.isFrozen(context))
    assert.equal(context.name, 'demo')
    assert.equal(context.principal({} as FastifyRequest), 'alice')
    assert.deepEqual((context.log as unknown as { bindings(): object }).bindings(), { plugin: 'demo' })
  })
})
