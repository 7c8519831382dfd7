import assert from 'node:assert/strict'
import { type AddressInfo, createServer, type Socket } from 'node:net'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance } from 'fastify'
import { startRedisServer } from '../../../src/embedded/redis-server.ts'
import {
  GatewayError,
  InvalidOptionError,
  RateLimitArgumentError,
  RateLimitError,
  RateLimitNoPolicyError,
  RateLimitPolicyConflictError,
  RateLimitUnknownPolicyError,
  RouteNotProtectedError,
  UnknownOptionError,
} from '../../../src/index.ts'
import rateLimit, {
  type Algorithm,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
} from '../../../src/plugins/rate-limit/index.ts'
import { identityTag } from '../../../src/plugins/rate-limit/keys.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { deleteKeys, scanKeys, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'
import { loggedApp } from './fixtures.ts'

let redis: RedisClient

before(async () => {
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})

after(() => redis.disconnect())

/** Closes the app and removes the keys of its prefix once the test is over. */
function cleanUp(t: { after(fn: () => Promise<void>): void }, app: FastifyInstance, prefix?: string) {
  t.after(async () => {
    await app.close()
    if (prefix) await deleteKeys(redis, prefix)
  })
}

const fixed = (name: string, limit = 2): RateLimitPolicy => ({
  name,
  algorithm: 'fixed-window',
  limit,
  windowMs: 60_000,
})

const statuses = async (app: FastifyInstance, url: string, n: number) => {
  const out = []
  for (let i = 0; i < n; i++) out.push((await app.inject(url)).statusCode)
  return out
}

/** The key of a policy for a client on 127.0.0.1 (what `inject` sends from). */
const keyOf = (prefix: string, name: string, algorithm: Algorithm) =>
  `${prefix}{${identityTag('ip:127.0.0.1')}}:${name}:${algorithm}`

async function registerFails(options: RateLimitPluginOptions) {
  const app = Fastify()
  try {
    await app.register(rateLimit, { redis, ...options })
    await app.ready()
  } catch (err) {
    return err as Error & { code?: string }
  } finally {
    await app.close()
  }
  assert.fail('the boot should have failed')
}

