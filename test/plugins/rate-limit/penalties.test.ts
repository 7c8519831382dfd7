import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { memoryStoreOf } from '../../../src/plugins/rate-limit/engine.ts'
import rateLimit, {
  type Decision,
  type RateLimitPluginOptions,
  type RateLimitPolicy,
} from '../../../src/plugins/rate-limit/index.ts'
import { identityTag } from '../../../src/plugins/rate-limit/keys.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { keysWithoutTtl, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

// ban, exponentialBackoff and continueExceeding of the fixed window, and async limit and key
// functions: on Redis and on the memory store, with the same outcomes.

let redis: RedisClient
const prefixes: string[] = []
const apps: FastifyInstance[] = []

// Commands are counted as test/round-trips.test.ts counts them: on the prototype, patched before the
// client exists (a client keeps the sendCommand it was created with), recording only when asked.
type SendCommand = (this: Redis, command: { name: string }, stream?: unknown) => unknown
const original = Redis.prototype.sendCommand as unknown as SendCommand
let recorded: string[] | null = null

before(async () => {
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, stream) {
    recorded?.push(command.name)
    return original.call(this, command, stream)
  }
  redis = createRedisClient(testRedisConnection())
  await connectRedis(redis)
})

after(async () => {
  for (const app of apps) await app.close()
  for (const prefix of prefixes) {
    assert.deepEqual(
      await keysWithoutTtl(redis, prefix, { remove: true }),
      [],
      'every rate-limit key carries a TTL',
    )
  }
  redis.disconnect()
  ;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = original
})

type Store = 'redis' | 'memory'

async function build(store: Store, policy: RateLimitPolicy, options: RateLimitPluginOptions = {}) {
  const app = Fastify()
  const prefix = uniquePrefix('rlp')
  prefixes.push(prefix)
  await app.register(rateLimit, {
    ...(store === 'redis' ? { redis } : { store: 'memory' }),
    keyPrefix: prefix,
    ...options,
  })
  app.get('/', { config: { rateLimits: policy } }, async () => ({ ok: true }))
  await app.ready()
  apps.push(app)
  return { app, prefix }
}

const counterKey = (prefix: string, identity: string, name: string) =>
  `${prefix}{${identityTag(identity)}}:${name}:fixed-window`

/** The key's TTL in ms, -2 when missing: PTTL on Redis, the entry's expiry in the memory store. */
async function ttlOf(store: Store, prefix: string, key: string): Promise<number> {
  if (store === 'redis') return redis.pttl(key)
  const entry = memoryStoreOf(prefix)?.inspect(key)
  return entry ? entry.exp - Date.now() : -2
}

async function shortenTtl(store: Store, prefix: string, key: string, ms: number) {
  if (store === 'redis') await redis.pexpire(key, ms)
  else (memoryStoreOf(prefix)!.inspect(key) as { exp: number }).exp = Date.now() + ms
}

const user = () => 'user:penalised'

