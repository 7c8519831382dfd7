import type { Registry } from 'prom-client'

// The registry in the OpenMetrics text format (1.0.0), with exemplars: what a Prometheus scraper
// asks for first. prom-client has this format too, but only on a registry built for it, and its
// serializer renames each counter in place (drops `_total` from `name`), which would break the same
// registry's Prometheus format for the next scraper. This writes from `getMetricsAsJSON()` and
// changes nothing.

export const OPENMETRICS_CONTENT_TYPE = 'application/openmetrics-text; version=1.0.0; charset=utf-8'

/** Whether an Accept header asks for OpenMetrics (Prometheus sends it first, with q-values). */
export const acceptsOpenMetrics = (accept: string | undefined) =>
  accept !== undefined && accept.includes('application/openmetrics-text')

const escapeLabel = (value: string) => value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')
const escapeHelp = (value: string) => value.replace(/\\/g, '\\\\').replace(/\n/g, '\\n')

function number(value: number): string {
  if (Number.isNaN(value)) return 'NaN'
  if (value === Number.POSITIVE_INFINITY) return '+Inf'
  if (value === Number.NEGATIVE_INFINITY) return '-Inf'
  return String(value)
}

function labels(set: Record<string, string | number> | undefined): string {
  const pairs = Object.entries(set ?? {}).map(([name, value]) => `${name}="${escapeLabel(String(value))}"`)
  return pairs.length > 0 ? `{${pairs.join(',')}}` : ''
}

interface Sample {
  metricName?: string
  labels?: Record<string, string | number>
  value: number
  exemplar?: { labelSet: Record<string, string>; value: number; timestamp?: number } | null
}

/** Every metric of `registry`, in the OpenMetrics format, exemplars included, ending in `# EOF`. */
export async function openMetrics(registry: Registry): Promise<string> {
  const lines: string[] = []
  for (const metric of await registry.getMetricsAsJSON()) {
    const type = String(metric.type)
    const counter = type === 'counter'
    // A counter's family has no `_total`; its sample has.
    const family = counter ? metric.name.replace(/_total$/, '') : metric.name
    const known = ['counter', 'gauge', 'histogram', 'summary'].includes(type)
    lines.push(`# TYPE ${family} ${known ? type : 'unknown'}`, `# HELP ${family} ${escapeHelp(metric.help)}`)
    for (const sample of metric.values as Sample[]) {
      const name = counter ? `${family}_total` : (sample.metricName ?? family)
      let line = `${name}${labels(sample.labels)} ${number(sample.value)}`
      const { exemplar } = sample
      if (exemplar) {
        line += ` # ${labels(exemplar.labelSet) || '{}'} ${number(exemplar.value)}`
        if (exemplar.timestamp !== undefined) line += ` ${exemplar.timestamp}`
      }
      lines.push(line)
    }
  }
  lines.push('# EOF')
  return `${lines.join('\n')}\n`
}
