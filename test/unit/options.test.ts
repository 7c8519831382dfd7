import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { InvalidOptionError, UnknownOptionError } from '../../src/plugins/common/errors.ts'
import { optionChecker, optionKeys } from '../../src/plugins/common/options.ts'
import { closest } from '../../src/plugins/common/spelling.ts'
import type { IdempotencyPluginOptions } from '../../src/plugins/idempotency/index.ts'
import { resolveOptions, resolveRouteConfig } from '../../src/plugins/idempotency/options.ts'
import type { RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'
import { keyBy } from '../../src/plugins/rate-limit/keys.ts'
import { checkDefaults } from '../../src/plugins/rate-limit/options.ts'
import { localShareOf, normalizePolicy, resolve, signature } from '../../src/plugins/rate-limit/policy.ts'
import type { SessionPluginOptions } from '../../src/plugins/session/index.ts'
import { SESSION_STORE_OPTIONS, validateOptions } from '../../src/plugins/session/options.ts'
import { checkedOptions } from '../../src/primitives/checks.ts'

// The option checking every plugin and primitive shares, and each plugin's checks of its own
// options, without a server or a Redis: what is refused, with which error and which message.

/** Runs `fn`, expects it to throw an error of `kind`, and returns that error for more checks. */
function thrown<E extends Error>(fn: () => unknown, kind: new (...args: never[]) => E): E {
  try {
    fn()
  } catch (err) {
    assert.ok(err instanceof kind, `expected a ${kind.name}, got ${String(err)}`)
    return err
  }
  assert.fail(`expected a ${kind.name}, nothing was thrown`)
}

/** Each case's value is refused with an InvalidOptionError whose message matches the case's. */
function refusesEach<V>(cases: Array<[V, RegExp]>, check: (value: V) => unknown): void {
  for (const [value, message] of cases)
    assert.throws(
      () => check(value),
      (err) => err instanceof InvalidOptionError && message.test(err.message),
      `${JSON.stringify(value)} should fail with ${message}`,
    )
}

const SECRET = 'a-secret-of-at-least-32-characters!!'

describe('optionChecker', () => {
  const check = optionChecker('demo plugin', { max: '`limit` is the number of requests allowed' })
  const known = ['algorithm', 'limit', 'windowMs']

  test('a close misspelling is an UnknownOptionError with a did-you-mean and the valid options', () => {
    const err = thrown(() => check.known({ limit: 1, algoritm: 'gcra' }, known), UnknownOptionError)
    assert.equal(err.code, 'FRG_UNKNOWN_OPTION')
    assert.equal(err.option, 'algoritm')
    assert.deepEqual(err.validOptions, known)
    assert.equal(
      err.message,
      'demo plugin: unknown option `algoritm`. Did you mean `algorithm`? Valid options: algorithm, limit, windowMs.',
    )
  })

  test('a name without its unit suggests the name with it, however short', () => {
    const err = thrown(() => check.known({ l1Ttl: 1 }, ['l1TtlMs', 'ttlMs']), UnknownOptionError)
    assert.match(err.message, /unknown option `l1Ttl`\. Did you mean `l1TtlMs`\?/)
    assert.match(
      thrown(() => check.known({ ttl: 1 }, ['l1TtlMs', 'ttlMs']), UnknownOptionError).message,
      /Did you mean `ttlMs`\?/,
    )
  })

  test('an unknown option is also an InvalidOptionError, so one catch covers both', () => {
    assert.ok(thrown(() => check.known({ windowMS: 1 }, known), InvalidOptionError))
  })

  test("another library's name gets its hint instead of a guess", () => {
    const err = thrown(() => check.known({ max: 10 }, known), UnknownOptionError)
    assert.match(err.message, /unknown option `max`\. `limit` is the number of requests allowed\./)
    assert.doesNotMatch(err.message, /Did you mean/)
  })

  test('a name far from every valid one gets no suggestion; `where` names the object inside', () => {
    const err = thrown(() => check.known({ colour: 'red' }, known, "policy 'ip'"), UnknownOptionError)
    assert.equal(
      err.message,
      "demo plugin: policy 'ip': unknown option `colour`. Valid options: algorithm, limit, windowMs.",
    )
  })

  test('known keys pass; a hint is looked up as an own key only', () => {
    check.known({ algorithm: 'gcra', limit: 1 }, known)
    const err = thrown(() => check.known({ toString: 1 }, known), UnknownOptionError)
    assert.equal(err.option, 'toString')
  })

  test('fail throws an InvalidOptionError prefixed with the owner', () => {
    const err = thrown(() => check.fail('`limit` must be positive'), InvalidOptionError)
    assert.equal(err.code, 'FRG_INVALID_OPTION')
    assert.equal(err.name, 'InvalidOptionError')
    assert.equal(err.message, 'demo plugin: `limit` must be positive')
  })
})

describe('closest', () => {
  test('ignores case and counts a swap of neighbours as one edit', () => {
    assert.equal(closest('WINDOWMS', ['limit', 'windowMs']), 'windowMs')
    assert.equal(closest('lmiit', ['limit', 'windowMs']), 'limit')
    assert.equal(closest('keyprefx', ['keyPrefix', 'redis']), 'keyPrefix')
  })

  test('allows about a third of the name in edits, at least one', () => {
    assert.equal(closest('ab', ['ac']), 'ac')
    assert.equal(closest('ab', ['cd']), undefined)
    assert.equal(closest('retentionMs', ['retention']), 'retention')
    assert.equal(closest('xyzMs', ['retentionMs']), undefined)
  })

  test('picks the nearest of several candidates', () => {
    assert.equal(closest('leaseM', ['leaseMs', 'lease']), 'leaseMs')
  })
})

test('optionKeys lists the keys it is given, in order', () => {
  assert.deepEqual(optionKeys<{ a: number; b?: string }>({ a: true, b: true }), ['a', 'b'])
})

test('checkedOptions refuses what is not a plain options object and unknown keys', () => {
  const check = optionChecker('lock')
  assert.throws(
    () => checkedOptions(check, null as unknown as object, ['ttlMs']),
    /^InvalidOptionError: lock: options must be an object, got null$/,
  )
  assert.throws(
    () => checkedOptions(check, [] as unknown as object, ['ttlMs'], 'acquire()'),
    /^InvalidOptionError: lock: acquire\(\) options must be an object, got an object \(Array\)$/,
  )
  assert.throws(() => checkedOptions(check, { tttlMs: 1 }, ['ttlMs']), /Did you mean `ttlMs`\?/)
  const options = { ttlMs: 5 }
  assert.equal(checkedOptions(check, options, ['ttlMs']), options)
})

describe('rate-limit policy options', () => {
  const policy = (extra: Record<string, unknown>) =>
    ({ name: 'api', algorithm: 'fixed-window', limit: 10, windowMs: '1 minute', ...extra }) as RateLimitPolicy

  test('a valid policy is normalised: durations in milliseconds, the header and the script arguments', () => {
    const normal = normalizePolicy(policy({}))
    assert.equal(normal.windowMs, 60_000)
    assert.equal(normal.windowSec, 60)
    assert.equal(normal.header, '"api";q=10;w=60')
    assert.deepEqual(normal.quota, { limit: 10, windowMs: 60_000, refillPerSecond: 0 })
    assert.equal(normal.cost, 1)
    assert.equal(normal.hook, 'onRequest')
    assert.equal(normal.onRedisError, 'open')
    assert.equal(normal.dynamic, false)
  })

  test('a token bucket gets its window from capacity and refill; a local share lowers the local quota', () => {
    const bucket = normalizePolicy({
      name: 'burst',
      algorithm: 'token-bucket',
      limit: 20,
      refillPerSecond: 2,
      onRedisError: 'local',
      localShare: 0.5,
    })
    assert.equal(bucket.windowMs, 10_000)
    assert.equal(bucket.header, '"burst";q=20;w=10')
    assert.deepEqual(bucket.quota, { limit: 20, windowMs: 0, refillPerSecond: 2 })
    const local = resolve(bucket, bucket.limit, bucket.windowMs, localShareOf(bucket, 4))
    assert.equal(local.header, '"burst";q=10;w=10')
    assert.deepEqual(local.quota, { limit: 10, windowMs: 0, refillPerSecond: 1 })
  })

  test("the local fallback's share: localShare when given, else 1 / the live instances for a buffered policy, else all", () => {
    const base = {
      name: 'ip',
      algorithm: 'fixed-window',
      limit: 100,
      windowMs: 1000,
      onRedisError: 'local',
    } as const
    assert.equal(localShareOf(normalizePolicy({ ...base, sync: true }), 4), 0.25)
    assert.equal(localShareOf(normalizePolicy({ ...base, sync: true, localShare: 0.5 }), 4), 0.5)
    assert.equal(localShareOf(normalizePolicy(base), 4), 1)
    const buffered = normalizePolicy({ ...base, sync: true })
    assert.equal(resolve(buffered, 100, 1000, localShareOf(buffered, 4)).header, '"ip";q=25;w=1')
  })

  test('an unknown key is refused with a did-you-mean naming the policy', () => {
    const err = thrown(() => normalizePolicy(policy({ algoritm: 'gcra' })), UnknownOptionError)
    assert.match(
      err.message,
      /^rate-limit plugin: policy 'api': unknown option `algoritm`\. Did you mean `algorithm`\?/,
    )
  })

  test("a plugin option written in a policy says where it belongs; @fastify/rate-limit's names are hinted", () => {
    assert.throws(
      () => normalizePolicy(policy({ namedPolicies: {} })),
      /`namedPolicies` is an option of the plugin/,
    )
    const err = thrown(() => normalizePolicy(policy({ max: 10 })), UnknownOptionError)
    assert.equal(err.option, 'max')
    assert.doesNotMatch(err.message, /Did you mean/)
  })

  test('wrong values are InvalidOptionErrors saying what is expected', () => {
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ name: 'has space' }, /`name` must be 1-64 characters/],
      [{ algorithm: 'leaky-bucket' }, /`algorithm` must be one of fixed-window/],
      [{ limit: 0 }, /`limit` must be a positive integer or a function/],
      [{ windowMs: '10 parsecs' }, /`windowMs`: '10 parsecs' is not a duration/],
      [{ windowMs: 0 }, /`windowMs` must be a positive whole number of milliseconds, a duration string/],
      [{ refillPerSecond: 1 }, /`refillPerSecond` applies to the token bucket only/],
      [{ cost: 11 }, /`cost` must be a positive integer no larger than `limit`/],
      [{ key: 42 }, /`key` must be 'ip' or a function/],
      [{ hook: 'onSend' }, /`hook` must be 'onRequest' or 'preHandler'/],
      [{ key: keyBy.customer }, /set hook: 'preHandler'/],
      [{ onRedisError: 'retry' }, /`onRedisError` must be 'open', 'closed' or 'local'/],
      [{ localShare: 0 }, /`localShare` must be in \(0, 1\]/],
      [{ maxDelayMs: 100 }, /`maxDelayMs` applies to token-bucket and gcra only/],
      [{ blockMs: 0 }, /`blockMs` must be a positive whole number/],
      [{ ban: 3 }, /`ban: 3` is `ban: \{ after: 3 \}` here/],
      [{ ban: { after: -1 } }, /`ban.after` must be a whole number of rejections/],
      [{ ban: { after: 1, onBanReach: 'log' } }, /`ban.onBanReach` must be a function/],
      [{ exponentialBackoff: 'yes' }, /`exponentialBackoff` must be a boolean/],
      [{ exponentialBackoff: true, continueExceeding: true }, /exclude each other/],
      [{ onExceeded: 'log' }, /`onExceeded` must be a function/],
      [{ allowList: '127.0.0.1' }, /`allowList` must be an array of IP strings or a function/],
    ]
    refusesEach(cases, (extra) => normalizePolicy(policy(extra)))
  })

  test('algorithm-specific rules: the token bucket takes no window, gcra caps its rate, penalties need a fixed window', () => {
    assert.throws(
      () => normalizePolicy({ name: 'b', algorithm: 'token-bucket', limit: 5, refillPerSecond: 0 }),
      /`refillPerSecond` must be a positive number/,
    )
    assert.throws(
      () =>
        normalizePolicy({
          name: 'b',
          algorithm: 'token-bucket',
          limit: 5,
          refillPerSecond: 1,
          windowMs: 1000,
        }),
      /`windowMs` does not apply to the token bucket/,
    )
    assert.throws(
      () => normalizePolicy({ name: 'g', algorithm: 'gcra', limit: 1001, windowMs: 10 }),
      /at most 100 per millisecond/,
    )
    assert.throws(
      () => normalizePolicy(policy({ algorithm: 'sliding-log', ban: { after: 2 } })),
      /`ban` applies to fixed-window only/,
    )
  })

  test('the route that wrote a policy is named, and a policy must be an object', () => {
    assert.throws(
      () => normalizePolicy(policy({ limit: -1 }), {}, undefined, 'route GET /x: '),
      /^InvalidOptionError: rate-limit plugin: route GET \/x: policy 'api': `limit`/,
    )
    assert.throws(() => normalizePolicy('api' as unknown as RateLimitPolicy), /a policy must be an object/)
  })

  test('defaults: checked like a policy without its name', () => {
    checkDefaults(undefined)
    checkDefaults({ algorithm: 'gcra', hook: 'preHandler' })
    assert.throws(() => checkDefaults({ name: 'x' }), /defaults: unknown option `name`/)
    assert.throws(() => checkDefaults([]), /`defaults` must be an object of policy options/)
  })

  test('signature: the same settings spelt differently are one policy, other settings another', () => {
    const base = signature(policy({}))
    assert.equal(signature(policy({ windowMs: 60_000, key: 'ip', cost: 1 })), base)
    assert.equal(signature(policy({ allowList: ['b', 'a'] })), signature(policy({ allowList: ['a', 'b'] })))
    assert.notEqual(signature(policy({ limit: 11 })), base)
    const key = () => 'k'
    assert.equal(signature(policy({ key })), signature(policy({ key })))
    assert.notEqual(signature(policy({ key })), signature(policy({ key: () => 'k' })))
    assert.equal(signature({ name: 'api' } as RateLimitPolicy, policy({})), base)
  })
})

