import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { FastifyOtelInstrumentation } from '@fastify/otel'
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base'
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node'
import { accountCacheKey } from '../../src/ledger/account-cache.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'

// The demo gateway under @fastify/otel and the OpenTelemetry SDK (an in-memory exporter), with no
// configuration of ours: each request is one trace whose `request` span carries the plugins'
// decisions as attributes, its hooks' spans are named after the plugins, and no span is made per
// Redis call. A cached read, a transfer claimed then replayed, a refusal, and a cache miss that
// waited for another instance's load.

const exporter = new InMemorySpanExporter()
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] })
provider.register()
const instrumentation = new FastifyOtelInstrumentation({ registerOnInitialization: true })
instrumentation.setTracerProvider(provider)

let t: TestApp
let alice: TestCustomer
let bob: TestCustomer
let cookie: string
before(async () => {
  // The IP bucket holds 40 requests, enough for every test but the refusal, which spends the rest.
  t = await buildTestApp({ RATE_LIMIT_IP: '40,0.001', CACHE_LEASE_WAIT: '300ms' }, { rateLimits: 'on' })
  alice = await createCustomer(t.db, 'otel-alice', [1_000_000])
  bob = await createCustomer(t.db, 'otel-bob', [0])
  cookie = await login(t.app, alice)
})
after(async () => {
  await t?.close()
  await provider.shutdown()
})

/** The spans of the one request `send` makes, once its request span ended. */
async function traceOf(send: () => Promise<unknown>): Promise<{ root: ReadableSpan; spans: ReadableSpan[] }> {
  exporter.reset()
  await send()
  for (let i = 0; i < 200 && !exporter.getFinishedSpans().some((s) => s.name === 'request'); i++)
    await sleep(5)
  const spans = exporter.getFinishedSpans()
  const roots = spans.filter((s) => s.name === 'request')
  assert.equal(roots.length, 1, `one request span, got ${spans.map((s) => s.name).join(', ')}`)
  const traceId = roots[0]!.spanContext().traceId
  return { root: roots[0]!, spans: spans.filter((s) => s.spanContext().traceId === traceId) }
}

const names = (spans: ReadableSpan[]) => spans.map((s) => s.name).sort()
const balance = (account: number, headers = { cookie }) =>
  t.app.inject({ url: `/accounts/${account}/balance`, headers })

test('a cached read: session and rate-limit decisions on the request span, the cache read on the handler’s', async () => {
  const account = alice.accountIds[0]!
  await balance(account)
  const { root, spans } = await traceOf(() => balance(account))
  assert.equal(root.attributes['http.response.status_code'], 200)
  assert.equal(root.attributes['session.decision'], 'found')
  assert.deepEqual(root.attributes['ratelimiter.name'], ['ip'])
  assert.deepEqual(root.attributes['ratelimiter.result'], ['allowed'])
  assert.deepEqual(root.attributes['ratelimiter.algorithm'], ['token-bucket'])
  assert.equal(root.attributes['ratelimiter.rejected'], undefined)
  const cached = spans.filter((s) => s.attributes['cache.name'] !== undefined)
  assert.equal(cached.length, 1, 'one span carries the cache read')
  assert.ok(['l1', 'hit'].includes(String(cached[0]!.attributes['cache.usage'])))
  assert.equal(cached[0]!.attributes['cache.loaded'], false)
  assert.ok(cached[0]!.name.startsWith('handler - '), cached[0]!.name)
  // Hooks are named: no anonymous span. Nothing per Redis command. (The hooks the plugins add to
  // a route, after @fastify/otel wrapped the route's, run inside the request span.)
  for (const name of [
    'onRequest - rateLimitNotFound',
    'onRequest - session',
    'preParsing - session',
    'onSend - sessionSave',
    'onResponse - metrics',
  ])
    assert.ok(names(spans).includes(name), `${name} in ${names(spans).join(', ')}`)
  assert.ok(!spans.some((s) => / - anonymous$/.test(s.name)), names(spans).join(', '))
  assert.ok(!spans.some((s) => /redis|evalsha|get$/i.test(s.name)))
  // The span count of a read through the chain (docs/observability.md states it).
  assert.equal(spans.length, SPANS_PER_CACHED_READ, names(spans).join(', '))
})

/**
 * `request`, the handler, and the app-level hooks: @fastify/cookie's two, the rate limiter's
 * not-found check, the session's three, the metrics', and the demo's preValidation.
 */
const SPANS_PER_CACHED_READ = 10

