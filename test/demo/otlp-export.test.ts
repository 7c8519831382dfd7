import assert from 'node:assert/strict'
import type { ChildProcess } from 'node:child_process'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { freePort } from '../../src/embedded/redis-server.ts'
import { startDemoProcess } from '../helpers/demo-process.ts'
import { TEST_REDIS_URL, TEST_SECRET } from '../helpers/index.ts'

// The demo's trace export (src/otel-export.ts): `npm start` with OTEL_EXPORTER_OTLP_ENDPOINT posts
// OTLP/HTTP JSON to <endpoint>/v1/traces, with the request's span and the service's name; spans
// still batched are flushed on SIGTERM; without the variable nothing is sent and none of the SDK,
// the exporter or @fastify/otel is loaded. A real HTTP server stands in for the collector.

interface Span {
  name: string
  traceId: string
  attributes: Record<string, unknown>
  resource: Record<string, unknown>
}
interface Export {
  path: string
  contentType: string | undefined
  spans: Span[]
}

interface OtlpKeyValue {
  key: string
  value: Record<string, unknown>
}
interface OtlpBody {
  resourceSpans?: Array<{
    resource?: { attributes?: OtlpKeyValue[] }
    scopeSpans?: Array<{ spans?: Array<{ name: string; traceId: string; attributes?: OtlpKeyValue[] }> }>
  }>
}

/** OTLP/JSON's `[{ key, value: { stringValue } }]` as `{ key: value }` (ints may come as strings). */
function attributesOf(list: OtlpKeyValue[] = []): Record<string, unknown> {
  const value = (v: Record<string, unknown>): unknown =>
    'intValue' in v
      ? Number(v.intValue)
      : 'arrayValue' in v
        ? ((v.arrayValue as { values?: Array<Record<string, unknown>> }).values ?? []).map(value)
        : Object.values(v)[0]
  return Object.fromEntries(list.map(({ key, value: v }) => [key, value(v)]))
}