describe('session plugin options', () => {
  const options = (extra: Record<string, unknown>) =>
    ({ secrets: [SECRET], ...extra }) as SessionPluginOptions

  test('defaults fill what is not given', () => {
    const valid = validateOptions(options({}))
    assert.equal(valid.cookieName, 'sid')
    assert.equal(valid.sameSite, 'lax')
    assert.equal(valid.secure, false)
    assert.equal(valid.path, '/')
    assert.equal(valid.idleTimeoutMs, 30 * 60_000)
    assert.equal(valid.absoluteTimeoutMs, 8 * 3_600_000)
    assert.equal(valid.maxIdleTimeoutMs, valid.idleTimeoutMs)
    assert.equal(valid.keyPrefix, 'sess:')
  })

  test("@fastify/session's names get a hint, a misspelling a did-you-mean", () => {
    assert.throws(() => validateOptions(options({ secret: SECRET })), /write `secrets: \[secret\]`/)
    assert.throws(() => validateOptions(options({ cookieNmae: 'x' })), /Did you mean `cookieName`\?/)
  })

  test('wrong values are refused with what is expected', () => {
    const cases: Array<[unknown, RegExp]> = [
      [null, /options are required/],
      [{ secrets: [] }, /`secrets` must be a non-empty array of strings/],
      [{ secrets: ['short'] }, /at least 32 characters/],
      [options({ idleTimeoutMs: 0 }), /`idleTimeoutMs` must be an integer of at least 1, got 0/],
      [
        options({ absoluteTimeoutMs: 1000, idleTimeoutMs: 2000 }),
        /`absoluteTimeoutMs` must be an integer no smaller/,
      ],
      [
        options({ maxIdleTimeoutMs: 1 }),
        /`maxIdleTimeoutMs` must be an integer no smaller than `idleTimeoutMs`/,
      ],
      [options({ maxAbsoluteTimeoutMs: 1 }), /`maxAbsoluteTimeoutMs` must be an integer/],
      [options({ touchAfterMs: 30 * 60_000 }), /`touchAfterMs` must be an integer from 0 to below/],
      [options({ secure: 'yes' }), /`secure` must be true, false or 'auto'/],
      [options({ sameSite: 'loose' }), /`sameSite` must be 'lax', 'strict' or 'none'/],
      [options({ sameSite: 'none' }), /requires `secure`/],
      [options({ partitioned: 1 }), /`partitioned` must be true or false, got 1/],
      [options({ partitioned: true }), /`partitioned` requires `secure`/],
      [options({ domain: 'bad domain' }), /`domain` must be a host name/],
      [options({ path: 'no-slash' }), /`path` must start with \//],
      [options({ saveUninitialized: 'no' }), /`saveUninitialized` must be true or false/],
      [options({ cookieName: 'a;b' }), /`cookieName` must be 1-32 letters/],
      [options({ keyPrefix: 1 }), /`keyPrefix` must be a string/],
      [options({ connectTimeoutMs: -1 }), /`connectTimeoutMs` must be an integer of at least 0, got -1/],
    ]
    refusesEach(cases, (value) => validateOptions(value as SessionPluginOptions))
  })

  test('a store of its own reads the same timeouts by the same rules, and its clock', () => {
    const defaults = SESSION_STORE_OPTIONS.read({})
    assert.equal(defaults.keyPrefix, 'sess:')
    assert.equal(defaults.idleTimeoutMs, 30 * 60_000)
    assert.equal(defaults.absoluteTimeoutMs, 8 * 3_600_000)
    assert.equal(defaults.touchAfterMs, undefined)
    assert.equal(defaults.now, Date.now)
    const cases: Array<[unknown, RegExp]> = [
      [{ idleTimeoutMs: 0 }, /^session store: `idleTimeoutMs` must be an integer of at least 1, got 0$/],
      [{ idleTimeoutMs: 2000, absoluteTimeoutMs: 1000 }, /`absoluteTimeoutMs` must be an integer no smaller/],
      [{ maxIdleTimeoutMs: 1 }, /`maxIdleTimeoutMs` must be an integer no smaller than `idleTimeoutMs`/],
      [{ touchAfterMs: 30 * 60_000 }, /`touchAfterMs` must be an integer from 0 to below/],
      [{ now: 5 }, /`now` must be a function, got 5/],
    ]
    refusesEach(cases, (value) => SESSION_STORE_OPTIONS.read(value))
    // The plugin's other options are not the store's.
    thrown(() => SESSION_STORE_OPTIONS.read({ secrets: [SECRET] }), UnknownOptionError)
  })
})

describe('idempotency plugin options', () => {
  test('defaults fill what is not given; header names are compared in lower case', () => {
    const resolved = resolveOptions({ replayHeaders: ['Location'] })
    assert.equal(resolved.headerName, 'Idempotency-Key')
    assert.equal(resolved.required, true)
    assert.equal(resolved.leaseMs, 10_000)
    assert.equal(resolved.retentionMs, 24 * 3_600_000)
    assert.equal(resolved.onRedisError, 'closed')
    assert.equal(resolved.keyPrefix, 'idem:')
    assert.equal(resolved.maxResponseBytes, 64 * 1024)
    assert.deepEqual(resolved.replayHeaders, ['location'])
    assert.equal(resolved.allowEviction, false)
  })

  test("other idempotency libraries' names get a hint", () => {
    assert.throws(
      () => resolveOptions({ ttl: 1000 } as unknown as IdempotencyPluginOptions),
      /unknown option `ttl`\. `retentionMs` is how long a result is kept/,
    )
  })

  test('wrong values are refused with what is expected', () => {
    const cases: Array<[unknown, RegExp]> = [
      [null, /options must be an object, got null/],
      [{ headerName: 'Bad Header' }, /`headerName` must be a valid HTTP header name/],
      [{ leaseMs: 50 }, /`leaseMs` must be an integer from 100 to 60000, got 50/],
      [
        { leaseMs: 1000, retentionMs: 1000 },
        /`retentionMs` must be an integer larger than `leaseMs` \(1000\)/,
      ],
      [{ onRedisError: 'local' }, /`onRedisError` must be 'closed' or 'open'/],
      [{ keyPrefix: 7 }, /`keyPrefix` must be a string, got 7/],
      [{ maxResponseBytes: 0 }, /`maxResponseBytes` must be an integer from 1 to 16777216/],
      [{ replayHeaders: 'location' }, /`replayHeaders` must be an array of header names/],
      [{ replayHeaders: ['Set-Cookie'] }, /must not include Set-Cookie/],
      [{ scope: 'ip' }, /`scope` must be a function of the request/],
      [{ onReplay: true }, /`onReplay` must be a function of the request and the reply, got a boolean/],
      [{ required: 'yes' }, /`required` must be true or false/],
      [{ connectTimeoutMs: 1.5 }, /`connectTimeoutMs` must be an integer of at least 0/],
      [{ allowEviction: 'no' }, /`allowEviction` must be true or false/],
    ]
    refusesEach(cases, (value) => resolveOptions(value as IdempotencyPluginOptions))
  })

  test("a route's config.idempotency: true or false, or an object of known keys overriding the plugin's", () => {
    const defaults = resolveOptions({})
    assert.equal(resolveRouteConfig(undefined, defaults, 'POST /x'), null)
    assert.equal(resolveRouteConfig(false, defaults, 'POST /x'), null)
    assert.deepEqual(resolveRouteConfig(true, defaults, 'POST /x'), {
      required: true,
      onRedisError: 'closed',
      anonymous: false,
      keyFrom: undefined,
      onReplay: undefined,
    })
    const routeConfig = resolveRouteConfig({ required: false, onRedisError: 'open' }, defaults, 'POST /x')
    assert.equal(routeConfig?.required, false)
    assert.equal(routeConfig?.onRedisError, 'open')
    const cases: Array<[unknown, RegExp]> = [
      ['yes', /route POST \/x: `config.idempotency` must be true, false or an object/],
      [
        { requried: true },
        /route POST \/x: config.idempotency: unknown option `requried`\. Did you mean `required`\?/,
      ],
      [{ anonymous: 1 }, /config.idempotency: `anonymous` must be true or false/],
      [{ onRedisError: 'local' }, /config.idempotency: `onRedisError` must be 'closed' or 'open'/],
      [{ keyFrom: 'header' }, /config.idempotency: `keyFrom` must be a function/],
      [{ onReplay: 1 }, /config.idempotency: `onReplay` must be a function/],
    ]
    refusesEach(cases, (value) => resolveRouteConfig(value, defaults, 'POST /x'))
  })
})
