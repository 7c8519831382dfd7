// Lateness of scheduled transfers: three gateway processes (default timings, as in production),
// N schedules due within a few seconds of each other, created through all three; lateness is the
// time from each schedule's runAt to its transfer's commit (transfers.created_at), p50 and p99.
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { hashPassword } from '../../src/ledger/passwords.ts'
import { formatTable } from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'
import { type Gateways, startGateways } from '../servers/cache-cluster.ts'

const CUSTOMERS = 20
const PASSWORD = 'bench-password'

const quantile = (sorted: number[], q: number) =>
  sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!

const scheduledTransfers: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  let gateways: Gateways | undefined
  const db = new pg.Client({ connectionString: services.databaseUrl })
  try {
    gateways = await startGateways(3, { REDIS_URL: services.redisUrl, DATABASE_URL: services.databaseUrl })
    const urls = gateways.urls
    await db.connect()
    const hash = await hashPassword(PASSWORD)
    const accounts: number[] = []
    const cookies: string[] = []
    for (let i = 0; i < CUSTOMERS; i++) {
      const username = `sched-${i}`
      const { rows } = await db.query<{ id: number }>(
        `WITH c AS (INSERT INTO customers (username, password_hash) VALUES ($1, $2) RETURNING id)
         INSERT INTO accounts (customer_id, currency, balance, opening_balance)
         SELECT id, 'VND', 1000000000, 1000000000 FROM c RETURNING id`,
        [username, hash],
      )
      accounts.push(rows[0]!.id)
      const res = await fetch(`${urls[i % urls.length]}/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username, password: PASSWORD }),
      })
      if (res.status !== 200) throw new Error(`login failed: ${res.status}`)
      cookies.push(res.headers.get('set-cookie')!.split(';')[0]!)
    }

    const count = quick ? 200 : 1000
    const spreadMs = quick ? 2000 : 5000
    const base = Date.now() + (quick ? 4000 : 8000)
    let createdLate = 0
    for (let start = 0; start < count; start += 25) {
      await Promise.all(
        Array.from({ length: Math.min(25, count - start) }, async (_, j) => {
          const i = start + j
          // runAt must be in the future when the gateway reads it: under load, creation can run
          // past the planned time, and such a schedule is due shortly after its creation instead.
          const planned = base + Math.floor((i * spreadMs) / count)
          const runAt = Math.max(planned, Date.now() + 2000)
          if (runAt > planned) createdLate++
          const res = await fetch(`${urls[i % urls.length]}/scheduled-transfers`, {
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              cookie: cookies[i % CUSTOMERS]!,
              'idempotency-key': randomUUID(),
            },
            body: JSON.stringify({
              fromAccountId: accounts[i % CUSTOMERS],
              toAccountId: accounts[(i + 1) % CUSTOMERS],
              amount: 1 + (i % 100),
              currency: 'VND',
              runAt: new Date(runAt).toISOString(),
            }),
          })
          if (res.status !== 201) throw new Error(`schedule failed: ${res.status} ${await res.text()}`)
        }),
      )
    }
    const deadline = Date.now() + spreadMs + 120_000
    for (;;) {
      const { rows } = await db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM scheduled_transfers WHERE status IN ('scheduled', 'running')",
      )
      if (rows[0]!.n === 0) break
      if (Date.now() > deadline) throw new Error(`${rows[0]!.n} schedules still pending`)
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    const { rows } = await db.query<{ late_ms: number; status: string }>(
      `SELECT s.status, extract(epoch FROM (t.created_at - s.run_at)) * 1000 AS late_ms
       FROM scheduled_transfers s LEFT JOIN transfers t ON t.id = s.transfer_id`,
    )
    const completed = rows.filter((r) => r.status === 'completed')
    const lateness = completed.map((r) => Number(r.late_ms)).sort((a, b) => a - b)
    const [{ transfers }] = (
      await db.query<{ transfers: number }>('SELECT count(*)::int AS transfers FROM transfers')
    ).rows as [{ transfers: number }]
    const stats = {
      schedules: count,
      completed: completed.length,
      transfers,
      createdPastPlannedRunAt: createdLate,
      p50Ms: Math.round(quantile(lateness, 0.5)),
      p90Ms: Math.round(quantile(lateness, 0.9)),
      p99Ms: Math.round(quantile(lateness, 0.99)),
      maxMs: Math.round(lateness.at(-1)!),
      minMs: Math.round(lateness[0]!),
    }
    const markdown = [
      `${count} schedules due within ${spreadMs / 1000} s, created through 3 gateway processes (default timings: ` +
        'the mover runs every second, 4 schedules at once per process). Lateness: `runAt` to the commit of its transfer.',
      '',
      formatTable(
        ['schedules', 'completed', 'transfers', 'p50', 'p90', 'p99', 'max'],
        [
          [
            count,
            stats.completed,
            stats.transfers,
            `${stats.p50Ms} ms`,
            `${stats.p90Ms} ms`,
            `${stats.p99Ms} ms`,
            `${stats.maxMs} ms`,
          ],
        ],
      ),
      ...(createdLate
        ? [
            '',
            `${createdLate} schedules were created too late for their planned runAt (slow creation) and were due 2 s after their creation instead.`,
          ]
        : []),
    ].join('\n')
    return {
      title: 'Scheduled transfers: lateness from runAt to execution',
      markdown,
      data: stats,
      ratios: [],
    }
  } finally {
    await db.end().catch(() => {})
    await gateways?.stop()
    await services.stop()
  }
}

export default scheduledTransfers
