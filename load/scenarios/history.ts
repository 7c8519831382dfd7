// Sizing the transaction history's page query (docs/demo/history.md): one account with 1,000,000
// transfers (quick: 100,000) written by one INSERT ... SELECT generate_series into the scenario's
// fresh database, then the page of 20 after 1 %, 10 % and 90 % of them, read by keyset (the query
// GET /accounts/:accountId/transactions runs, src/ledger/history.ts) and by OFFSET on the same
// indexes, interleaved; time per query around the pg call, median of the runs. No HTTP: the rows a
// query reads, not the gateway, decide how deep pages cost.
import { createPgDatabase, type Database } from '../../src/db/database.ts'
import { migrate } from '../../src/db/migrate.ts'
import { type HistoryPosition, historyQuery, listTransactions } from '../../src/ledger/history.ts'
import { formatTable, median } from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'

const PAGE = 20
const ORDER = 'ORDER BY created_at DESC, id DESC'
const COLUMNS = 'id, from_account_id, to_account_id, amount, currency, created_at'

/**
 * OFFSET at its best: the same two index scans merged, each reading `$2 + $3` rows, the first `$2`
 * of the merge dropped. (An `OR` of both sides in one WHERE cannot use the indexes' order and
 * sorts every transfer of the account instead.)
 */
const OFFSET_QUERY = `SELECT * FROM (
    (SELECT ${COLUMNS} FROM transfers WHERE from_account_id = $1 ${ORDER} LIMIT $2::bigint + $3::bigint)
    UNION ALL
    (SELECT ${COLUMNS} FROM transfers WHERE to_account_id = $1 ${ORDER} LIMIT $2::bigint + $3::bigint)
  ) page ${ORDER} OFFSET $2 LIMIT $3`

/** Two customers, account 1 (the one measured) and account 2 on the other side of every transfer. */
async function seed(db: Database, transfers: number): Promise<void> {
  await db.query(
    `INSERT INTO customers (username, password_hash) VALUES ('history-a', 'x'), ('history-b', 'x')`,
  )
  await db.query(`INSERT INTO accounts (customer_id, currency) VALUES (1, 'VND'), (2, 'VND')`)
  // Sent and received alternate (both indexes serve the page); two transfers share each
  // millisecond, so the id breaks ties as it does for transfers committed together.
  await db.query(
    `INSERT INTO transfers (customer_id, from_account_id, to_account_id, amount, currency, created_at)
     SELECT 1 + i % 2, 1 + i % 2, 2 - i % 2, 1 + i % 1000, 'VND',
            timestamptz '2026-01-01T00:00:00Z' + (i / 2) * interval '1 millisecond'
     FROM generate_series(1, $1::integer) AS i`,
    [transfers],
  )
  await db.query('VACUUM ANALYZE transfers')
}

/** The last transfer before the page at `depth`: what a client paging there would hold as its cursor. */
async function positionAt(db: Database, depth: number): Promise<HistoryPosition> {
  const [row] = await db.query<{ position_at: string; id: string }>(
    `SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS position_at, id
     FROM (${OFFSET_QUERY}) deep`,
    [1, depth - 1, 1],
  )
  if (!row) throw new Error(`no transfer at depth ${depth}`)
  return { createdAt: row.position_at, transferId: Number(row.id) }
}

async function timed<T>(run: () => Promise<T>): Promise<{ ms: number; result: T }> {
  const start = performance.now()
  const result = await run()
  return { ms: performance.now() - start, result }
}

async function explain(db: Database, sql: string, params: unknown[]): Promise<string> {
  const rows = await db.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, BUFFERS) ${sql}`, params)
  return rows.map((r) => r['QUERY PLAN']).join('\n')
}

/** Postgres's own execution time of one run (no per-node timing, which would weigh on OFFSET's many rows). */
async function executionMs(db: Database, sql: string, params: unknown[]): Promise<number> {
  const rows = await db.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, TIMING OFF) ${sql}`, params)
  const line = rows.map((r) => r['QUERY PLAN']).find((l) => l.startsWith('Execution Time'))
  return Number(/([0-9.]+) ms/.exec(line ?? '')?.[1] ?? Number.NaN)
}

const spread = (values: number[]) => ({
  median: median(values),
  min: Math.min(...values),
  max: Math.max(...values),
})

interface Contender {
  /** The query as the gateway (or an OFFSET implementation) sends it, timed around the pg call. */
  run(): Promise<unknown>
  sql: string
  params: unknown[]
}

