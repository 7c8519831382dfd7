// The transactional outbox on POST /transfers: the gateway with OUTBOX=on EVENT_WORKERS=on (the
// transfer statement writes an outbox row; the relay and the notifier of this process move it to
// events:transfers and to the customers' notification streams) against the gateway with OUTBOX=off
// EVENT_WORKERS=off, interleaved, on the same database, Redis and accounts. During the outbox-on
// rounds a few recipients keep GET /notifications (SSE) open on that server, and each transfer to
// them is timed from its 201 at the load generator to its `transfer.received` message, and from its
// createdAt; then every committed transfer is checked to have been notified to both customers.
import { randomUUID } from 'node:crypto'
import { request as httpRequest } from 'node:http'
import autocannon from 'autocannon'
import { Redis } from 'ioredis'
import pg from 'pg'
import { createPgDatabase } from '../../src/db/database.ts'
import { hashPassword } from '../../src/ledger/passwords.ts'
import {
  formatTable,
  median,
  ratio,
  type Sample,
  type ServerHandle,
  type Summary,
  startServer,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices } from '../lib/services.ts'
import { BENCH_SECRET, GATEWAY_ENTRY } from '../servers/cache-cluster.ts'

const TARGET = 0.9
const CUSTOMERS = 16
/** Customers (every fourth of the ring) whose notifications are streamed: "a few recipients". */
const WATCHED = [0, 4, 8, 12]
const CONNECTIONS = 20
const PASSWORD = 'bench-password'
const STREAM = 'events:transfers'

interface BenchCustomer {
  cookie: string
  accountId: number
}

/** Seeded as load/scenarios/idempotency.ts does: one funded VND account each, logged in. */
async function benchCustomers(databaseUrl: string, url: string, count: number): Promise<BenchCustomer[]> {
  const db = createPgDatabase({ connectionString: databaseUrl })
  const hash = await hashPassword(PASSWORD)
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
        body: JSON.stringify({ username, password: PASSWORD }),
      })
      const cookie = response.headers.getSetCookie()[0]?.split(';')[0]
      if (response.status !== 200 || !cookie)
        throw new Error(`login of ${username} failed: ${response.status}`)
      return { cookie, accountId }
    }),
  )
}

/** A notification as it arrived at the SSE client: when (both clocks) and what it said. */
interface Arrival {
  at: number
  wallAt: number
  occurredAt: string
}

interface SseStream {
  /** `transfer.received` messages by transfer id. */
  received: Map<number, Arrival>
  sent: number
  close(): void
}

/**
 * GET /notifications on a connection of its own (test/events-sse.ts's approach): resolves once the
 * server said `: connected`; each `transfer.received` is timestamped when its frame is parsed.
 */