describe('strict options: an unknown key fails the boot, naming what to write instead', () => {
  test("@fastify/rate-limit's `max` and `timeWindow` at registration: FRG_UNKNOWN_OPTION naming `limit`", async () => {
    const app = Fastify()
    await assert.rejects(
      async () => {
        await app.register(rateLimit, { redis, max: 3, timeWindow: '1 minute' } as never)
      },
      (err: UnknownOptionError) => {
        assert.ok(err instanceof UnknownOptionError, 'err is an UnknownOptionError')
        assert.ok(err instanceof InvalidOptionError, 'err is an InvalidOptionError')
        assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
        assert.equal(err.option, 'max')
        assert.ok(err.validOptions.includes('policies'), 'the valid options are listed')
        assert.match(err.message, /unknown option `max`/)
        assert.match(err.message, /`limit`/)
        assert.match(err.message, /Migrating from @fastify\/rate-limit/)
        return true
      },
    )
    await app.close()
  })

  test('each @fastify/rate-limit name at plugin level says what it is here', async () => {
    const cases: Array<[string, RegExp]> = [
      ['timeWindow', /`windowMs`/],
      ['keyGenerator', /`key`/],
      ['skipOnError', /onRedisError: 'open'/],
      ['nameSpace', /`keyPrefix`/],
      ['errorResponseBuilder', /`errorResponse/],
      ['enableDraftSpec', /`legacyHeaders: true`/],
      ['addHeaders', /`legacyHeaders: true`/],
      ['ban', /`ban: \{ after: N, onBanReach/],
      ['continueExceeding', /per fixed-window policy/],
      ['exponentialBackoff', /per fixed-window policy/],
      ['onBanReach', /`ban: \{ after: N, onBanReach \}`/],
      ['global', /`namedPolicies`/],
      ['hook', /per policy/],
      ['groupId', /`name`/],
      ['cache', /`memoryMaxKeys`/],
    ]
    for (const [option, hint] of cases) {
      const err = await registerFails({ policies: [fixed('ip')], [option]: 1 } as never)
      assert.ok(err instanceof UnknownOptionError, option)
      assert.match(err.message, new RegExp(`unknown option \`${option}\``), option)
      assert.match(err.message, hint, option)
    }
  })

  test('a misspelt policy option fails with "did you mean", wherever the policy is written', async () => {
    const typo = { name: 'p', algoritm: 'gcra', limit: 2, windowMs: 1000 } as never
    for (const options of [{ policies: [typo] }, { namedPolicies: [typo] }]) {
      const err = await registerFails(options)
      assert.ok(err instanceof UnknownOptionError, 'err is an UnknownOptionError')
      assert.equal(err.option, 'algoritm')
      assert.match(err.message, /policy 'p': unknown option `algoritm`\. Did you mean `algorithm`\?/)
      assert.ok(err.validOptions.includes('windowMs'), 'the valid options are listed')
    }
    const inDefaults = await registerFails({
      policies: [fixed('ip')],
      defaults: { onRedisErorr: 'closed' } as never,
    })
    assert.ok(inDefaults instanceof UnknownOptionError, 'inDefaults is an UnknownOptionError')
    assert.match(
      inDefaults.message,
      /defaults: unknown option `onRedisErorr`\. Did you mean `onRedisError`\?/,
    )
    const inPolicy = await registerFails({ policies: [{ ...fixed('ip'), max: 3 } as never] })
    assert.match(inPolicy.message, /@fastify\/rate-limit's `max` is a policy's `limit`/)
    const pluginOption = await registerFails({ policies: [{ ...fixed('ip'), keyPrefix: 'x:' } as never] })
    assert.match(pluginOption.message, /`keyPrefix` is an option of the plugin, not of a policy/)
  })

  test('an inline policy in a route config is checked too, naming the route', async (t) => {
    const app = Fastify()
    cleanUp(t, app)
    await app.register(rateLimit, { redis, policies: [fixed('ip')] })
    assert.throws(
      () =>
        app.get(
          '/x',
          { config: { rateLimits: { ...fixed('inline'), timeWindow: 1000 } as never } },
          async () => 'ok',
        ),
      (err: UnknownOptionError) => {
        assert.ok(err instanceof UnknownOptionError, 'err is an UnknownOptionError')
        assert.match(
          err.message,
          /^rate-limit plugin: route GET \/x: config\.rateLimits: policy 'inline': unknown option `timeWindow`\. @fastify\/rate-limit's `timeWindow` is a policy's `windowMs`/,
        )
        return true
      },
    )
    assert.throws(() => app.get('/y', { config: { rateLimits: 42 as never } }, async () => 'ok'), {
      code: 'FRG_INVALID_OPTION',
      message:
        'rate-limit plugin: route GET /y: config.rateLimits: each entry must be a policy or the name of one of `namedPolicies`, got a number (false, alone, turns every policy off)',
    })
  })

  test("a route's `config.rateLimit` (@fastify/rate-limit's, singular) fails the boot when that plugin is absent", async () => {
    const app = Fastify()
    await app.register(rateLimit, { redis, policies: [fixed('ip')] })
    app.get('/x', { config: { rateLimit: { max: 3 } } as never }, async () => 'ok')
    await assert.rejects(
      async () => {
        await app.ready()
      },
      (err: UnknownOptionError) => {
        assert.ok(err instanceof UnknownOptionError, 'err is an UnknownOptionError')
        assert.match(err.message, /route GET \/x: config: unknown option `rateLimit`/)
        assert.match(err.message, /`config\.rateLimits` \(plural\)/)
        return true
      },
    )
    await app.close()
  })

  test('a wrong value is an InvalidOptionError (FRG_INVALID_OPTION)', async () => {
    for (const options of [
      { store: 'disk' as never },
      { policies: [{ ...fixed('ip'), limit: 0 }] },
      { connectTimeoutMs: -1 },
      { policies: [fixed('ip')], allowList: 'everyone' as never },
    ]) {
      const err = await registerFails(options)
      assert.ok(err instanceof InvalidOptionError, 'err is an InvalidOptionError')
      assert.equal(err.code, 'FRG_INVALID_OPTION')
      assert.match(err.message, /^rate-limit plugin: /)
    }
  })
})

describe('a plugin with no policy at all fails the boot', () => {
  test('no policies, no namedPolicies, no route policy: FRG_RATE_LIMIT_NO_POLICY at ready()', async () => {
    const app = Fastify()
    await app.register(rateLimit, { redis })
    app.get('/x', async () => 'ok')
    app.get('/off', { config: { rateLimits: false } }, async () => 'ok')
    await assert.rejects(
      async () => {
        await app.ready()
      },
      (err: RateLimitNoPolicyError) => {
        assert.ok(err instanceof RateLimitNoPolicyError, 'err is a RateLimitNoPolicyError')
        assert.ok(err instanceof GatewayError, 'err is a GatewayError')
        assert.equal(err.code, 'FRG_RATE_LIMIT_NO_POLICY')
        assert.match(err.message, /limits nothing/)
        return true
      },
    )
    await app.close()
  })

  test('a route policy alone, or namedPolicies used only through app.rateLimiter, is enough', async (t) => {
    const inline = Fastify()
    cleanUp(t, inline)
    await inline.register(rateLimit, { store: 'memory', keyPrefix: uniquePrefix('rlb') })
    inline.get('/x', { config: { rateLimits: fixed('inline') } }, async () => 'ok')
    await inline.ready()
    assert.deepEqual(await statuses(inline, '/x', 3), [200, 200, 429])

    const programmatic = Fastify()
    cleanUp(t, programmatic)
    await programmatic.register(rateLimit, {
      store: 'memory',
      keyPrefix: uniquePrefix('rlb'),
      namedPolicies: [fixed('jobs', 1)],
    })
    await programmatic.ready()
    assert.equal((await programmatic.rateLimiter.consume('jobs', 'job:1')).allowed, true)
    assert.equal((await programmatic.rateLimiter.consume('jobs', 'job:1')).allowed, false)
  })
})

describe('route coverage: a route naming a policy the plugin never sees fails at ready()', () => {
  const login = fixed('login')

  test('declared after the plugin: limited; declared before it: FRG_ROUTE_NOT_PROTECTED', async (t) => {
    const prefix = uniquePrefix('rlb')
    const after = Fastify()
    cleanUp(t, after, prefix)
    await after.register(rateLimit, { redis, keyPrefix: prefix, namedPolicies: [login] })
    after.get('/x', { config: { rateLimits: 'login' } }, async () => 'ok')
    await after.ready()
    assert.deepEqual(await statuses(after, '/x', 3), [200, 200, 429])

    const before = Fastify()
    before.get('/x', { config: { rateLimits: 'login' } }, async () => 'ok')
    await before.register(rateLimit, { redis, keyPrefix: prefix, namedPolicies: [login] })
    await assert.rejects(
      async () => {
        await before.ready()
      },
      (err: RouteNotProtectedError) => {
        assert.ok(err instanceof RouteNotProtectedError, 'err is a RouteNotProtectedError')
        assert.equal(err.code, 'FRG_ROUTE_NOT_PROTECTED')
        assert.equal(err.url, '/x')
        return true
      },
    )
    await before.close()
  })

  test('a route in a sibling context of the plugin: FRG_ROUTE_NOT_PROTECTED', async () => {
    const app = Fastify()
    await app.register(async (scope) => {
      await scope.register(rateLimit, { redis, keyPrefix: uniquePrefix('rlb'), namedPolicies: [login] })
      scope.get('/covered', { config: { rateLimits: 'login' } }, async () => 'ok')
    })
    await app.register(async (sibling) => {
      sibling.get('/sibling', { config: { rateLimits: 'login' } }, async () => 'ok')
    })
    await assert.rejects(
      async () => {
        await app.ready()
      },
      { code: 'FRG_ROUTE_NOT_PROTECTED', url: '/sibling' },
    )
    await app.close()
  })
})

describe('policy identity: the algorithm is part of the key', () => {
  test('one name under three algorithms, one after the other on one prefix: each limits, none fails', async (t) => {
    const prefix = uniquePrefix('rlb')
    const algorithms: RateLimitPolicy[] = [
      { name: 'same-name', algorithm: 'fixed-window', limit: 2, windowMs: 60_000 },
      { name: 'same-name', algorithm: 'sliding-log', limit: 2, windowMs: 60_000 },
      { name: 'same-name', algorithm: 'token-bucket', limit: 2, refillPerSecond: 0.001 },
    ]
    for (const policy of algorithms) {
      const app = Fastify()
      cleanUp(t, app, prefix)
      await app.register(rateLimit, { redis, keyPrefix: prefix, policies: [{ ...policy, blockMs: 60_000 }] })
      app.get('/x', async () => 'ok')
      await app.ready()
      assert.deepEqual(await statuses(app, '/x', 3), [200, 200, 429], policy.algorithm)
      assert.ok(
        (await redis.pttl(`${keyOf(prefix, 'same-name', policy.algorithm)}:block`)) > 0,
        `${policy.algorithm}: the block key carries the algorithm`,
      )
      await app.rateLimiter.reset('same-name', 'ip:127.0.0.1')
      assert.equal((await app.inject('/x')).statusCode, 200, `${policy.algorithm}: reset clears its own keys`)
    }
    const names = (await scanKeys(redis, prefix)).map((key) => key.slice(key.indexOf('}:') + 2)).sort()
    assert.deepEqual(names, ['same-name:fixed-window', 'same-name:sliding-log', 'same-name:token-bucket'])
  })
})

describe('a script error follows the policy’s failure mode, logged once', () => {
  test('a key of another type: open lets through, closed answers 503, local limits in process; one error line per policy', async (t) => {
    const prefix = uniquePrefix('rlb')
    const modes = ['open', 'closed', 'local'] as const
    for (const mode of modes) {
      const key = keyOf(prefix, `broken-${mode}`, 'fixed-window')
      await redis.hset(key, 'x', '1')
      await redis.pexpire(key, 60_000)
    }
    const { app, logs } = loggedApp()
    cleanUp(t, app, prefix)
    await app.register(rateLimit, { redis, keyPrefix: prefix, policies: [] })
    for (const mode of modes)
      app.get(
        `/${mode}`,
        { config: { rateLimits: { ...fixed(`broken-${mode}`), onRedisError: mode } } },
        () => 'ok',
      )
    app.get('/healthy', { config: { rateLimits: fixed('healthy', 5) } }, () => 'ok')
    await app.ready()

    assert.deepEqual(await statuses(app, '/open', 3), [200, 200, 200])
    assert.deepEqual(await statuses(app, '/closed', 3), [503, 503, 503])
    assert.deepEqual(await statuses(app, '/local', 3), [200, 200, 429])
    const healthy = await app.inject('/healthy')
    assert.match(String(healthy.headers.ratelimit), /^"healthy";r=4;t=\d+$/, 'other policies still use Redis')
    const consumed = await app.rateLimiter.consume('broken-open', 'ip:127.0.0.1')
    assert.deepEqual([consumed.allowed, consumed.degraded], [true, true])

    for (const mode of modes) {
      const lines = logs.filter((l) => l.policy === `broken-${mode}`)
      assert.equal(lines.length, 1, `${mode}: one log line, not one per request`)
      assert.equal(lines[0]!.level, 50)
      assert.match(String(lines[0]!.msg), new RegExp(`policy 'broken-${mode}' on ${prefix}\\{`))
      assert.match(String(lines[0]!.msg), /WRONGTYPE/)
      assert.match(String(lines[0]!.msg), /keyPrefix of its own/)
    }
  })
})

describe('every error the plugin throws has a code and a class', () => {
  test('a policy that cannot be applied: RateLimitError, FRG_RATE_LIMIT_NOT_CHECKED (and in the 500)', async (t) => {
    const app = Fastify()
    cleanUp(t, app)
    const throwing = {
      ...fixed('throwing'),
      key: () => {
        throw new Error('boom')
      },
    }
    await app.register(rateLimit, { redis, keyPrefix: uniquePrefix('rlb'), namedPolicies: [throwing] })
    app.get('/x', { config: { rateLimits: 'throwing' } }, async () => 'ok')
    await app.ready()
    const res = await app.inject('/x')
    assert.equal(res.statusCode, 500)
    assert.equal(res.json().code, 'FRG_RATE_LIMIT_NOT_CHECKED')
    await assert.rejects(app.rateLimiter.peek({} as never, 'throwing'), (err: RateLimitError) => {
      assert.ok(err instanceof RateLimitError, 'err is a RateLimitError')
      assert.ok(err instanceof GatewayError, 'err is a GatewayError')
      assert.equal(err.code, 'FRG_RATE_LIMIT_NOT_CHECKED')
      assert.deepEqual(err.policies, ['throwing'])
      return true
    })
  })

  test('unknown policy, conflicting policies, decorator arguments', async (t) => {
    const conflict = await registerFails({
      policies: [fixed('twice', 2)],
      namedPolicies: [fixed('twice', 3)],
    })
    assert.ok(conflict instanceof RateLimitPolicyConflictError, 'conflict is a RateLimitPolicyConflictError')
    assert.equal(conflict.code, 'FRG_RATE_LIMIT_POLICY_CONFLICT')
    assert.equal(conflict.policy, 'twice')

    const app = Fastify()
    cleanUp(t, app)
    await app.register(rateLimit, {
      store: 'memory',
      keyPrefix: uniquePrefix('rlb'),
      namedPolicies: [fixed('a')],
    })
    assert.throws(
      () => app.get('/x', { config: { rateLimits: 'b' } }, async () => 'ok'),
      (err: RateLimitUnknownPolicyError) => {
        assert.ok(err instanceof RateLimitUnknownPolicyError, 'err is a RateLimitUnknownPolicyError')
        assert.equal(err.code, 'FRG_RATE_LIMIT_UNKNOWN_POLICY')
        assert.equal(err.policy, 'b')
        assert.match(err.message, /\(namedPolicies: a\)/)
        return true
      },
    )
    await app.ready()
    await assert.rejects(app.rateLimiter.reset('b', 'ip:1'), { code: 'FRG_RATE_LIMIT_UNKNOWN_POLICY' })
    await assert.rejects(app.rateLimiter.consume('a', 'ip:1', -1), (err: RateLimitArgumentError) => {
      assert.ok(err instanceof RateLimitArgumentError, 'err is a RateLimitArgumentError')
      assert.ok(err instanceof TypeError, 'err is a TypeError')
      assert.equal(err.code, 'FRG_INVALID_OPTION')
      return true
    })
  })
})

describe('boot: connectTimeoutMs and the Redis server check', () => {
  test('an allkeys-* eviction policy is warned about once; the plugin works', async (t) => {
    const server = await startRedisServer(undefined, 'redis-server', ['--maxmemory-policy', 'allkeys-lru'])
    t.after(() => server.stop())
    const client = createRedisClient({ url: server.url })
    t.after(() => client.disconnect())
    await connectRedis(client)
    const { app, logs } = loggedApp()
    t.after(() => app.close())
    await app.register(rateLimit, { redis: client, policies: [fixed('ip')] })
    app.get('/x', async () => 'ok')
    await app.ready()
    const warnings = logs.filter((l) => l.level === 40 && /maxmemory-policy allkeys-lru/.test(String(l.msg)))
    assert.equal(warnings.length, 1)
    assert.match(String(warnings[0]!.msg), /^rate-limit plugin: /)
    assert.deepEqual(await statuses(app, '/x', 3), [200, 200, 429])
  })

  test('connectTimeoutMs bounds the wait for a Redis that does not answer; the boot goes on', async (t) => {
    // Accepts connections and never answers: the client is never ready.
    const sockets = new Set<Socket>()
    const silent = createServer((socket) => sockets.add(socket))
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    t.after(async () => {
      for (const socket of sockets) socket.destroy()
      await new Promise((resolve) => silent.close(resolve))
    })
    const client = createRedisClient({ url: `redis://127.0.0.1:${(silent.address() as AddressInfo).port}` })
    t.after(() => client.disconnect())
    const { app, logs } = loggedApp()
    t.after(() => app.close())
    await app.register(rateLimit, {
      redis: client,
      connectTimeoutMs: 150,
      policies: [{ ...fixed('ip'), onRedisError: 'closed' }],
    })
    app.get('/x', async () => 'ok')
    await app.ready()
    assert.ok(
      logs.some((l) => l.level === 40 && /not ready within 150 ms/.test(String(l.msg))),
      'the boot wait gave up after connectTimeoutMs',
    )
    assert.equal((await app.inject('/x')).statusCode, 503, 'the policy decides while Redis is away')
  })
})
