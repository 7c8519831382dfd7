// Realistic transfer load: 10,000 customers with one funded VND account each, each signed in, and
// POST /transfers between random pairs (a new Idempotency-Key each), then a hot account (every
// customer paying one merchant). Each phase is measured on the demo gateway and, as a reference,
// with pgbench running the gateway's own transfer statement (TRANSFER_SQL) with the same
// parameters and the same number of clients. The gateway runs in two placements (PLACEMENTS): beside
// the load generator, so that Postgres has its CPU to itself as under pgbench (the verdict: how much
// of Postgres's throughput the gateway reaches), and beside Postgres, sharing its CPU (reported:
// what HTTP, sessions, idempotency, cache invalidation and Node cost next to the statement itself).
import { createHash, randomInt, randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import pg from 'pg'
import { DEFAULT_POOL_MAX } from '../../src/db/database.ts'
import type { RatioBar } from '../lib/chart.ts'
import { type CpuCost, costOf, costSpread } from '../lib/cpu-cost.ts'
import { pinBesideLoadGenerator, pinned, pinUnderTest } from '../lib/cpus.ts'
import { type Seeded, seedCustomers, signInCustomers } from '../lib/customers.ts'
import {
  PGBENCH_MISSING,
  type PgbenchRun,
  pgbenchAvailable,
  runPgbench,
  transferStatementForPgbench,
} from '../lib/pgbench.ts'
import {
  formatTable,
  type LoadSpec,
  measure,
  median,
  type Sample,
  type ServerHandle,
  spread,
  startServer,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices, vacuumTransferTables } from '../lib/services.ts'
import {
  compareGenerators,
  generatorReport,
  measureWrkTransfers,
  WRK_MISSING,
  wrkAvailable,
} from '../lib/wrk.ts'
import { BENCH_SECRET } from '../servers/cache-cluster.ts'

const CUSTOMERS = 10_000
const CONNECTIONS = 20
/**
 * pgbench clients: as many as the gateway's Postgres connections (its pool), so both keep the same
 * number of transfers in flight in Postgres. Each client is a backend; on one CPU, 20 of them ran
 * about 30 % fewer transfers/s than 10 here (more backends preempted while holding locks).
 */
const PGBENCH_CLIENTS = DEFAULT_POOL_MAX
const OPENING_BALANCE = 1_000_000_000
const TARGET = 0.8
/** The gateway with GET /__bench/counters (statements and requests), configured by the environment. */
const entry = new URL('../servers/chain.ts', import.meta.url).pathname
/** pgbench sends one fingerprint for all its transfers: the gateway's are sha256 hex, as long as this. */
const PGBENCH_FINGERPRINT = createHash('sha256').update('pgbench').digest('hex')

interface Counters {
  dbQueries: number
  requests: number
}

async function counters(url: string): Promise<Counters> {
  return (await (await fetch(`${url}/__bench/counters`)).json()) as Counters
}

/** autocannon stops without waiting for answers: wait until the transfers still queued have run. */
async function settle(url: string): Promise<Counters> {
  let last = await counters(url)
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 200))
    const now = await counters(url)
    if (now.dbQueries === last.dbQueries) return now
    last = now
  }
}

async function transferCount(db: pg.Client): Promise<number> {
  const { rows } = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM transfers')
  return rows[0]!.n
}

interface Phase {
  name: string
  /** The same pairs in load/lib/wrk-transfers.lua. */
  wrkPair: 'random' | 'hot'
  /** The pair of one request: account indexes 0..CUSTOMERS-1. */
  pair(): [number, number]
  /** pgbench meta-commands choosing the same pair (ids, not indexes). */
  pgbench(seeded: Seeded): string[]
}

const PHASES: Phase[] = [
  {
    name: 'random pairs',
    wrkPair: 'random',
    pair() {
      const from = randomInt(CUSTOMERS)
      const to = randomInt(CUSTOMERS - 1)
      return [from, to >= from ? to + 1 : to]
    },
    pgbench: ({ first, last }) => [
      `\\set from_account_id random(${first}, ${last})`,
      `\\set to_account_id random(${first}, ${last - 1})`,
      '\\set to_account_id :to_account_id + case when :to_account_id >= :from_account_id then 1 else 0 end',
    ],
  },
  {
    // Every customer but the merchant (account index 0) pays the merchant: one row lock for all.
    name: 'hot account',
    wrkPair: 'hot',
    pair: () => [1 + randomInt(CUSTOMERS - 1), 0],
    pgbench: ({ first, last }) => [
      `\\set from_account_id random(${first + 1}, ${last})`,
      `\\set to_account_id ${first}`,
    ],
  },
]

