import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { ConfigError, loadConfig, parseDuration as parseEnvDuration } from '../../src/config.ts'

test('defaults follow docs/demo/http-api.md', () => {
  const config = loadConfig({})
  assert.equal(config.port, 3000)
  assert.equal(config.host, '127.0.0.1')
  assert.equal(config.databaseUrl, undefined)
  assert.deepEqual(config.rateLimits.transfers, { limit: 10, windowMs: 60_000 })
  assert.deepEqual(config.rateLimits.login, { limit: 5, windowMs: 60_000 })
  assert.deepEqual(config.rateLimits.ip, {
    capacity: 100,
    refillPerSecond: 50,
    sync: { intervalMs: 250, batch: 100 },
  })
  assert.equal(config.rateLimits.enabled, true)
  assert.equal(config.seedDemo, true)
  assert.equal(config.session.secrets.length, 1)
  assert.ok(config.session.secrets[0]!.length >= 32, 'a random per-process secret in development')
  assert.equal(config.session.secure, false)
  assert.deepEqual(config.events.workers, { relay: true, notifier: true, campaigns: true, feed: true })
  assert.equal(config.events.notificationsDedupMs, 86_400_000)
  assert.equal(config.events.notificationsTtlMs, 7 * 86_400_000)
  assert.equal(config.events.deadLetterRetention, 10_000)
  assert.equal(config.metricsNames, 'prometheus')
})

test('parses every variable', () => {
  const config = loadConfig({
    PORT: '8080',
    HOST: '0.0.0.0',
    REDIS_URL: 'redis://10.0.0.1:6380',
    CACHE_REDIS_URL: 'redis://10.0.0.2:6379',
    DATABASE_URL: 'postgres://u@h/db',
    SESSION_SECRET: `${'a'.repeat(32)},${'b'.repeat(40)}`,
    RATE_LIMIT_TRANSFERS: '3/500ms',
    RATE_LIMIT_LOGIN: '7/2m',
    RATE_LIMIT_IP: '10,2.5',
    RATE_LIMIT_IP_SYNC: '1s,20',
    SESSION_L1_TTL: '0s',
    RATE_LIMITS: 'off',
    SEED_DEMO: 'false',
    NOTIFICATIONS_DEDUP: '90m',
    NOTIFICATIONS_TTL: '36h',
    EVENTS_DEAD_LETTER_RETENTION: '500',
    METRICS_NAMES: 'both',
  })
  assert.equal(config.port, 8080)
  assert.equal(config.cacheRedisUrl, 'redis://10.0.0.2:6379')
  assert.deepEqual(config.session.secrets, ['a'.repeat(32), 'b'.repeat(40)])
  assert.deepEqual(config.rateLimits.transfers, { limit: 3, windowMs: 500 })
  assert.deepEqual(config.rateLimits.login, { limit: 7, windowMs: 120_000 })
  assert.deepEqual(config.rateLimits.ip, {
    capacity: 10,
    refillPerSecond: 2.5,
    sync: { intervalMs: 1000, batch: 20 },
  })
  assert.equal(loadConfig({ RATE_LIMIT_IP_SYNC: 'exact' }).rateLimits.ip.sync, false)
  assert.equal(config.session.l1TtlMs, 0)
  assert.equal(config.rateLimits.enabled, false)
  assert.equal(config.seedDemo, false)
  assert.equal(config.events.notificationsDedupMs, 5_400_000)
  assert.equal(config.events.notificationsTtlMs, 129_600_000)
  assert.equal(config.events.deadLetterRetention, 500)
  assert.equal(config.metricsNames, 'both')
  assert.deepEqual(loadConfig({ REDIS_CLUSTER_NODES: 'a:7000,b:7001' }).redis.clusterNodes, [
    { host: 'a', port: 7000 },
    { host: 'b', port: 7001 },
  ])
  const workers = (value: string) => loadConfig({ EVENT_WORKERS: value }).events.workers
  assert.deepEqual(workers('off'), { relay: false, notifier: false, campaigns: false, feed: false })
  assert.deepEqual(workers('relay'), { relay: true, notifier: false, campaigns: false, feed: false })
  assert.deepEqual(workers('notifier,campaigns'), {
    relay: false,
    notifier: true,
    campaigns: true,
    feed: false,
  })
  assert.deepEqual(workers('feed'), { relay: false, notifier: false, campaigns: false, feed: true })
})