test('a transfer claimed, then replayed: the idempotency outcome on each request span', async () => {
  const send = () =>
    t.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': 'otel-transfer-1' },
      payload: {
        fromAccountId: alice.accountIds[0],
        toAccountId: bob.accountIds[0],
        amount: 7,
        currency: 'VND',
      },
    })
  const first = await traceOf(send)
  assert.equal(first.root.attributes['http.response.status_code'], 201)
  assert.equal(first.root.attributes['idempotency.outcome'], 'claimed')
  // The IP limit, then the route's: the customer's transfers limit and its shadow twin.
  assert.deepEqual(first.root.attributes['ratelimiter.name'], ['ip', 'transfers', 'transfers-shadow'])
  assert.deepEqual(first.root.attributes['ratelimiter.shadow'], [false, false, true])
  const again = await traceOf(send)
  assert.equal(again.root.attributes['idempotency.outcome'], 'replayed')
})

test('a cache miss that waited for another instance’s load: lease_wait on the read', async () => {
  // A customer of its own: its account was never read, so nothing of it is cached.
  const carol = await createCustomer(t.db, 'otel-carol', [500])
  const account = carol.accountIds[0]!
  const carolCookie = await login(t.app, carol)
  // Another instance holds the key's fill lease (as cache-get.lua takes it): this read waits for
  // it (CACHE_LEASE_WAIT, 300 ms), then loads the account itself.
  await t.redis.set(`${t.prefix}cache:{${accountCacheKey(account)}}:l`, 'another-instance', 'PX', 10_000)
  const { root, spans } = await traceOf(() =>
    t.app.inject({ url: `/accounts/${account}/balance`, headers: { cookie: carolCookie } }),
  )
  assert.equal(root.attributes['http.response.status_code'], 200)
  const read = spans.find((s) => s.attributes['cache.name'] !== undefined)
  assert.ok(read, names(spans).join(', '))
  assert.equal(read.attributes['cache.name'], 'account')
  assert.equal(read.attributes['cache.usage'], 'miss')
  assert.equal(read.attributes['cache.lease_wait'], true)
  assert.equal(read.attributes['cache.loaded'], true)
})

/** The trace of a balance read refused by the IP bucket (reads until one is). */
async function refusedTrace(): Promise<Awaited<ReturnType<typeof traceOf>>> {
  for (let i = 0; i < 50; i++) {
    const trace = await traceOf(() => balance(alice.accountIds[0]!))
    if (trace.root.attributes['http.response.status_code'] === 429) return trace
  }
  throw new Error('the IP bucket never ran out')
}

test('a refused request: the refusing policy on its span', async () => {
  const refused = await refusedTrace()
  assert.equal(refused.root.attributes['ratelimiter.rejected'], 'ip')
  assert.deepEqual(refused.root.attributes['ratelimiter.result'], ['rejected'])
  assert.deepEqual(refused.root.attributes['ratelimiter.remaining'], [0])
})

test('exemplars: OpenMetrics scrapes name the trace of a refusal and of a request’s latency; Prometheus ones are unchanged', async () => {
  // One refusal (the bucket is spent) whose trace the counter's exemplar must name.
  const refused = await refusedTrace()
  const traceId = refused.root.spanContext().traceId
  const scrape = await t.app.inject({
    url: '/metrics',
    headers: { accept: 'application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.1' },
  })
  assert.equal(scrape.statusCode, 200)
  assert.match(String(scrape.headers['content-type']), /^application\/openmetrics-text; version=1\.0\.0/)
  assert.ok(scrape.body.endsWith('# EOF\n'))
  const lines = scrape.body.split('\n')
  const refusal = lines.filter((l) =>
    /^rate_limit_decisions_total\{policy="ip",outcome="rejected(_cached)?"\}/.test(l),
  )
  assert.ok(
    refusal.some((l) => l.includes(` # {trace_id="${traceId}",span_id="`)),
    `a refusal's exemplar names trace ${traceId}:\n${refusal.join('\n')}`,
  )
  assert.ok(lines.includes('# TYPE rate_limit_decisions counter'), 'the counter family has no _total')
  const latency = lines.filter(
    (l) => l.startsWith('http_request_duration_seconds_bucket{') && l.includes('status="429"'),
  )
  assert.ok(
    latency.some((l) => l.includes(`# {trace_id="${traceId}",`)),
    `a 429's latency bucket names trace ${traceId}:\n${latency.join('\n')}`,
  )
  // Every exemplar is well formed: labels, a value, a timestamp in seconds.
  for (const line of lines.filter((l) => l.includes(' # {')))
    assert.match(
      line,
      / # \{trace_id="[0-9a-f]{32}",span_id="[0-9a-f]{16}"\} [0-9.e-]+ \d{10}(\.\d+)?$/,
      line,
    )
  const plain = await t.app.inject({ url: '/metrics' })
  assert.match(String(plain.headers['content-type']), /^text\/plain; version=0\.0\.4/)
  assert.ok(!plain.body.includes(' # {'), 'no exemplar in the Prometheus format')
  assert.match(plain.body, /^rate_limit_decisions_total\{policy="ip",outcome="rejected"\} \d+$/m)
})
