import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'
import { buildTestApp, createCustomer, login } from '../helpers/gateway.ts'

// The dashboard (monitoring/grafana-dashboard.json) and the alert rules (monitoring/alerts.yml)
// name only series the gateway exports: every metric name in their PromQL is a family of the
// gateway's GET /metrics (a histogram's _bucket, _sum and _count included). A renamed metric
// fails here, not on a blank panel or an alert that can never fire.

const monitoring = join(import.meta.dirname, '../../monitoring')

/** PromQL's functions, aggregations and keywords: every other bare name is a metric. */
const PROMQL_WORDS = new Set(
  `sum min max avg count stddev stdvar topk bottomk quantile count_values group
  rate irate increase delta idelta deriv predict_linear histogram_quantile resets changes
  abs ceil floor round clamp clamp_min clamp_max exp ln log2 log10 sqrt time timestamp vector scalar
  absent absent_over_time label_replace label_join sort sort_desc
  avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time last_over_time
  and or unless by without on ignoring group_left group_right bool offset inf nan`.split(/\s+/),
)

/** The metric names a PromQL expression reads. */
function metricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""') // label values
    .replace(/\{[^}]*\}/g, ' ') // selectors
    .replace(/\[[^\]]*\]/g, ' ') // ranges
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ') // label lists
    .replace(/\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b/gi, ' ') // numbers
  return (bare.match(/[a-zA-Z_:][a-zA-Z0-9_:]*/g) ?? []).filter((word) => !PROMQL_WORDS.has(word))
}

function dashboardExprs(): string[] {
  const dashboard = JSON.parse(readFileSync(join(monitoring, 'grafana-dashboard.json'), 'utf8')) as {
    panels: Array<{ targets?: Array<{ expr?: string }> }>
  }
  return dashboard.panels.flatMap((panel) => (panel.targets ?? []).map((t) => t.expr ?? '')).filter(Boolean)
}

/** The `expr:` of every rule (a one-line value or a `|` block). */
function alertExprs(): string[] {
  const lines = readFileSync(join(monitoring, 'alerts.yml'), 'utf8').split('\n')
  const exprs: string[] = []
  for (let i = 0; i < lines.length; i++) {
    const match = /^(\s*)expr:\s*(.*)$/.exec(lines[i]!)
    if (!match) continue
    if (match[2] !== '|') {
      exprs.push(match[2]!)
      continue
    }
    const block: string[] = []
    while (i + 1 < lines.length && lines[i + 1]!.search(/\S/) > match[1]!.length) block.push(lines[++i]!)
    exprs.push(block.join('\n'))
  }
  return exprs
}

test('the dashboard and the alert rules name only series the gateway exports', async () => {
  // Everything on, as in production (tests turn the background workers off by default).
  const gateway = await buildTestApp(
    {},
    { rateLimits: 'on', eventWorkers: 'on', scheduler: 'on', accountFilter: 'on' },
  )
  try {
    const customer = await createCustomer(gateway.db, 'monitoring-alice')
    const cookie = await login(gateway.app, customer)
    // A request through every plugin, so that what a plugin registers at its first use is there too.
    const balance = await gateway.app.inject({
      url: `/accounts/${customer.accountIds[0]}/balance`,
      headers: { cookie },
    })
    assert.equal(balance.statusCode, 200)
    const text = (await gateway.app.inject({ url: '/metrics' })).body
    const families = new Set([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => m[1]!))
    const exported = (name: string) =>
      families.has(name) || families.has(name.replace(/_(?:bucket|sum|count)$/, ''))

    const dashboard = dashboardExprs()
    const alerts = alertExprs()
    assert.ok(dashboard.length >= 20, `${dashboard.length} dashboard queries found`)
    assert.equal(alerts.length, 7, 'one expression per alert rule')
    for (const [where, exprs] of [
      ['grafana-dashboard.json', dashboard],
      ['alerts.yml', alerts],
    ] as const) {
      const named = new Set(exprs.flatMap(metricNames))
      assert.ok(named.size >= 5, `${where}: ${[...named].join(', ')}`)
      const missing = [...named].filter((name) => !exported(name))
      assert.deepEqual(missing, [], `${where} reads series the gateway does not export`)
    }
  } finally {
    await gateway.close()
  }
})

test('metricNames reads a query’s metric names and nothing else', () => {
  assert.deepEqual(
    metricNames(
      'histogram_quantile(0.99, sum by (le, route) (rate(http_request_duration_seconds_bucket{instance=~"$instance",status="5.."}[$__rate_interval]))) > 0.5',
    ),
    ['http_request_duration_seconds_bucket'],
  )
  assert.deepEqual(
    metricNames('max(outbox_oldest_unrelayed_age_seconds) > 60\n  and max(deriv(outbox_backlog[10m])) >= 0'),
    ['outbox_oldest_unrelayed_age_seconds', 'outbox_backlog'],
  )
})

test('METRICS_NAMES=opentelemetry: the gateway exports the latency histograms under the semantic conventions', async () => {
  const gateway = await buildTestApp({ METRICS_NAMES: 'opentelemetry' })
  try {
    await gateway.app.inject({ url: '/health' })
    await gateway.app.redis.get('monitoring-test:none')
    const body = (await gateway.app.inject({ url: '/metrics' })).body
    assert.match(
      body,
      /^http_server_request_duration_seconds_count\{http_request_method="GET",http_route="\/health",/m,
    )
    assert.match(body, /^db_client_operation_duration_seconds_count\{db_system_name="redis",/m)
    assert.doesNotMatch(body, /^http_request_duration_seconds_count/m)
  } finally {
    await gateway.close()
  }
})
