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
  processMetrics: option.boolean({
    default: true,
    doc: "include prom-client's default `process_*` and `nodejs_*` metrics",
  }),
})

/** The metrics plugin's options (see docs/metrics.md). */
export type MetricsPluginOptions = OptionsOf<typeof METRICS_OPTIONS>