for (const store of ['redis', 'memory'] as const) {
  describe(`penalties on the ${store} store`, () => {
    test('ban: after N rejections every request gets 403 until the window ends; onBanReach fires once', async () => {
      const reached: string[] = []
      const seen: boolean[] = []
      const { app, prefix } = await build(store, {
        name: 'banned',
        algorithm: 'fixed-window',
        limit: 2,
        windowMs: '1 minute',
        key: user,
        ban: { after: 2, onBanReach: (_request, key) => void reached.push(key) },
        onExceeded: (_request, decision: Decision) => void seen.push(decision.isBanned),
      })
      const responses = []
      for (let i = 0; i < 7; i++) responses.push(await app.inject('/'))
      assert.deepEqual(
        responses.map((r) => r.statusCode),
        [200, 200, 429, 429, 403, 403, 403],
      )
      assert.deepEqual(reached, ['user:penalised'], 'the hook fires once per ban, with the key')
      assert.deepEqual(seen, [false, false, true, true, true], 'onExceeded sees isBanned')
      const banned = responses[4]!
      assert.equal(banned.json().type, '/problems/rate-limit-banned')
      assert.equal(banned.json().code, 'FRG_RATE_LIMIT_BANNED')
      assert.equal(banned.json().policy, 'banned')
      const retry = Number(banned.headers['retry-after'])
      assert.ok(retry > 0 && retry <= 60, `retry-after ${retry}`)
      assert.match(String(banned.headers.ratelimit), /^"banned";r=0;t=\d+$/)
      assert.equal(banned.headers['ratelimit-policy'], '"banned";q=2;w=60')
      const key = counterKey(prefix, 'user:penalised', 'banned')
      const ttl = await ttlOf(store, prefix, `${key}:rejections`)
      assert.ok(ttl > 0 && ttl <= 60_000, 'the rejections expire with the window')
    })

    test('ban: { after: 0 } answers 403 from the first rejection; errorResponse gets isBanned and keeps the 403', async () => {
      let reached = 0
      const { app } = await build(store, {
        name: 'strict',
        algorithm: 'fixed-window',
        limit: 1,
        windowMs: 60_000,
        key: user,
        ban: { after: 0, onBanReach: () => void reached++ },
        errorResponse: (_request, decision) => ({ banned: decision.isBanned }),
      })
      assert.equal((await app.inject('/')).statusCode, 200)
      const first = await app.inject('/')
      assert.equal(first.statusCode, 403)
      assert.deepEqual(first.json(), { banned: true })
      assert.equal((await app.inject('/')).statusCode, 403)
      assert.equal(reached, 1)
    })

    test('exponentialBackoff: the k-th rejection sets the window to windowMs * 2^(k-1)', async () => {
      const { app, prefix } = await build(store, {
        name: 'backoff',
        algorithm: 'fixed-window',
        limit: 1,
        windowMs: 10_000,
        key: user,
        exponentialBackoff: true,
      })
      const key = counterKey(prefix, 'user:penalised', 'backoff')
      assert.equal((await app.inject('/')).statusCode, 200)
      for (const expected of [10_000, 20_000, 40_000, 80_000]) {
        const res = await app.inject('/')
        assert.equal(res.statusCode, 429)
        const ttl = await ttlOf(store, prefix, key)
        // The TTL was just set to `expected`; it can only have run down since.
        assert.ok(ttl <= expected && ttl > expected - 5_000, `ttl ${ttl}, expected ${expected}`)
        assert.equal(Number(res.headers['retry-after']), Math.ceil(expected / 1000))
      }
    })

    test('continueExceeding: every rejected request restarts the window', async () => {
      const { app, prefix } = await build(store, {
        name: 'continue',
        algorithm: 'fixed-window',
        limit: 1,
        windowMs: 60_000,
        key: user,
        continueExceeding: true,
      })
      const key = counterKey(prefix, 'user:penalised', 'continue')
      assert.equal((await app.inject('/')).statusCode, 200)
      for (let i = 0; i < 3; i++) {
        // As if most of the window had passed: a rejection puts it back to a full window.
        await shortenTtl(store, prefix, key, 2_000)
        assert.equal((await app.inject('/')).statusCode, 429)
        const ttl = await ttlOf(store, prefix, key)
        assert.ok(ttl > 55_000 && ttl <= 60_000, `ttl ${ttl}`)
      }
      // An admitted request does not touch the window: still limited until it ends.
      await shortenTtl(store, prefix, key, 2_000)
      const ttl = await ttlOf(store, prefix, key)
      assert.ok(ttl <= 2_000)
    })

    test('a sibling rejection is not counted against a policy with penalties', async () => {
      let reached = 0
      const app = Fastify()
      const prefix = uniquePrefix('rlp')
      prefixes.push(prefix)
      await app.register(rateLimit, {
        ...(store === 'redis' ? { redis } : { store: 'memory' }),
        keyPrefix: prefix,
        policies: [
          { name: 'tight', algorithm: 'fixed-window', limit: 1, windowMs: 60_000, key: user },
          {
            name: 'loose',
            algorithm: 'fixed-window',
            limit: 100,
            windowMs: 60_000,
            key: user,
            ban: { after: 0, onBanReach: () => void reached++ },
          },
        ],
      })
      app.get('/', async () => ({ ok: true }))
      await app.ready()
      apps.push(app)
      const statuses = []
      for (let i = 0; i < 4; i++) statuses.push((await app.inject('/')).statusCode)
      assert.deepEqual(statuses, [200, 429, 429, 429])
      assert.equal(reached, 0)
    })

    test('async limit and key functions resolve before the store call', async () => {
      const { app } = await build(store, {
        name: 'async',
        algorithm: 'fixed-window',
        windowMs: 60_000,
        limit: async (request: FastifyRequest) => (request.headers['x-plan'] === 'pro' ? 3 : 1),
        key: async (request: FastifyRequest) => {
          await new Promise((resolve) => setImmediate(resolve))
          const who = request.headers['x-user']
          return typeof who === 'string' ? `user:${who}` : null
        },
      })
      const statuses = async (headers: Record<string, string>, n: number) => {
        const out = []
        for (let i = 0; i < n; i++) out.push((await app.inject({ url: '/', headers })).statusCode)
        return out
      }
      assert.deepEqual(await statuses({ 'x-user': 'free' }, 2), [200, 429])
      assert.deepEqual(await statuses({ 'x-user': 'pro', 'x-plan': 'pro' }, 4), [200, 200, 200, 429])
      assert.deepEqual(await statuses({}, 3), [200, 200, 200], 'a key resolving to null skips the policy')
    })

    test('an async key function that rejects answers 500 for that request', async () => {
      const { app } = await build(store, {
        name: 'failing',
        algorithm: 'fixed-window',
        windowMs: 60_000,
        limit: 1,
        key: async () => {
          throw new Error('directory down')
        },
      })
      const res = await app.inject('/')
      assert.equal(res.statusCode, 500)
      assert.equal(res.json().code, 'FRG_RATE_LIMIT_NOT_CHECKED')
    })
  })
}

