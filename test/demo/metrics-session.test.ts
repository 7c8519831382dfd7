import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import { scriptSources } from '../../src/redis/scripts.ts'
import { buildTestApp, createCustomer, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { cookieHeader } from '../helpers/index.ts'
import { delta, scrape } from '../helpers/metrics-scrape.ts'

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
before(async () => {
  // The demo limits on (tests turn them off by default); one failed login per username per minute.
  t = await buildTestApp({ RATE_LIMIT_LOGIN: '1/60s' }, { rateLimits: 'on' })
  alice = await createCustomer(t.db, 'alice', [1_000_000])
  bob = await createCustomer(t.db, 'bob', [0])
})
after(() => t.close())

test('a scripted session moves every counter by exactly what it did', async () => {
  // Scripts run by EVALSHA, and by EVAL after a NOSCRIPT: load them all first (on every master of a
  // cluster; the cache's client uses the same Redis) so the counts below are what the session did,
  // whatever this Redis ran before.
  for (const node of 'nodes' in t.redis ? t.redis.nodes('master') : [t.redis]) {
    for (const { lua } of scriptSources.values()) await node.script('LOAD', lua)
  }
  const before = await scrape(t.app)
  const login = (password: string) =>
    t.app.inject({ method: 'POST', url: '/session', payload: { username: 'alice', password } })

  const loggedIn = await login(alice.password)
  assert.equal(loggedIn.statusCode, 200)
  const cookie = cookieHeader(loggedIn.headers['set-cookie'])
  const balanceUrl = `/accounts/${alice.accountIds[0]}/balance`
  const miss = await t.app.inject({ url: balanceUrl, headers: { cookie } })
  const hit = await t.app.inject({ url: balanceUrl, headers: { cookie } })
  assert.deepEqual([miss.statusCode, hit.statusCode], [200, 200])
  const transfer = {
    method: 'POST' as const,
    url: '/transfers',
    headers: { cookie, 'idempotency-key': randomUUID() },
    payload: {
      fromAccountId: alice.accountIds[0],
      toAccountId: bob.accountIds[0],
      amount: 250,
      currency: 'VND',
    },
  }
  const created = await t.app.inject(transfer)
  assert.equal(created.statusCode, 201)
  const replayed = await t.app.inject(transfer)
  assert.equal(replayed.statusCode, 201)
  assert.equal(replayed.headers['idempotent-replayed'], 'true')
  assert.equal(replayed.body, created.body)
  assert.equal((await login('wrong password')).statusCode, 401)
  assert.equal((await login('wrong password')).statusCode, 429)

  const moved = delta(before, await scrape(t.app))

  // HTTP: one series per route and status; the first scrape shows up once it has been answered.
  const http = (method: string, route: string, status: string) =>
    moved('http_request_duration_seconds_count', { method, route, status })
  assert.equal(http('POST', '/session', '200'), 1)
  assert.equal(http('GET', '/accounts/:accountId/balance', '200'), 2)
  assert.equal(http('POST', '/transfers', '201'), 2)
  assert.equal(http('POST', '/session', '401'), 1)
  assert.equal(http('POST', '/session', '429'), 1)
  assert.equal(http('GET', '/metrics', '200'), 1)
  assert.equal(moved('http_request_duration_seconds_count'), 8)

  // Rate limits: the IP bucket decides each of the seven requests (not /metrics: registered before
  // the rate-limit plugin, it has no limit); the per-IP login counter allows all three attempts; the
  // login policy counts failures only, so the success was refunded, the first wrong password allowed
  // and the second rejected. The shadow transfers limit (3 a minute) allows both transfers.
  const decisions = (labels: Record<string, string>) => moved('rate_limit_decisions_total', labels)
  assert.equal(decisions({ policy: 'login', outcome: 'allowed' }), 2)
  assert.equal(decisions({ policy: 'login', outcome: 'rejected' }), 1)
  assert.equal(decisions({ policy: 'ip', outcome: 'allowed' }), 7)
  assert.equal(decisions({ policy: 'login-ip', outcome: 'allowed' }), 3)
  assert.equal(decisions({ policy: 'transfers', outcome: 'allowed' }), 2)
  assert.equal(decisions({ policy: 'transfers-shadow', outcome: 'allowed' }), 2)
  assert.equal(moved('rate_limit_decisions_total'), 17)

  // Idempotency: one new claim, stored once, then one replay; nothing else.
  assert.equal(moved('idempotency_requests_total', { outcome: 'new' }), 1)
  assert.equal(moved('idempotency_requests_total', { outcome: 'replayed' }), 1)
  assert.equal(moved('idempotency_requests_total'), 2)
  assert.equal(moved('idempotency_responses_total', { result: 'stored' }), 1)
  assert.equal(moved('idempotency_responses_total'), 1)
  assert.equal(moved('idempotency_stored_bytes_total'), Buffer.byteLength(created.body))

  // Cache: the first read missed and loaded, the second hit this instance's L1 (CACHE_L1_TTL); the
  // transfer's invalidation did not fail.
  assert.equal(moved('cache_misses_total', { name: 'account' }), 1)
  assert.equal(moved('cache_loads_total', { name: 'account' }), 1)
  assert.equal(moved('cache_l1_hits_total', { name: 'account' }), 1)
  for (const quiet of [
    'cache_stale_served_total',
    'cache_lease_waits_total',
    'cache_fence_rejections_total',
    'cache_invalidation_failures_total',
    'cache_redis_errors_total',
  ]) {
    assert.equal(moved(quiet), 0, quiet)
  }

  // Redis, per script: a session is loaded by the first request that presents the cookie (of two
  // reads and two transfers); login creates one and indexes it; the key is claimed twice and completed once.
  // Every plugin runs on the main client; each command is labelled by the plugin that sent it.
  const redis = (client: string, command: string) =>
    moved('redis_command_duration_seconds_count', { client, command })
  // Within touchAfterMs of the login, no load slides the idle expiry again; the first load reads
  // the session, the three others are answered by the session L1.
  assert.equal(redis('session', 'hgetall'), 1)
  assert.equal(redis('session', 'pexpire'), 0)
  assert.equal(redis('session', 'script:sessionCreate'), 1)
  assert.equal(redis('session', 'script:sessionIndexAdd'), 1)
  assert.equal(redis('idempotency', 'script:idempotencyClaim'), 2)
  assert.equal(redis('idempotency', 'script:idempotencyComplete'), 1)
  // Limits: the IP bucket once (it is buffered: one lease admits all seven requests); the transfers window for both transfers (the replay
  // too: limits run before idempotency) plus the replay's refund (a replay is free), and the same
  // three for the shadow transfers limit, which counts as `transfers` does; the per-IP
  // login counter for each attempt; the login log for each attempt plus the success's refund.
  assert.equal(redis('rate-limit', 'script:rateLimitTokenBucket'), 1)
  assert.equal(redis('rate-limit', 'script:rateLimitSlidingCounter'), 3)
  assert.equal(redis('rate-limit', 'script:rateLimitFixedWindow'), 6)
  assert.equal(redis('rate-limit', 'script:rateLimitSlidingLog'), 4)
  // The cache, on the main client too: a prefetched peek (GET) for the first balance request (the
  // second is answered by the L1, which no peek is sent for); the miss then
  // reads with a fill lease and fills once; one invalidation for the four keys the transfer dropped
  // (both balances, both owners' account lists): one script call on a single Redis.
  assert.equal(redis('cache', 'get'), 1)
  assert.equal(redis('cache', 'script:cacheGet'), 1)
  assert.equal(redis('cache', 'script:cacheFill'), 1)
  assert.equal(redis('cache', 'script:cacheInvalidate'), 1)
  // None of them under the client's own name (which keeps the demo's own commands: outbox, filter).
  for (const command of [
    'hgetall',
    'get',
    'script:idempotencyClaim',
    'script:rateLimitTokenBucket',
    'script:cacheGet',
  ])
    assert.equal(redis('main', command), 0, command)
  assert.equal(moved('redis_command_errors_total'), 0)

  // Postgres: two logins reached the handler (the 429 did not), one balance load, and the transfer:
  // one WITH statement on its own, no BEGIN/COMMIT around it (the recipient to invalidate comes
  // from it). The replay touched nothing. Each scrape also reads the outbox gauges (backlog, oldest
  // age): two more SELECTs between the two scrapes.
  const sql = (statement: string, outcome = 'ok') =>
    moved('db_query_duration_seconds_count', { statement, outcome })
  assert.equal(sql('SELECT'), 3 + 2)
  assert.equal(sql('WITH'), 1)
  assert.equal(sql('BEGIN'), 0)
  assert.equal(sql('COMMIT'), 0)
  assert.equal(moved('db_query_duration_seconds_count'), 4 + 2)
  assert.equal(moved('db_transaction_duration_seconds_count'), 0)
})