test('a bad variable fails the boot with a message naming it', () => {
  const cases: Array<[Record<string, string>, string]> = [
    [{ PORT: 'eighty' }, "Invalid environment variable PORT: expected a port number, got 'eighty'"],
    [{ PORT: '70000' }, "Invalid environment variable PORT: expected a port number, got '70000'"],
    [
      { RATE_LIMIT_IP_SYNC: '250ms' },
      "Invalid environment variable RATE_LIMIT_IP_SYNC: expected exact, or INTERVAL,BATCH like 250ms,100, got '250ms'",
    ],
    [
      { RATE_LIMIT_TRANSFERS: '10 per minute' },
      "Invalid environment variable RATE_LIMIT_TRANSFERS: expected LIMIT/WINDOW like 10/60s, got '10 per minute'",
    ],
    [
      { RATE_LIMIT_IP: '100' },
      "Invalid environment variable RATE_LIMIT_IP: expected CAPACITY,REFILL_PER_SECOND like 100,50, got '100'",
    ],
    [
      { REDIS_URL: 'localhost:6379' },
      "Invalid environment variable REDIS_URL: expected a redis:// or rediss:// URL, got 'localhost:6379'",
    ],
    [{ RATE_LIMITS: 'maybe' }, "Invalid environment variable RATE_LIMITS: expected on or off, got 'maybe'"],
    [
      { NOTIFICATIONS_DEDUP: '7' },
      "Invalid environment variable NOTIFICATIONS_DEDUP: expected a duration above zero like 24h, got '7'",
    ],
    [
      { NOTIFICATIONS_TTL: '0s' },
      "Invalid environment variable NOTIFICATIONS_TTL: expected a duration above zero like 168h, got '0s'",
    ],
    [
      { EVENTS_DEAD_LETTER_RETENTION: '0' },
      "Invalid environment variable EVENTS_DEAD_LETTER_RETENTION: expected a positive integer (dead letters kept), got '0'",
    ],
    [
      { EVENT_WORKERS: 'relay,mailer' },
      "Invalid environment variable EVENT_WORKERS: expected on, off, or a comma list of relay, notifier, campaigns, feed, got 'relay,mailer'",
    ],
    [
      { SESSION_SECRET: 'short' },
      'Invalid environment variable SESSION_SECRET: expected at least 32 characters (comma list for rotation; the first signs), got (hidden)',
    ],
    [
      { SESSION_SECRET: `${'a'.repeat(32)},short` },
      'Invalid environment variable SESSION_SECRET: every secret in the list needs 32+ characters',
    ],
    [
      { NODE_ENV: 'production' },
      'Invalid environment variable SESSION_SECRET: required when NODE_ENV=production',
    ],
  ]
  for (const [env, message] of cases) assert.throws(() => loadConfig(env), { name: 'ConfigError', message })
})

test('production turns on Secure cookies', () => {
  const config = loadConfig({ NODE_ENV: 'production', SESSION_SECRET: 'x'.repeat(32) })
  assert.equal(config.session.secure, true)
})

describe("the gateway's environment durations", () => {
  test('a whole number and one of ms, s, m, h', () => {
    assert.equal(parseEnvDuration('250ms'), 250)
    assert.equal(parseEnvDuration('15s'), 15_000)
    assert.equal(parseEnvDuration('30m'), 1_800_000)
    assert.equal(parseEnvDuration('168h'), 604_800_000)
  })

  test('anything else is a ConfigError naming the value', () => {
    for (const text of ['', '10', '1.5s', '1 minute', '2d', ' 5s'])
      assert.throws(
        () => parseEnvDuration(text),
        (err) => err instanceof ConfigError && err.message.includes(`invalid duration '${text}'`),
        text,
      )
  })
})
