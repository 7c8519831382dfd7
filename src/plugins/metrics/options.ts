import { declareOptions, type OptionsOf, option, shown } from '../common/options.ts'

export const METRICS_OPTIONS = declareOptions('metrics plugin', {
  path: option.custom<string | false>({
    type: 'path | false',
    default: '/metrics',
    doc: 'where the registry is served; `false` serves nothing (scrape `app.metrics.registry` yourself)',
    read(value, fail, name) {
      if (value === false || (typeof value === 'string' && value.startsWith('/'))) return value
      return fail(
        `\`${name}\` must be a path starting with / (or false to serve nothing), got ${shown(value)}`,
      )
    },
  }),
  names: option.oneOf(['prometheus', 'opentelemetry', 'both'] as const, {
    default: 'prometheus',
    doc: "the HTTP and Redis latency histograms' names: `prometheus` (`http_request_duration_seconds`, `redis_command_duration_seconds`), `opentelemetry` (the semantic conventions' `http.server.request.duration` and `db.client.operation.duration`, with their attributes and advised buckets), or `both` while dashboards move",
  }),
  processMetrics: option.boolean({
    default: true,
    doc: "include prom-client's default `process_*` and `nodejs_*` metrics",
  }),
})

/** The metrics plugin's options (see docs/metrics.md). */
export type MetricsPluginOptions = OptionsOf<typeof METRICS_OPTIONS>

/** Which names the latency histograms are kept under (the `names` option). */
export type MetricsNames = NonNullable<MetricsPluginOptions['names']>