/**
 * Where the gateway (its process and its redis-server) runs. pgbench's clients run on the load
 * generator's CPU and leave Postgres the CPU under test to itself; "beside the load generator" gives
 * the gateway that same place, so both drive the same Postgres on the same CPU. "Beside Postgres" is
 * the placement of the other scenarios: everything under test on one CPU, where the gateway's own
 * CPU per transfer, not Postgres, sets the ceiling. Unpinned, there is one placement: the scheduler's.
 */
interface Placement {
  name: string
  key: string
  pin(pid: number): void
}
const PLACEMENTS: Placement[] = pinned
  ? [
      { name: 'beside the load generator', key: 'besideLoadGenerator', pin: pinBesideLoadGenerator },
      { name: 'beside Postgres', key: 'besidePostgres', pin: pinUnderTest },
    ]
  : [{ name: 'unpinned', key: 'unpinned', pin: () => {} }]
/**
 * The gateway's runs in each round: each placement with autocannon, and the first (where the load
 * generator shares the gateway's CPU, so its own cost counts) with wrk as well. The target is
 * judged on the first.
 */
interface GatewayRun {
  name: string
  key: string
  placement: Placement
  generator: 'autocannon' | 'wrk'
}
const GATEWAY_RUNS: GatewayRun[] = PLACEMENTS.flatMap((placement, i) => [
  { name: placement.name, key: placement.key, placement, generator: 'autocannon' as const },
  ...(i === 0 && wrkAvailable
    ? [{ name: `${placement.name}, wrk`, key: `${placement.key}Wrk`, placement, generator: 'wrk' as const }]
    : []),
])
const VERDICT = GATEWAY_RUNS[0]!

interface GatewaySample extends Sample {
  statementsPerRequest: number
  cost: CpuCost
}