const received: Export[] = []
let receiver: http.Server
let endpoint: string
before(async () => {
  receiver = http.createServer((request, response) => {
    let body = ''
    request.on('data', (chunk: Buffer) => {
      body += chunk.toString()
    })
    request.on('end', () => {
      // Anything but OTLP JSON is recorded without spans; the assertions then say what came.
      const otlp = ((): OtlpBody => {
        try {
          return JSON.parse(body) as OtlpBody
        } catch {
          return {}
        }
      })()
      const spans = (otlp.resourceSpans ?? []).flatMap((rs) =>
        (rs.scopeSpans ?? []).flatMap((ss) =>
          (ss.spans ?? []).map((s) => ({
            name: s.name,
            traceId: s.traceId,
            attributes: attributesOf(s.attributes),
            resource: attributesOf(rs.resource?.attributes),
          })),
        ),
      )
      received.push({ path: request.url ?? '', contentType: request.headers['content-type'], spans })
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve))
  endpoint = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`
})

const children: ChildProcess[] = []
after(() => {
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  receiver?.close()
})

// Loaded by the child before the server: at exit it prints how many modules of the OpenTelemetry
// SDK, the exporter and @fastify/otel are loaded (all CommonJS, so in require.cache). The
// API package is left out: the plugins' bridge imports it to ask whether an SDK is registered.
const PROBE = `data:text/javascript,${encodeURIComponent(`
import { createRequire } from 'node:module'
const cache = createRequire(process.cwd() + '/').cache
process.on('exit', () => {
  const sdk = Object.keys(cache).filter((p) => /@opentelemetry\\/(?!api\\/)|@fastify\\/otel\\//.test(p))
  process.stderr.write('OTEL_SDK_MODULES=' + sdk.length + '\\n')
})`)}`

/** `src/server.ts` as `npm start` runs it (plus PROBE), on a free port and embedded PGlite. */
async function startServer(env: Record<string, string>) {
  const port = await freePort()
  const { child, listening, exited, output } = startDemoProcess(
    {
      NODE_ENV: 'test',
      SEED_DEMO: 'false',
      SHUTDOWN_DRAIN: '0s',
      SESSION_SECRET: TEST_SECRET,
      REDIS_URL: TEST_REDIS_URL,
      PORT: String(port),
      ...env,
    },
    ['--import', PROBE],
  )
  children.push(child)
  const url = await listening
  /** SIGTERM, as an orchestrator stops it; resolves with the exit code and the SDK modules it had loaded. */
  const stop = async () => {
    child.kill('SIGTERM')
    const code = await exited
    return { code, sdkModules: Number(/OTEL_SDK_MODULES=(\d+)/.exec(output())?.[1]) }
  }
  return { url, stop }
}

/** The exported spans named `request` of the trace `traceId`, waiting up to 10 s for one. */
async function requestSpans(traceId: string): Promise<Span[]> {
  const find = () =>
    received.flatMap((e) => e.spans).filter((s) => s.name === 'request' && s.traceId === traceId)
  for (let i = 0; i < 200 && find().length === 0; i++) await sleep(50)
  return find()
}

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const traceparent = (traceId: string) => `00-${traceId}-00f067aa0ba902b7-01`

test('with OTEL_EXPORTER_OTLP_ENDPOINT, a request is exported as OTLP/HTTP JSON with its route and the service name', async () => {
  const server = await startServer({ OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_BSP_SCHEDULE_DELAY: '100' })
  // A caller's traceparent: the request span joins its trace, which also picks it out of the exports.
  const health = await fetch(`${server.url}/health`, { headers: { traceparent: traceparent(TRACE_ID) } })
  assert.equal(health.status, 200)
  assert.deepEqual(await health.json(), { status: 'ok' })

  const [span, ...more] = await requestSpans(TRACE_ID)
  assert.ok(span, `a request span of the trace arrived; got ${JSON.stringify(received)}`)
  assert.equal(more.length, 0)
  assert.equal(span.attributes['http.route'], '/health')
  assert.equal(span.attributes['http.request.method'], 'GET')
  assert.equal(span.attributes['http.response.status_code'], 200)
  assert.equal(span.resource['service.name'], 'fastify-redis-gateway-demo')
  assert.equal(span.resource['telemetry.sdk.language'], 'nodejs')
  const carrier = received.find((e) => e.spans.includes(span))!
  assert.equal(carrier.path, '/v1/traces')
  assert.match(carrier.contentType ?? '', /^application\/json/)

  const { code, sdkModules } = await server.stop()
  assert.equal(code, 0, 'graceful shutdown exits 0')
  assert.ok(sdkModules > 0, 'the SDK was loaded (the probe sees it)')
})

test('spans still batched are flushed on SIGTERM; the traces endpoint alone turns export on; OTEL_SERVICE_NAME names the service', async () => {
  const traceId = '0af7651916cd43dd8448eb211c80319c'
  // A batch delay longer than the test: only the shutdown's flush can send the span.
  const server = await startServer({
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${endpoint}/v1/traces`,
    OTEL_BSP_SCHEDULE_DELAY: '600000',
    OTEL_SERVICE_NAME: 'otlp-export-test',
  })
  assert.equal(
    (await fetch(`${server.url}/health`, { headers: { traceparent: traceparent(traceId) } })).status,
    200,
  )
  const { code } = await server.stop()
  assert.equal(code, 0)
  const spans = await requestSpans(traceId)
  assert.equal(spans.length, 1, `the request span was flushed on shutdown; got ${JSON.stringify(received)}`)
  assert.equal(spans[0]!.resource['service.name'], 'otlp-export-test')
})

test('with the endpoint empty (and the traces one unset), nothing is exported, no SDK is loaded, and the server answers', async () => {
  const count = received.length
  const server = await startServer({ OTEL_EXPORTER_OTLP_ENDPOINT: '', OTEL_BSP_SCHEDULE_DELAY: '100' })
  const health = await fetch(`${server.url}/health`, {
    headers: { traceparent: traceparent('5e1f0c2a9b8d4e7f8a6b5c4d3e2f1a0b') },
  })
  assert.equal(health.status, 200)
  assert.deepEqual(await health.json(), { status: 'ok' })
  // Ten times the batch delay an exporting server would use, then its shutdown. (The child is not
  // told the receiver's address, so the receiver's silence alone proves little: PROBE's count does.)
  await sleep(1000)
  const { code, sdkModules } = await server.stop()
  assert.equal(code, 0)
  assert.equal(received.length, count, 'the receiver got nothing')
  assert.equal(sdkModules, 0, 'none of the SDK, the exporter or @fastify/otel was loaded')
})
