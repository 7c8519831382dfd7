import assert from 'node:assert/strict'
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { FastifyOtelInstrumentation } from '@fastify/otel'
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base'
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node'
import { buildTestApp, createCustomer, login, type TestApp } from '../helpers/gateway.ts'

// A real Prometheus (Debian's package, as CI installs it for promtool) scrapes the gateway, traced
// by the OpenTelemetry SDK, with exemplar storage on: it negotiates OpenMetrics, accepts every line
// of it, and keeps the exemplars, which name the traces the SDK exported.

const hasPrometheus = spawnSync('prometheus', ['--version']).status === 0

const exporter = new InMemorySpanExporter()
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] })
provider.register()
new FastifyOtelInstrumentation({ registerOnInitialization: true }).setTracerProvider(provider)

async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  await new Promise((resolve) => server.close(resolve))
  return port
}

let t: TestApp
let prometheus: ChildProcess | undefined
let dir: string
let api: string
before(async () => {
  if (!hasPrometheus) return
  t = await buildTestApp({ RATE_LIMIT_IP: '5,0.001' }, { rateLimits: 'on' })
  const gateway = await t.app.listen({ port: 0, host: '127.0.0.1' })
  dir = mkdtempSync(join(tmpdir(), 'prometheus-exemplars-'))
  writeFileSync(
    join(dir, 'prometheus.yml'),
    `global: { scrape_interval: 1s }\nscrape_configs:\n  - job_name: gateway\n    static_configs: [{ targets: ['${new URL(gateway).host}'] }]\n`,
  )
  const port = await freePort()
  api = `http://127.0.0.1:${port}/api/v1`
  prometheus = spawn(
    'prometheus',
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--enable-feature=exemplar-storage',
    ],
    { stdio: 'ignore' },
  )
})
after(async () => {
  prometheus?.kill('SIGKILL')
  await t?.close()
  await provider.shutdown()
  if (dir) rmSync(dir, { recursive: true, force: true })
})

/** Asks Prometheus until `found` says yes (it scrapes every second), at most 60 s. */
async function poll<T>(path: string, found: (data: T) => boolean): Promise<T> {
  let last: unknown
  for (let i = 0; i < 240; i++) {
    try {
      const body = (await (await fetch(`${api}${path}`)).json()) as { data: T }
      last = body.data
      if (found(body.data)) return body.data
    } catch (err) {
      last = err
    }
    await sleep(250)
  }
  throw new Error(`${path}: never found, last answer ${JSON.stringify(last)}`)
}

interface ExemplarSeries {
  seriesLabels: Record<string, string>
  exemplars: Array<{ labels: Record<string, string>; value: string }>
}

test('Prometheus scrapes OpenMetrics without error and keeps the exemplars of latency and refusals', {
  skip: !hasPrometheus && 'prometheus is not installed (apt-get install prometheus)',
}, async () => {
  const alice = await createCustomer(t.db, 'prom-alice', [1_000])
  const cookie = await login(t.app, alice)
  let refused = 0
  for (let i = 0; i < 10; i++) {
    const response = await t.app.inject({
      url: `/accounts/${alice.accountIds[0]}/balance`,
      headers: { cookie },
    })
    if (response.statusCode === 429) refused++
  }
  assert.ok(refused > 0, 'the IP bucket of 5 refused')
  const traces = new Set(exporter.getFinishedSpans().map((s) => s.spanContext().traceId))

  // The target is up, and the scrape was OpenMetrics with every line accepted.
  const targets = await poll<{ activeTargets: Array<{ health: string; lastError: string }> }>(
    '/targets',
    (d) => d.activeTargets[0]?.health === 'up',
  )
  assert.equal(targets.activeTargets[0]!.lastError, '')
  const now = Date.now() / 1000
  const range = `start=${now - 600}&end=${now + 600}`
  for (const query of [
    'http_request_duration_seconds_bucket',
    'rate_limit_decisions_total{outcome=~"rejected.*"}',
  ]) {
    const series = await poll<ExemplarSeries[]>(
      `/query_exemplars?query=${encodeURIComponent(query)}&${range}`,
      (d) => d.some((s) => s.exemplars.length > 0),
    )
    const exemplars = series.flatMap((s) => s.exemplars)
    assert.ok(
      exemplars.some((e) => traces.has(e.labels.trace_id!)),
      `${query}: an exemplar names a trace the SDK exported: ${JSON.stringify(exemplars)}`,
    )
  }
  // Counters keep their name through OpenMetrics (`_total` on the sample, not on the family).
  const decisions = await poll<{ result: Array<{ value: [number, string] }> }>(
    `/query?query=${encodeURIComponent('sum(rate_limit_decisions_total{policy="ip"})')}`,
    (d) => d.result.length > 0 && Number(d.result[0]!.value[1]) >= 10,
  )
  assert.ok(Number(decisions.result[0]!.value[1]) >= 10)
})
