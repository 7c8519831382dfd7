// The headline rows of the load suite: for each throughput scenario, our contender, its baseline
// and its peer, each with req/s and the CPU it spent per request (the server process and
// redis-server), all from the same measured runs. CPU per request is the figure the results are
// judged by: on two cores the load generator shares the CPUs with what it measures, so req/s and
// every ratio of req/s depend on it, while the CPU a server spends on a request does not.
import type { Spread, Summary } from './runner.ts'

/** A scenario's latest result as load/run.ts writes it to load/results/<scenario>.json. */
export interface StoredResult {
  scenario: string
  at: string
  quick: boolean
  placement?: string
  title: string
  markdown: string
  data: unknown
  ratios?: unknown
}

/** Who a contender is in its scenario. */
type Role = 'ours' | 'baseline' | 'peer'

export interface HeadlineRow {
  scenario: string
  contender: string
  role: Role
  perSecond: number
  /** Absent: the run did not record it; null: there is no such process (pgbench has no server). */
  serverCpuMicros?: number | null
  redisCpuMicros?: number | null
  at: string
}

/** A contender measured by `interleave`: CPU per request when its runs recorded it. */
const fromSummary = (role: Role, summary: Summary | undefined, contender?: string) =>
  summary
    ? [
        {
          contender: contender ?? summary.name,
          role,
          perSecond: summary.rps.median,
          serverCpuMicros: summary.serverCpuMicros?.median,
          redisCpuMicros: summary.redisCpuMicros?.median,
        },
      ]
    : []

type Row = Omit<HeadlineRow, 'scenario' | 'at'>

interface CpuPerTransfer {
  serverMicros: number
  redisMicros: number
}

/**
 * Where each scenario keeps its headline contenders in its `data`. Scenarios not listed here
 * (history, counters, sizing, ...) measure no requests against a server and have no headline row.
 */
const HEADLINES: Record<string, (data: never) => Row[]> = {
  chain: (data: { summaries: Summary[] }) => {
    const named = (name: string) => data.summaries.find((s) => s.name === name)
    return [
      ...fromSummary('ours', named('gateway chain'), 'gateway chain (every plugin; IP limit buffered, L1s)'),
      ...fromSummary('ours', named('gateway chain, exact'), 'gateway chain, every decision on Redis'),
      ...fromSummary(
        'ours',
        named('plugin chain, bare route'),
        'session, buffered IP limit and cache plugins on the bare route',
      ),
      ...fromSummary('peer', named('peer stack')),
      ...fromSummary('baseline', named('bare route')),
      ...fromSummary('baseline', named('bare route + one Redis GET')),
    ]
  },
  'rate-limit': (data: { summaries: Summary[] }) => {
    const named = (name: string) => data.summaries.find((s) => s.name === name)
    return [
      ...fromSummary('ours', named('fixed-window'), 'fixed window'),
      ...fromSummary(
        'ours',
        named('compat/fastify-rate-limit (Redis, @fastify/rate-limit options)'),
        'compat entry (@fastify/rate-limit options)',
      ),
      ...fromSummary('peer', named('@fastify/rate-limit (Redis store)')),
      ...fromSummary('peer', named('rate-limiter-flexible (RateLimiterRedis)')),
    ]
  },
  cache: (data: { balance: { on: Summary; off: Summary } }) => [
    ...fromSummary('ours', data.balance.on, 'balance read, cache on'),
    ...fromSummary('baseline', data.balance.off, 'balance read, CACHE=off'),
  ],
  idempotency: (data: { transfers: { withPlugin: Summary; withoutPlugin: Summary } }) => [
    ...fromSummary('ours', data.transfers.withPlugin, 'POST /transfers with the Idempotency-Key plugin'),
    ...fromSummary('baseline', data.transfers.withoutPlugin, 'POST /transfers without it'),
  ],
  // Its rounds record CPU per committed transfer (one per POST), relay and notifier included.
  events: (data: {
    transfers: { outboxOn: Summary; outboxOff: Summary }
    cpu: Record<string, CpuPerTransfer>
  }) =>
    (
      [
        ['ours', data.transfers.outboxOn, 'POST /transfers, outbox on'],
        ['baseline', data.transfers.outboxOff, 'POST /transfers, OUTBOX=off'],
      ] as const
    ).map(([role, summary, contender]) => ({
      contender,
      role,
      perSecond: summary.rps.median,
      serverCpuMicros: data.cpu[summary.name]?.serverMicros,
      redisCpuMicros: data.cpu[summary.name]?.redisMicros,
    })),
  // Random pairs with the gateway beside the load generator (the verdict's placement), per transfer.
  transfers: (data: {
    phases: Array<{
      pgbench: { transfersPerSecond: Spread; cpu: CpuPerTransfer } | null
      runs: Array<{ key: string; gateway: { transfersPerSecond: Spread; cpu: CpuPerTransfer } }>
    }>
  }) => {
    const phase = data.phases[0]!
    const gateway = phase.runs.find((r) => r.key === 'besideLoadGenerator')?.gateway
    return [
      ...(gateway
        ? [
            {
              contender: 'gateway, POST /transfers',
              role: 'ours' as const,
              perSecond: gateway.transfersPerSecond.median,
              serverCpuMicros: gateway.cpu.serverMicros,
              redisCpuMicros: gateway.cpu.redisMicros,
            },
          ]
        : []),
      ...(phase.pgbench
        ? [
            {
              contender: 'pgbench, the same statement',
              role: 'peer' as const,
              perSecond: phase.pgbench.transfersPerSecond.median,
              serverCpuMicros: null,
              redisCpuMicros: null,
            },
          ]
        : []),
    ]
  },
}

/** The headline rows of the given results, in the order of HEADLINES. */
export function headlineRows(results: StoredResult[]): HeadlineRow[] {
  return Object.entries(HEADLINES).flatMap(([scenario, rowsOf]) => {
    const result = results.find((r) => r.scenario === scenario)
    if (!result) return []
    return rowsOf(result.data as never).map((row) => ({ scenario, at: result.at, ...row }))
  })
}

const micros = (value: number | null | undefined) =>
  value === undefined ? 'not measured' : value === null ? '–' : value.toFixed(0)

/**
 * The headline rows as a Markdown table, its columns padded as the formatter (biome) lays tables
 * out; `link` gives each scenario's result file as the table is read (relative in load/README.md,
 * a full address in README.md).
 */
export function headlineTable(rows: HeadlineRow[], link: (scenario: string) => string): string {
  const header = ['scenario', 'contender', '', 'req/s', 'server CPU µs/req', 'Redis CPU µs/req', 'run']
  const cells = rows.map((row) => [
    `[${row.scenario}](${link(row.scenario)})`,
    row.contender,
    row.role,
    Math.round(row.perSecond).toLocaleString('en-US'),
    micros(row.serverCpuMicros),
    micros(row.redisCpuMicros),
    row.at.slice(0, 10),
  ])
  const length = (text: string) => [...text].length
  const widths = header.map((_, i) => Math.max(3, ...[header, ...cells].map((line) => length(line[i]!))))
  const line = (values: string[]) =>
    `| ${values.map((value, i) => value + ' '.repeat(widths[i]! - length(value))).join(' | ')} |`
  return [line(header), line(widths.map((width) => '-'.repeat(width))), ...cells.map(line)].join('\n')
}