/** Each run measures both, in alternating order, so drift on a shared machine hits both alike. */
async function compare(db: Database, keyset: Contender, offset: Contender, runs: number) {
  const times = {
    keyset: { client: [] as number[], server: [] as number[] },
    offset: { client: [] as number[], server: [] as number[] },
  }
  for (let run = 0; run < runs; run++) {
    for (const name of run % 2 === 0 ? (['keyset', 'offset'] as const) : (['offset', 'keyset'] as const)) {
      const contender = name === 'keyset' ? keyset : offset
      times[name].client.push((await timed(() => contender.run())).ms)
      times[name].server.push(await executionMs(db, contender.sql, contender.params))
    }
  }
  const ratios = (of: 'client' | 'server') => times.offset[of].map((ms, i) => ms / times.keyset[of][i]!)
  return {
    keysetMs: { client: spread(times.keyset.client), server: spread(times.keyset.server) },
    offsetMs: { client: spread(times.offset.client), server: spread(times.offset.server) },
    offsetOverKeyset: { client: spread(ratios('client')), server: spread(ratios('server')) },
  }
}

const ms = (s: { median: number; min: number; max: number }) =>
  `${s.median.toFixed(2)} ms (${s.min.toFixed(2)}-${s.max.toFixed(2)})`
const times = (s: { median: number; min: number; max: number }) => {
  const digits = s.median >= 10 ? 0 : 1
  return `${s.median.toFixed(digits)}x (${s.min.toFixed(digits)}-${s.max.toFixed(digits)}x)`
}

const history: Scenario = async ({ quick }) => {
  const transfers = quick ? 100_000 : 1_000_000
  const runs = quick ? 7 : 15
  const depths = [0.01, 0.1, 0.9].map((share) => Math.round(transfers * share))
  const services = await startBenchServices()
  // Seeding and the deepest OFFSET take longer than the gateway's 5 s statement timeout.
  const db = createPgDatabase({ connectionString: services.databaseUrl, max: 2, statementTimeoutMs: 600_000 })
  try {
    await migrate(db)
    const seeded = await timed(() => seed(db, transfers))
    console.error(`history: ${transfers} transfers seeded in ${(seeded.ms / 1000).toFixed(1)} s`)
    const results = []
    for (const depth of depths) {
      const after = await positionAt(db, depth)
      const keyset: Contender = {
        run: () => listTransactions(db, 1, PAGE, after),
        sql: historyQuery(true),
        params: [1, PAGE + 1, after.createdAt, after.transferId],
      }
      const offset: Contender = {
        run: () => db.query(OFFSET_QUERY, [1, depth, PAGE]),
        sql: OFFSET_QUERY,
        params: [1, depth, PAGE],
      }
      // Both read the same page (keyset also reads the one row more that says a page follows).
      const page = await listTransactions(db, 1, PAGE, after)
      const rows = await db.query<{ id: string }>(OFFSET_QUERY, [1, depth, PAGE])
      const same = page.items.map((i) => i.transferId).join() === rows.map((r) => Number(r.id)).join()
      if (!same || page.items.length !== PAGE) throw new Error(`keyset and OFFSET disagree at depth ${depth}`)
      const measured = await compare(db, keyset, offset, runs)
      results.push({ depth, ...measured })
      console.error(
        `history: depth ${depth}: keyset ${ms(measured.keysetMs.server)}, OFFSET ${ms(measured.offsetMs.server)} (execution)`,
      )
    }
    const deepest = depths.at(-1)!
    const after = await positionAt(db, deepest)
    const plans = {
      keyset: await explain(db, historyQuery(true), [1, PAGE + 1, after.createdAt, after.transferId]),
      offset: await explain(db, OFFSET_QUERY, [1, deepest, PAGE]),
    }
    const markdown = [
      `One account with ${transfers.toLocaleString('en-US')} transfers (half sent, half received), pages of ${PAGE}: ` +
        "the page after `depth` rows by keyset (the gateway's query) and by OFFSET on the same two indexes. " +
        `Median of ${runs} interleaved runs (min-max): Postgres's execution time (\`EXPLAIN (ANALYZE, TIMING OFF)\`) ` +
        'and the time around the pg call in the client; a ratio is the median of the per-run ratios.',
      '',
      formatTable(
        [
          'depth',
          'keyset',
          'OFFSET',
          'OFFSET / keyset',
          'keyset (client)',
          'OFFSET (client)',
          'OFFSET / keyset (client)',
        ],
        results.map((r) => [
          r.depth.toLocaleString('en-US'),
          ms(r.keysetMs.server),
          ms(r.offsetMs.server),
          times(r.offsetOverKeyset.server),
          ms(r.keysetMs.client),
          ms(r.offsetMs.client),
          times(r.offsetOverKeyset.client),
        ]),
      ),
      '',
      `Keyset at depth ${deepest.toLocaleString('en-US')}, \`EXPLAIN (ANALYZE, BUFFERS)\`:`,
      '',
      '```',
      plans.keyset,
      '```',
      '',
      `OFFSET at the same depth:`,
      '',
      '```',
      plans.offset,
      '```',
    ].join('\n')
    return {
      title: 'Transaction history: keyset vs OFFSET paging at depth',
      markdown,
      data: { transfers, page: PAGE, runs, seedSeconds: seeded.ms / 1000, results, plans },
      // Latency ratios in the hundreds: they would flatten the throughput chart, so none are charted.
      ratios: [],
    }
  } finally {
    await db.close()
    await services.stop()
  }
}

export default history