function openNotifications(url: string, cookie: string, received: Map<number, Arrival>): Promise<SseStream> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/notifications`, { headers: { cookie }, agent: false })
    req.on('error', reject)
    req.on('response', (res) => {
      if (res.statusCode !== 200) {
        reject(new Error(`GET /notifications answered ${res.statusCode}`))
        res.resume()
        return
      }
      const stream: SseStream = { received, sent: 0, close: () => req.destroy() }
      let pending = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => {
        const at = performance.now()
        const wallAt = Date.now()
        pending += chunk
        let cut = pending.indexOf('\n\n')
        while (cut >= 0) {
          const frame = pending.slice(0, cut)
          pending = pending.slice(cut + 2)
          cut = pending.indexOf('\n\n')
          if (frame === ': connected') resolve(stream)
          let event = ''
          let data = ''
          for (const line of frame.split('\n')) {
            if (line.startsWith('event: ')) event = line.slice(7)
            else if (line.startsWith('data: ')) data = line.slice(6)
          }
          if (event === 'transfer.sent') stream.sent++
          if (event !== 'transfer.received') continue
          const body = JSON.parse(data) as { transferId: number; occurredAt: string }
          if (!received.has(body.transferId))
            received.set(body.transferId, { at, wallAt, occurredAt: body.occurredAt })
        }
      })
      res.on('error', () => {})
    })
    req.end()
  })
}

/** A 201 as the load generator saw it. */
interface Created {
  transferId: number
  toAccountId: number
  createdAt: string
  at: number
}

const quantile = (sorted: number[], q: number) =>
  sorted.length ? sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]! : NaN

const spread = (values: number[]) => ({
  median: median(values),
  min: Math.min(...values),
  max: Math.max(...values),
})

const events: Scenario = async ({ quick }) => {
  const services = await startBenchServices()
  const servers: ServerHandle[] = []
  const streams: SseStream[] = []
  const db = new pg.Client({ connectionString: services.databaseUrl })
  const redis = new Redis(services.redisUrl)
  try {
    const env = {
      REDIS_URL: services.redisUrl,
      DATABASE_URL: services.databaseUrl,
      SESSION_SECRET: BENCH_SECRET,
      // Transfers only: no rate limit rejects the load, no scheduler polls in the background.
      RATE_LIMITS: 'off',
      SCHEDULER: 'off',
    }
    // The first server migrates and seeds; the second starts on the same database after it.
    const outboxOn = await startServer(GATEWAY_ENTRY, { ...env, OUTBOX: 'on', EVENT_WORKERS: 'on' })
    servers.push(outboxOn)
    const outboxOff = await startServer(GATEWAY_ENTRY, { ...env, OUTBOX: 'off', EVENT_WORKERS: 'off' })
    servers.push(outboxOff)
    await db.connect()

    // Sessions live in the shared Redis: a cookie from one server is valid on the other.
    const customers = await benchCustomers(services.databaseUrl, outboxOn.url, CUSTOMERS)
    const watchedAccounts = new Set(WATCHED.map((i) => customers[i]!.accountId))
    const received = new Map<number, Arrival>()
    for (const i of WATCHED)
      streams.push(await openNotifications(outboxOn.url, customers[i]!.cookie, received))

    const durationSec = quick ? 1 : 5
    const rounds = quick ? 2 : 7
    let next = 0
    /** One autocannon run of POST /transfers (new key each, customer i pays i+1, 1 VND). */
    const run = async (url: string, seconds: number, created: Created[] | null): Promise<Sample> => {
      const result = await autocannon({
        url: `${url}/transfers`,
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        connections: CONNECTIONS,
        duration: seconds,
        requests: [
          {
            setupRequest: (request) => {
              const i = next++ % customers.length
              const from = customers[i]!
              const to = customers[(i + 1) % customers.length]!
              return {
                ...request,
                headers: { ...request.headers, cookie: from.cookie, 'idempotency-key': randomUUID() },
                body: JSON.stringify({
                  fromAccountId: from.accountId,
                  toAccountId: to.accountId,
                  amount: 1,
                  currency: 'VND',
                }),
              }
            },
            // Both servers' responses are parsed alike (same load-generator cost); only the
            // outbox-on rounds keep them.
            onResponse: (status, body) => {
              const at = performance.now()
              if (status !== 201) return
              const t = JSON.parse(body) as Omit<Created, 'at'>
              created?.push({
                transferId: t.transferId,
                toAccountId: t.toAccountId,
                createdAt: t.createdAt,
                at,
              })
            },
          },
        ],
      })
      return {
        rps: result.requests.average,
        p50: result.latency.p50,
        p99: result.latency.p99,
        requests: result.requests.total,
        non2xx: result.non2xx,
        errors: result.errors,
        timeouts: result.timeouts,
      }
    }

    const count = async (sql: string) => Number((await db.query<{ n: string }>(sql)).rows[0]!.n)
    /** Entries of the notifier group delivered and not acknowledged, or not yet delivered. */
    const notifierBehind = async () => {
      const groups = (await redis.xinfo('GROUPS', STREAM).catch(() => [])) as unknown[][]
      let behind = 0
      for (const info of groups) {
        const fields = new Map<string, unknown>()
        for (let i = 0; i + 1 < info.length; i += 2) fields.set(String(info[i]), info[i + 1])
        behind += Number(fields.get('pending') ?? 0) + Number(fields.get('lag') ?? 0)
      }
      return behind
    }
    /**
     * Before the next run: transfers autocannon left in flight have committed, every outbox row is
     * relayed and notified, and the watched recipients have their messages, so no round pays for
     * the previous one's event work.
     */
    const settle = async (expected: Created[]) => {
      const deadline = Date.now() + 60_000
      let last = -1
      for (;;) {
        const transfers = await count('SELECT count(*) AS n FROM transfers')
        const backlog = await count('SELECT count(*) AS n FROM outbox_events WHERE relayed_at IS NULL')
        const behind = await notifierBehind()
        const missing = expected.filter((c) => !received.has(c.transferId)).length
        if (transfers === last && backlog === 0 && behind === 0 && missing === 0) return
        if (Date.now() > deadline) {
          console.error(
            `events: not settled after 60 s (backlog ${backlog}, notifier ${behind}, missing ${missing})`,
          )
          return
        }
        last = transfers
        await new Promise((resolve) => setTimeout(resolve, 300))
      }
    }

    const contenders = [
      { name: 'OUTBOX=on, EVENT_WORKERS=on', url: outboxOn.url, on: true },
      { name: 'OUTBOX=off, EVENT_WORKERS=off', url: outboxOff.url, on: false },
    ]
    for (const c of contenders) {
      await run(c.url, quick ? 1 : 2, null)
      await settle([])
    }
    const samples = new Map<string, Sample[]>(contenders.map((c) => [c.name, []]))
    /** 201s of the outbox-on rounds addressed to a watched recipient. */
    const watched: Created[] = []
    let createdOn = 0
    for (let round = 0; round < rounds; round++) {
      const order = round % 2 === 0 ? contenders : [...contenders].reverse()
      for (const c of order) {
        const created: Created[] = []
        const sample = await run(c.url, durationSec, c.on ? created : null)
        samples.get(c.name)!.push(sample)
        const mine = created.filter((t) => watchedAccounts.has(t.toAccountId))
        if (c.on) {
          createdOn += created.length
          watched.push(...mine)
        }
        await settle(mine)
        const bad = sample.non2xx + sample.errors + sample.timeouts
        console.error(
          `events round ${round + 1}/${rounds} ${c.name}: ${Math.round(sample.rps)} req/s, p99 ${sample.p99} ms${bad ? `, ${bad} non-2xx/errors` : ''}`,
        )
      }
    }
    const summaries: Summary[] = contenders.map((c) => {
      const list = samples.get(c.name)!
      return {
        name: c.name,
        rps: spread(list.map((s) => s.rps)),
        p99: spread(list.map((s) => s.p99)),
        samples: list,
      }
    })
    const [on, off] = summaries as [Summary, Summary]
    const outboxRatio = ratio(on, off)

    // Delay to the recipient's SSE message, per transfer to a watched recipient.
    const fromResponse: number[] = []
    const fromCreatedAt: number[] = []
    let beforeResponse = 0
    for (const t of watched) {
      const arrival = received.get(t.transferId)
      if (!arrival) continue
      const delay = arrival.at - t.at
      if (delay < 0) beforeResponse++
      fromResponse.push(delay)
      fromCreatedAt.push(arrival.wallAt - Date.parse(t.createdAt))
    }
    fromResponse.sort((a, b) => a - b)
    fromCreatedAt.sort((a, b) => a - b)
    const missingWatched = watched.length - fromResponse.length
    const delay = (sorted: number[]) => ({
      measured: sorted.length,
      p50Ms: quantile(sorted, 0.5),
      p99Ms: quantile(sorted, 0.99),
      maxMs: sorted.at(-1) ?? NaN,
    })
    const delays = { fromResponse: delay(fromResponse), fromCreatedAt: delay(fromCreatedAt) }

    // Every transfer committed with the outbox on (warm-up and requests autocannon left in flight
    // included) has its event relayed and a notification marker for its recipient and its sender.
    const scanCount = async (match: string) => {
      let cursor = '0'
      let n = 0
      do {
        const [nextCursor, keys] = await redis.scan(cursor, 'MATCH', match, 'COUNT', 1000)
        cursor = nextCursor
        n += keys.length
      } while (cursor !== '0')
      return n
    }
    const completeness = {
      transfers: await count('SELECT count(*) AS n FROM transfers'),
      outboxEvents: await count('SELECT count(*) AS n FROM outbox_events'),
      unrelayed: await count('SELECT count(*) AS n FROM outbox_events WHERE relayed_at IS NULL'),
      notifiedRecipient: await scanCount('notified:*:transfer.received'),
      notifiedSender: await scanCount('notified:*:transfer.sent'),
      deadLetters: await redis.xlen(`${STREAM}:dead`),
      created201OutboxOn: createdOn,
      watchedCreated: watched.length,
      watchedNotified: fromResponse.length,
      watchedMissing: missingWatched,
      watchedSseBeforeResponse: beforeResponse,
      watchedSentMessages: streams.reduce((n, s) => n + s.sent, 0),
    }
    const everyNotified =
      completeness.unrelayed === 0 &&
      completeness.deadLetters === 0 &&
      completeness.notifiedRecipient === completeness.outboxEvents &&
      completeness.notifiedSender === completeness.outboxEvents &&
      missingWatched === 0

    const cell = (s: { median: number; min: number; max: number }, digits = 0) =>
      `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})`
    const bad = (s: Summary) => s.samples.reduce((n, x) => n + x.non2xx + x.errors + x.timeouts, 0)
    const ms = (v: number) => (Number.isFinite(v) ? `${v.toFixed(1)}` : 'n/a')
    const markdown = [
      formatTable(
        [
          'POST /transfers, new key each',
          'req/s median (min-max)',
          'p99 ms median (min-max)',
          'non-2xx or errors',
        ],
        [on, off].map((s) => [s.name, cell(s.rps), cell(s.p99, 1), bad(s)]),
      ),
      '',
      formatTable(
        ['ratio of req/s', 'median', 'min', 'max', 'verdict'],
        [
          [
            'outbox on / off',
            `${outboxRatio.median.toFixed(2)}x`,
            `${outboxRatio.min.toFixed(2)}x`,
            `${outboxRatio.max.toFixed(2)}x`,
            `>= ${TARGET}x: ${outboxRatio.median >= TARGET ? 'met' : 'NOT met'}`,
          ],
        ],
      ),
      '',
      formatTable(
        [
          'delay to the recipient’s SSE `transfer.received`, outbox-on rounds',
          'measured',
          'p50 ms',
          'p99 ms',
          'max ms',
        ],
        [
          [
            'from the 201 at the load generator',
            delays.fromResponse.measured,
            ms(delays.fromResponse.p50Ms),
            ms(delays.fromResponse.p99Ms),
            ms(delays.fromResponse.maxMs),
          ],
          [
            'from the transfer’s createdAt',
            delays.fromCreatedAt.measured,
            ms(delays.fromCreatedAt.p50Ms),
            ms(delays.fromCreatedAt.p99Ms),
            ms(delays.fromCreatedAt.maxMs),
          ],
        ],
      ),
      '',
      formatTable(
        [
          'transfers committed with OUTBOX=on',
          'relayed',
          'notified to the recipient',
          'notified to the sender',
          'dead letters',
          '201s to watched recipients',
          'their SSE messages',
          'missing',
          'every transfer notified',
        ],
        [
          [
            completeness.outboxEvents,
            completeness.outboxEvents - completeness.unrelayed,
            completeness.notifiedRecipient,
            completeness.notifiedSender,
            completeness.deadLetters,
            completeness.watchedCreated,
            completeness.watchedNotified,
            completeness.watchedMissing,
            everyNotified ? 'yes' : 'NO',
          ],
        ],
      ),
      '',
      `${quick ? 'Quick run: ' : ''}${rounds} interleaved rounds of ${durationSec} s (ratio: median of the per-round ratios), ` +
        `${CONNECTIONS} connections, ${CUSTOMERS} customers each paying the next 1 VND per request with a new Idempotency-Key, ` +
        'the demo gateway (`load/servers/gateway.ts`, RATE_LIMITS=off, SCHEDULER=off) twice on one Redis and one database. ' +
        `During the outbox-on rounds ${WATCHED.length} recipients keep GET /notifications open on that server (SSE clients in ` +
        'the load generator\u2019s process); the delay is timed per transfer to them from its 201 as autocannon parsed it ' +
        '(after COMMIT; negative when the message beat the response: ' +
        `${beforeResponse} of ${fromResponse.length}) and, on the wall clock, from its createdAt (the transaction\u2019s ` +
        'now(), taken before the account locks and COMMIT, so this one overstates). Each run waits until its transfers ' +
        'are committed, relayed and notified before the next. Completeness counts the notifier\u2019s markers ' +
        '(`notified:{customer}:<eventId>:transfer.*`) over every transfer with an outbox event, warm-ups and requests ' +
        'in flight at a run\u2019s end included.',
    ].join('\n')
    return {
      title: 'Transactional outbox on POST /transfers, and commit-to-SSE delay',
      markdown,
      data: {
        transfers: { outboxOn: on, outboxOff: off, ratio: outboxRatio, target: TARGET },
        delays,
        completeness: { ...completeness, everyNotified },
        watchedCustomers: WATCHED.length,
      },
      ratios: [
        {
          label: 'outbox on / off',
          median: outboxRatio.median,
          min: outboxRatio.min,
          max: outboxRatio.max,
          target: TARGET,
        },
      ],
    }
  } finally {
    for (const s of streams) s.close()
    redis.disconnect()
    await db.end().catch(() => {})
    for (const server of servers) await server.stop()
    await services.stop()
  }
}

export default events