test('async policies of a request are resolved together and still make one script call', async () => {
  const commands: string[] = []
  let resolving = 0
  let together = 0
  const slow = async <T>(value: T): Promise<T> => {
    resolving++
    together = Math.max(together, resolving)
    await new Promise((resolve) => setImmediate(resolve))
    resolving--
    return value
  }
  const prefix = uniquePrefix('rlp')
  prefixes.push(prefix)
  const app = Fastify()
  await app.register(rateLimit, {
    redis,
    keyPrefix: prefix,
    policies: [
      {
        name: 'minute',
        algorithm: 'fixed-window',
        windowMs: 60_000,
        limit: () => slow(10),
        key: () => slow('user:one-trip'),
        ban: { after: 1 },
      },
      {
        name: 'hour',
        algorithm: 'fixed-window',
        windowMs: 3_600_000,
        limit: () => slow(100),
        key: () => slow('user:one-trip'),
        exponentialBackoff: true,
      },
    ],
  })
  app.get('/', async () => ({ ok: true }))
  await app.ready()
  apps.push(app)
  await app.inject('/') // the script is loaded on the server (EVALSHA from now on)
  recorded = commands
  try {
    const res = await app.inject('/')
    assert.equal(res.statusCode, 200)
  } finally {
    recorded = null
  }
  assert.deepEqual(commands, ['evalsha'], 'one script call for both policies')
  assert.equal(together, 4, 'the four functions were awaited together')
})

describe('boot checks of the new options', () => {
  const fails = async (policy: Record<string, unknown>) => {
    const app = Fastify()
    try {
      await app.register(rateLimit, {
        store: 'memory',
        policies: [{ name: 'p', algorithm: 'fixed-window', limit: 2, windowMs: 1000, ...policy } as never],
      })
      await app.ready()
    } catch (err) {
      return err as Error & { code?: string }
    } finally {
      await app.close()
    }
    assert.fail('the boot should have failed')
  }

  test('bad values and unknown keys are refused with coded errors', async () => {
    const cases: Array<[Record<string, unknown>, string, RegExp]> = [
      [{ ban: 3 }, 'FRG_INVALID_OPTION', /`ban: \{ after: 3 \}` here/],
      [{ ban: { after: -1 } }, 'FRG_INVALID_OPTION', /`ban.after` must be a whole number/],
      [{ ban: { after: 1.5 } }, 'FRG_INVALID_OPTION', /`ban.after`/],
      [{ ban: { after: 1, onBanReach: 'x' } }, 'FRG_INVALID_OPTION', /`ban.onBanReach` must be a function/],
      [{ ban: { after: 1, onBanReached: () => {} } }, 'FRG_UNKNOWN_OPTION', /Did you mean `onBanReach`/],
      [{ exponentialBackoff: 'yes' }, 'FRG_INVALID_OPTION', /`exponentialBackoff` must be a boolean/],
      [{ continueExceeding: 1 }, 'FRG_INVALID_OPTION', /`continueExceeding` must be a boolean/],
      [{ exponentialBackoff: true, continueExceeding: true }, 'FRG_INVALID_OPTION', /exclude each other/],
      [
        { algorithm: 'sliding-log', ban: { after: 1 } },
        'FRG_INVALID_OPTION',
        /`ban` applies to fixed-window only/,
      ],
      [
        { algorithm: 'gcra', continueExceeding: true },
        'FRG_INVALID_OPTION',
        /`continueExceeding` applies to fixed-window only/,
      ],
      [{ onBanReach: () => {} }, 'FRG_UNKNOWN_OPTION', /`ban: \{ after: N, onBanReach \}`/],
    ]
    for (const [policy, code, message] of cases) {
      const err = await fails(policy)
      assert.equal(err.code, code, JSON.stringify(Object.keys(policy)))
      assert.match(err.message, message)
    }
  })

  test('one name with different penalties is a conflict', async () => {
    const app = Fastify()
    const base = { name: 'same', algorithm: 'fixed-window', limit: 2, windowMs: 1000 } as const
    await app.register(rateLimit, { store: 'memory', namedPolicies: [{ ...base, ban: { after: 1 } }] })
    await assert.rejects(
      async () => {
        app.get('/', { config: { rateLimits: { ...base, ban: { after: 2 } } } }, async () => 'ok')
        await app.ready()
      },
      { code: 'FRG_RATE_LIMIT_POLICY_CONFLICT' },
    )
    await app.close()
  })
})
