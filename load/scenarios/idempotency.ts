// POST /transfers with the Idempotency-Key plugin against the same route without it (each request a
// new key), interleaved; then a replay storm (one key, many clients) on the plugin's server, with
// the Postgres statements it caused (expected: none) and the Redis commands per request.
import { randomUUID } from 'node:crypto'
import { createPgDatabase } from '../../src/db/database.ts'
import { hashPassword } from '../../src/ledger/passwords.ts'
import {
  gib,
  idempotencyRecordMemory,
  mib,
  processMemory,
  RECORDS_PER_DAY_AT_100_PER_S,
} from '../lib/memory.ts'
import {
  type Contender,
  CPU_PER_REQUEST_NOTE,
  commandsPerRequest,
  cpuCell,
  formatTable,
  interleave,
  type LoadSpec,
  measure,
  ratio,
  type ServerHandle,
  startServer,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices, vacuumTransferTables } from '../lib/services.ts'

const SECRET = 'bench-secret-0123456789-abcdefghijklmnop'
const TARGET = 0.9
/** Bytes of Redis one retained record may take (MEMORY USAGE of a completed transfer's record). */
const RECORD_BYTES_TARGET = 300
const CUSTOMERS = 16
const entry = new URL('../servers/idempotency-transfers.ts', import.meta.url).pathname

interface BenchCustomer {
  cookie: string
  accountId: number
}

/**
 * Customers with one funded account each, logged in: transfers go from each to the next, so the
 * load spreads over many account locks instead of queueing on one (which would measure Postgres
 * commit latency, not the plugin).
 */