const transfers: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  let server: ServerHandle | undefined
  const db = new pg.Client({ connectionString: services.databaseUrl })
  const redis = new Redis(services.redisUrl)
  const cookieDir = mkdtempSync(join(tmpdir(), 'transfers-'))
  const cookieFile = join(cookieDir, 'cookies.txt')
  try {
    // The demo gateway as shipped (idempotency, sessions, cache invalidation, the outbox row in the
    // transfer statement) but no rate limits (10,000 customers from one IP), no scheduler, and no
    // event workers: the relay would drain the outbox on the CPU under test, and pgbench has none.
    const env = {
      REDIS_URL: services.redisUrl,
      DATABASE_URL: services.databaseUrl,
      SESSION_SECRET: BENCH_SECRET,
      RATE_LIMITS: 'off',
      SCHEDULER: 'off',
      EVENT_WORKERS: 'off',
    }
    server = await startServer(entry, env)
    const redisPid = Number(/process_id:(\d+)/.exec(await redis.info('server'))?.[1])
    await db.connect()
    const seeded = await seedCustomers(db, CUSTOMERS, OPENING_BALANCE)
    const cookies = await signInCustomers(services.redisUrl, env, seeded)
    const check = await fetch(`${server.url}/accounts`, { headers: { cookie: cookies[CUSTOMERS - 1]! } })
    const listed = (await check.json()) as { accounts?: Array<{ accountId: number }> }
    if (check.status !== 200 || listed.accounts?.[0]?.accountId !== seeded.last)
      throw new Error(`a seeded session does not work: ${check.status} ${JSON.stringify(listed)}`)

    const durationSec = quick ? 1 : 5
    const rounds = quick ? 2 : 5
    const gatewaySpec = (phase: Phase): LoadSpec => ({
      method: 'POST',
      path: '/transfers',
      headers: { 'content-type': 'application/json' },
      setupRequest: (request) => {
        const [from, to] = phase.pair()
        return {
          ...request,
          headers: { ...request.headers, cookie: cookies[from]!, 'idempotency-key': randomUUID() },
          body: JSON.stringify({
            fromAccountId: seeded.first + from,
            toAccountId: seeded.first + to,
            amount: 1,
            currency: 'VND',
          }),
        }
      },
      connections: CONNECTIONS,
      durationSec,
    })
    const statement = transferStatementForPgbench()
    const pgbenchScript = (phase: Phase) =>
      [
        ...phase.pgbench(seeded),
        `\\set customer_id :from_account_id + ${seeded.customerOffset}`,
        // A new key per transfer, as the gateway's clients send (digits instead of a UUID).
        '\\set idempotency_key random(1, 9223372036854775806)',
        statement,
      ].join('\n')
    const define = { amount: '1', currency: 'VND', request_fingerprint: PGBENCH_FINGERPRINT, outbox: 'true' }

    const probes = { redis, serverPid: server.pid, units: () => transferCount(db) }
    // wrk's script reads the cookies from a file, one per account index.
    writeFileSync(cookieFile, `${cookies.join('\n')}\n`)
    const load = (run: GatewayRun, phase: Phase, seconds: number) =>
      run.generator === 'wrk'
        ? measureWrkTransfers(server!.url, {
            cookieFile,
            firstAccountId: seeded.first,
            pair: phase.wrkPair,
            connections: CONNECTIONS,
            durationSec: seconds,
          })
        : measure(server!.url, { ...gatewaySpec(phase), durationSec: seconds })
    const runGateway = async (
      run: GatewayRun,
      phase: Phase,
      seconds = durationSec,
    ): Promise<GatewaySample> => {
      run.placement.pin(server!.pid)
      run.placement.pin(redisPid)
      const before = await settle(server!.url)
      await vacuumTransferTables(db)
      // The CPU window closes once the transfers still queued at the deadline have run.
      const { result: sample, cost } = await costOf(probes, async () => {
        const sample = await load(run, phase, seconds)
        await settle(server!.url)
        return sample
      })
      const after = await counters(server!.url)
      const statementsPerRequest = (after.dbQueries - before.dbQueries) / (after.requests - before.requests)
      return { ...sample, statementsPerRequest, cost }
    }
    let pgbenchCpus = ''
    const runReference = async (
      phase: Phase,
      seconds = durationSec,
    ): Promise<PgbenchRun & { cost: CpuCost }> => {
      await vacuumTransferTables(db)
      const { result: run, cost } = await costOf(probes, () =>
        runPgbench({
          databaseUrl: services.databaseUrl,
          script: pgbenchScript(phase),
          clients: PGBENCH_CLIENTS,
          durationSec: seconds,
          define,
        }),
      )
      pgbenchCpus = run.cpus
      // Every pgbench transaction must have been a transfer, not a refusal the script cannot see.
      if (cost.units !== run.transactions)
        throw new Error(`pgbench ran ${run.transactions} statements but ${cost.units} transfers were made`)
      return { ...run, cost }
    }

    // Warm-up: the gateway's code paths in each of its runs and both phases' plans.
    for (const phase of PHASES) {
      for (const run of GATEWAY_RUNS) await runGateway(run, phase, 1)
      if (pgbenchAvailable) await runReference(phase, 1)
    }
    const gatewayKey = (phase: Phase, run: GatewayRun) => `${phase.name} ${run.key}`
    const gateway = new Map<string, GatewaySample[]>(
      PHASES.flatMap((p) => GATEWAY_RUNS.map((run) => [gatewayKey(p, run), []])),
    )
    const reference = new Map<string, Array<PgbenchRun & { cost: CpuCost }>>(PHASES.map((p) => [p.name, []]))
    const runs: Array<GatewayRun | 'pgbench'> = [...GATEWAY_RUNS, 'pgbench']
    for (let round = 0; round < rounds; round++) {
      for (const phase of PHASES) {
        const order = round % 2 === 0 ? runs : [...runs].reverse()
        for (const who of order) {
          if (who !== 'pgbench') {
            const sample = await runGateway(who, phase)
            gateway.get(gatewayKey(phase, who))!.push(sample)
            const bad = sample.non2xx + sample.errors + sample.timeouts
            console.error(
              `transfers round ${round + 1}/${rounds} ${phase.name}, gateway ${who.name}: ${Math.round(sample.rps)} transfers/s, p99 ${sample.p99} ms${bad ? `, ${bad} non-2xx/errors` : ''}`,
            )
          } else if (pgbenchAvailable) {
            const run = await runReference(phase)
            reference.get(phase.name)!.push(run)
            console.error(
              `transfers round ${round + 1}/${rounds} ${phase.name}, pgbench: ${Math.round(run.tps)} transfers/s, p99 ${run.p99.toFixed(1)} ms`,
            )
          }
        }
      }
    }

    const { rows: ledger } = await db.query<{
      conserved: boolean
      negative: number
      mismatched: number
      transfers: number
    }>(
      `SELECT (SELECT sum(balance) = sum(opening_balance) FROM accounts) AS conserved,
              (SELECT count(*)::int FROM accounts WHERE balance < 0) AS negative,
              (SELECT count(*)::int FROM accounts a WHERE a.balance <> a.opening_balance +
                 coalesce((SELECT sum(amount) FROM ledger_entries e WHERE e.account_id = a.id), 0)) AS mismatched,
              (SELECT count(*)::int FROM transfers) AS transfers`,
    )
    const invariants = ledger[0]!

    const gatewayStats = (g: GatewaySample[]) => ({
      transfersPerSecond: spread(g.map((s) => s.rps)),
      p50: spread(g.map((s) => s.p50)),
      p99: spread(g.map((s) => s.p99)),
      statementsPerTransfer: median(g.map((s) => s.statementsPerRequest)),
      cpu: costSpread(g.map((s) => s.cost)),
      failures: g.reduce((n, s) => n + s.non2xx + s.errors + s.timeouts, 0),
      samples: g,
    })
    const results = PHASES.map((phase) => {
      const r = reference.get(phase.name)!
      return {
        phase: phase.name,
        pgbench: r.length
          ? {
              transfersPerSecond: spread(r.map((x) => x.tps)),
              p50: spread(r.map((x) => x.p50)),
              p99: spread(r.map((x) => x.p99)),
              cpu: costSpread(r.map((x) => x.cost)),
              failed: r.reduce((n, x) => n + x.failed, 0),
              samples: r,
            }
          : null,
        runs: GATEWAY_RUNS.map((run) => {
          const g = gateway.get(gatewayKey(phase, run))!
          const ratios = r.length ? g.map((s, i) => s.rps / r[i]!.tps) : []
          return {
            name: run.name,
            key: run.key,
            placement: run.placement.key,
            generator: run.generator,
            gateway: gatewayStats(g),
            ratio: ratios.length ? { ...spread(ratios), ratios } : null,
          }
        }),
      }
    })

    const cell = (s: { median: number; min: number; max: number }, digits = 0) =>
      `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})`
    const cpuCells = (c: ReturnType<typeof costSpread>) => [
      `${Math.round(c.busy * 100)} %`,
      c.underTestMicros.toFixed(0),
      pinned ? `${Math.round(c.loadGeneratorBusy * 100)} %` : 'n/a',
      c.serverMicros.toFixed(0),
      c.redisMicros.toFixed(0),
    ]
    const rows = results.flatMap((r) => [
      ...r.runs.map((run) => [
        `${r.phase}, gateway ${run.name}`,
        cell(run.gateway.transfersPerSecond),
        cell(run.gateway.p50, 1),
        cell(run.gateway.p99, 1),
        run.gateway.statementsPerTransfer.toFixed(2),
        ...cpuCells(run.gateway.cpu),
        run.gateway.failures,
      ]),
      r.pgbench
        ? [
            `${r.phase}, pgbench`,
            cell(r.pgbench.transfersPerSecond),
            cell(r.pgbench.p50, 1),
            cell(r.pgbench.p99, 1),
            '1.00',
            ...cpuCells(r.pgbench.cpu),
            r.pgbench.failed,
          ]
        : [`${r.phase}, pgbench`, 'not run', '', '', '', '', '', '', '', '', ''],
    ])
    // Where the load generator shares the gateway's CPU its own cost counts: the same ratio with wrk.
    const generators = results.flatMap((r) => {
      const byAutocannon = r.runs.find((run) => run.key === VERDICT.key)?.ratio
      const byWrk = r.runs.find((run) => run.generator === 'wrk')?.ratio
      return byAutocannon && byWrk
        ? [compareGenerators(`${r.phase}: gateway ${VERDICT.name} / pgbench`, byAutocannon, byWrk)]
        : []
    })
    const judged = (phase: string, key: string) => phase === 'random pairs' && key === VERDICT.key
    const ratioRows = results.flatMap((r) =>
      r.runs.map((run) => [
        `${r.phase}: gateway ${run.name} / pgbench`,
        run.ratio ? `${run.ratio.median.toFixed(2)}x` : 'n/a',
        run.ratio ? `${run.ratio.min.toFixed(2)}x` : '',
        run.ratio ? `${run.ratio.max.toFixed(2)}x` : '',
        judged(r.phase, run.key)
          ? run.ratio
            ? `>= ${TARGET}x: ${run.ratio.median >= TARGET ? 'met' : 'NOT met'}`
            : 'not measured'
          : 'reported',
      ]),
    )
    const reading = (r: (typeof results)[number], run: (typeof results)[number]['runs'][number]) => {
      const ours = run.gateway.cpu
      const theirs = r.pgbench!.cpu
      const head = `- ${r.phase}, gateway ${run.name}: `
      return run.placement === 'besideLoadGenerator'
        ? `${head}Postgres, alone on the CPU under test with the kernel, spends ${ours.underTestMicros.toFixed(0)} µs per gateway ` +
            `transfer against ${theirs.underTestMicros.toFixed(0)} µs per pgbench transfer; the load generator's CPU, which also ran ${run.generator}, the ` +
            `gateway (${ours.serverMicros.toFixed(0)} µs per transfer) and its redis-server (${ours.redisMicros.toFixed(0)} µs), was ` +
            `${Math.round(ours.loadGeneratorBusy * 100)} % busy, and Postgres's ${Math.round(ours.busy * 100)} %.`
        : `${head}the CPUs under test (Postgres, Redis and the gateway share them) spend ` +
            `${ours.underTestMicros.toFixed(0)} µs per gateway transfer (${ours.serverMicros.toFixed(0)} in the ` +
            `gateway process, ${ours.redisMicros.toFixed(0)} in redis-server, the rest in Postgres and the kernel), ` +
            `against ${theirs.underTestMicros.toFixed(0)} µs per pgbench transfer: where they are ` +
            `saturated, transfers/s can be at most ${(theirs.underTestMicros / ours.underTestMicros).toFixed(2)}x pgbench's.`
    }
    const markdown = [
      formatTable(
        [
          'POST /transfers, new key each',
          'transfers/s median (min-max)',
          'p50 ms median (min-max)',
          'p99 ms median (min-max)',
          'Postgres statements/transfer',
          'CPU under test busy (median)',
          'CPU under test µs/transfer (median)',
          "load generator's CPU busy (median)",
          'gateway process µs/transfer',
          'redis-server µs/transfer',
          'non-2xx, errors or failed',
        ],
        rows,
      ),
      '',
      formatTable(['ratio of transfers/s', 'median', 'min', 'max', 'target'], ratioRows),
      '',
      ...results.flatMap((r) => (r.pgbench ? r.runs.map((run) => reading(r, run)) : [])),
      '',
      ...(generators.length ? [generatorReport(generators), ''] : []),
      ...(wrkAvailable ? [] : [WRK_MISSING, '']),
      `${quick ? 'Quick run: ' : ''}${rounds} interleaved rounds of ${durationSec} s per phase (ratio: median of the per-round ratios), ` +
        `${CONNECTIONS} connections (gateway: autocannon, and wrk where named, one thread, HTTP keep-alive; its Postgres pool has ${DEFAULT_POOL_MAX}) and ${PGBENCH_CLIENTS} pgbench clients, as many as the gateway's Postgres connections ` +
        `(one thread, prepared statement as the gateway's, CPUs ${pgbenchCpus || 'n/a'}). ${CUSTOMERS.toLocaleString('en')} customers with one VND account ` +
        'each, each with a session created in Redis as login creates it; 1 VND per transfer, a new Idempotency-Key each. ' +
        'Random pairs: any account to any other; hot account: every other customer pays the first one. pgbench runs ' +
        'TRANSFER_SQL of src/ledger/ledger.ts with the same parameters (its keys are random integers, its fingerprint a ' +
        'constant sha256 hex). Gateway: RATE_LIMITS=off, SCHEDULER=off, EVENT_WORKERS=off (outbox rows written, not relayed, as by pgbench). ' +
        (pinned
          ? 'The gateway process and its redis-server are moved (taskset) before each of its runs: beside the load generator, ' +
            "Postgres has the CPU under test to itself, as under pgbench, whose clients run on the load generator's CPU; " +
            'beside Postgres, the three share it, as in the other scenarios.'
          : 'Unpinned: the gateway, Redis, Postgres and the load generators share every CPU.'),
      '',
      `Ledger after the run: ${invariants.transfers.toLocaleString('en')} transfers; total of balances ${invariants.conserved ? 'unchanged' : 'CHANGED'}, ` +
        `${invariants.negative} negative balances, ${invariants.mismatched} accounts not equal to opening balance + entries.`,
      ...(pgbenchAvailable ? [] : ['', PGBENCH_MISSING]),
    ].join('\n')
    const ratios: RatioBar[] = results.flatMap((r) =>
      r.runs.flatMap((run) =>
        run.ratio
          ? [
              {
                label: `${r.phase}: gateway ${run.name} / pgbench`,
                median: run.ratio.median,
                min: run.ratio.min,
                max: run.ratio.max,
                ...(judged(r.phase, run.key) ? { target: TARGET } : {}),
              },
            ]
          : [],
      ),
    )
    return {
      title: 'Transfers: 10,000 accounts, random pairs and a hot account, against pgbench',
      markdown,
      data: {
        customers: CUSTOMERS,
        connections: CONNECTIONS,
        target: TARGET,
        phases: results,
        generators,
        invariants,
      },
      ratios,
    }
  } finally {
    await db.end().catch(() => {})
    redis.disconnect()
    await server?.stop()
    await services.stop()
    rmSync(cookieDir, { recursive: true, force: true })
  }
}

export default transfers