async function benchCustomers(databaseUrl: string, url: string, count: number): Promise<BenchCustomer[]> {
  const db = createPgDatabase({ connectionString: databaseUrl })
  const hash = await hashPassword('bench-password')
  const created: Array<{ username: string; accountId: number }> = []
  try {
    for (let i = 0; i < count; i++) {
      const username = `bench${i}`
      const [customer] = await db.query<{ id: number }>(
        'INSERT INTO customers (username, password_hash) VALUES ($1, $2) RETURNING id',
        [username, hash],
      )
      const [account] = await db.query<{ id: number }>(
        "INSERT INTO accounts (customer_id, currency, balance, opening_balance) VALUES ($1, 'VND', $2, $2) RETURNING id",
        [customer!.id, 1_000_000_000],
      )
      created.push({ username, accountId: account!.id })
    }
  } finally {
    await db.close()
  }
  return Promise.all(
    created.map(async ({ username, accountId }) => {
      const response = await fetch(`${url}/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username, password: 'bench-password' }),
      })
      const cookie = response.headers.getSetCookie()[0]?.split(';')[0]
      if (response.status !== 200 || !cookie)
        throw new Error(`login of ${username} failed: ${response.status}`)
      return { cookie, accountId }
    }),
  )
}

const transferBody = (from: BenchCustomer, to: BenchCustomer) =>
  JSON.stringify({ fromAccountId: from.accountId, toAccountId: to.accountId, amount: 1, currency: 'VND' })

async function dbQueries(url: string): Promise<number> {
  const response = await fetch(`${url}/__bench/counters`)
  return ((await response.json()) as { dbQueries: number }).dbQueries
}

/**
 * autocannon stops at the deadline without waiting for answers, so transfers queued on the account
 * lock still run afterwards: wait until the statement count stops moving before counting again.
 */
async function settle(url: string): Promise<void> {
  let last = await dbQueries(url)
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 500))
    const now = await dbQueries(url)
    if (now === last) return
    last = now
  }
}

const idempotency: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  const servers: ServerHandle[] = []
  try {
    const env = { REDIS_URL: services.redisUrl, DATABASE_URL: services.databaseUrl, SESSION_SECRET: SECRET }
    // The first server migrates and seeds; the second starts on the same database after it.
    const withPlugin = await startServer(entry, { ...env, IDEMPOTENCY: 'on' })
    servers.push(withPlugin)
    const withoutPlugin = await startServer(entry, { ...env, IDEMPOTENCY: 'off' })
    servers.push(withoutPlugin)

    const durationSec = quick ? 1 : 5
    // Sessions live in the shared Redis, so a cookie from one server is valid on the other.
    const customers = await benchCustomers(services.databaseUrl, withPlugin.url, CUSTOMERS)
    let next = 0
    const transferSpec: LoadSpec = {
      method: 'POST',
      path: '/transfers',
      headers: { 'content-type': 'application/json' },
      // Both servers get a fresh key per request; the one without the plugin ignores it.
      setupRequest: (request) => {
        const i = next++ % customers.length
        const from = customers[i]!
        return {
          ...request,
          headers: { ...request.headers, cookie: from.cookie, 'idempotency-key': randomUUID() },
          body: transferBody(from, customers[(i + 1) % customers.length]!),
        }
      },
      connections: 20,
      durationSec,
    }
    const contenders: Contender[] = [
      { name: 'with Idempotency-Key plugin', url: withPlugin.url, pid: withPlugin.pid, spec: transferSpec },
      { name: 'without the plugin', url: withoutPlugin.url, pid: withoutPlugin.pid, spec: transferSpec },
    ]
    // Transfers are few per second and bound by Postgres commits, so rounds vary more than reads:
    // seven pairs instead of five.
    const rounds = quick ? 2 : 7
    const admin = createPgDatabase({ connectionString: services.databaseUrl, max: 1 })
    const [ours, bare] = await interleave(contenders, {
      rounds,
      warmupSec: quick ? 1 : 2,
      label: 'idempotency',
      beforeRun: () => vacuumTransferTables(admin),
      sameOrder: true,
      redisUrl: services.redisUrl,
    }).finally(() => admin.close())
    const transferRatio = ratio(ours!, bare!)

    // Replay storm: one completed transfer, then every client retries it with the same key and body.
    const storm: LoadSpec = {
      method: 'POST',
      path: '/transfers',
      headers: {
        'content-type': 'application/json',
        cookie: customers[0]!.cookie,
        'idempotency-key': `storm-${randomUUID()}`,
      },
      body: transferBody(customers[0]!, customers[1]!),
      connections: 50,
      durationSec,
    }
    const first = await fetch(withPlugin.url + storm.path, {
      method: 'POST',
      headers: storm.headers,
      body: storm.body,
    })
    if (first.status !== 201) throw new Error(`storm setup answered ${first.status}: ${await first.text()}`)
    await settle(withPlugin.url)
    const queriesBefore = await dbQueries(withPlugin.url)
    const stormSample = await measure(withPlugin.url, storm)
    const stormQueries = (await dbQueries(withPlugin.url)) - queriesBefore
    const stormCommands = await commandsPerRequest(services.redisUrl, withPlugin.url, {
      ...storm,
      durationSec: 1,
    })

    // Exact statements per transfer: sequential requests, nothing else running.
    const perTransfer = async (c: Contender) => {
      const before = await dbQueries(c.url)
      for (let i = 0; i < 20; i++) {
        const from = customers[i % customers.length]!
        await fetch(c.url + c.spec.path, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            cookie: from.cookie,
            'idempotency-key': randomUUID(),
          },
          body: transferBody(from, customers[(i + 1) % customers.length]!),
        })
      }
      return ((await dbQueries(c.url)) - before) / 20
    }
    const sqlPerTransfer = [await perTransfer(contenders[0]!), await perTransfer(contenders[1]!)]
    // Redis commands executed per transfer (scripts' inner calls included), each server alone.
    const redisPerTransfer = [
      await commandsPerRequest(services.redisUrl, withPlugin.url, {
        ...contenders[0]!.spec,
        durationSec: quick ? 1 : 2,
      }),
      await commandsPerRequest(services.redisUrl, withoutPlugin.url, {
        ...contenders[1]!.spec,
        durationSec: quick ? 1 : 2,
      }),
    ]
    // After every run: what the retained records cost Redis, and what each server holds resident.
    const recordMemory = await idempotencyRecordMemory(services.redisUrl)
    const recordMet = recordMemory.bytes.max <= RECORD_BYTES_TARGET
    const rss = { withPlugin: processMemory(withPlugin.pid), withoutPlugin: processMemory(withoutPlugin.pid) }

    const cell = (s: { median: number; min: number; max: number }, digits = 0) =>
      `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})`
    const bad = (s: typeof ours) => s!.samples.reduce((n, x) => n + x.non2xx + x.errors + x.timeouts, 0)
    const markdown = [
      formatTable(
        [
          'POST /transfers, new key each',
          'req/s median (min-max)',
          'server CPU µs/req',
          'Redis CPU µs/req',
          'p99 ms median (min-max)',
          'SQL statements/req',
          'Redis commands executed/req',
          'non-2xx or errors',
        ],
        [ours!, bare!].map((s, i) => [
          s.name,
          cell(s.rps),
          cpuCell(s.serverCpuMicros),
          cpuCell(s.redisCpuMicros),
          cell(s.p99, 1),
          sqlPerTransfer[i]!.toFixed(2),
          redisPerTransfer[i]!.toFixed(2),
          bad(s),
        ]),
      ),
      '',
      CPU_PER_REQUEST_NOTE,
      '',
      formatTable(
        ['ratio of req/s', 'median', 'min', 'max', 'target'],
        [
          [
            'with plugin / without',
            `${transferRatio.median.toFixed(2)}x`,
            `${transferRatio.min.toFixed(2)}x`,
            `${transferRatio.max.toFixed(2)}x`,
            `>= ${TARGET}x: ${transferRatio.median >= TARGET ? 'met' : 'NOT met'}`,
          ],
        ],
      ),
      '',
      formatTable(
        [
          'replay storm (one key, 50 clients)',
          'req/s',
          'p99 ms',
          'requests',
          'non-2xx or errors',
          'Postgres statements',
          'Redis commands executed/req',
        ],
        [
          [
            'replays',
            stormSample.rps.toFixed(0),
            stormSample.p99,
            stormSample.requests,
            stormSample.non2xx + stormSample.errors + stormSample.timeouts,
            stormQueries,
            stormCommands.toFixed(2),
          ],
        ],
      ),
      '',
      formatTable(
        [
          'retained idempotency records',
          'bytes/record',
          `one day at 100 transfers/s (x ${RECORDS_PER_DAY_AT_100_PER_S})`,
          'target',
        ],
        [
          [
            `MEMORY USAGE, median (min-max) of ${recordMemory.records} completed transfers`,
            `${recordMemory.bytes.median} (${recordMemory.bytes.min}-${recordMemory.bytes.max})`,
            gib(recordMemory.day.bytes),
            `<= ${RECORD_BYTES_TARGET} B: ${recordMet ? 'met' : 'NOT met'}`,
          ],
          [
            `used_memory growth over ${recordMemory.copies} copies with a TTL`,
            recordMemory.keyspaceBytes.toFixed(0),
            gib(recordMemory.day.keyspaceBytes),
            '',
          ],
        ],
      ),
      '',
      'MEMORY USAGE counts the key, the value and their allocations; Redis also keeps, per key, a main-dictionary bucket and, because every record expires, an entry in the expires dictionary: the second row (copies of the median record in an empty database) includes them.',
      '',
      formatTable(
        ['server RSS after the runs (VmRSS)', 'RSS', 'peak (VmHWM)'],
        [
          ['with Idempotency-Key plugin', mib(rss.withPlugin?.rssBytes), mib(rss.withPlugin?.peakRssBytes)],
          ['without the plugin', mib(rss.withoutPlugin?.rssBytes), mib(rss.withoutPlugin?.peakRssBytes)],
        ],
      ),
      '',
      `${quick ? 'Quick run: ' : ''}${rounds} interleaved rounds of ${durationSec} s (ratio: median of the per-round ratios), 20 connections, ${CUSTOMERS} customers each paying the next 1 VND per request.`,
    ].join('\n')
    return {
      title: 'Idempotency-Key on POST /transfers',
      markdown,
      data: {
        transfers: { withPlugin: ours, withoutPlugin: bare, ratio: transferRatio, target: TARGET },
        sqlPerTransfer: { withPlugin: sqlPerTransfer[0], withoutPlugin: sqlPerTransfer[1] },
        redisCommandsPerTransfer: { withPlugin: redisPerTransfer[0], withoutPlugin: redisPerTransfer[1] },
        replayStorm: {
          sample: stormSample,
          postgresStatements: stormQueries,
          redisCommandsPerRequest: stormCommands,
        },
        recordMemory: { ...recordMemory, target: RECORD_BYTES_TARGET, met: recordMet },
        serverMemory: rss,
      },
    }
  } finally {
    for (const server of servers) await server.stop()
    await services.stop()
  }
}

export default idempotency
