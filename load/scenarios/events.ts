// The transactional outbox on POST /transfers: the gateway with OUTBOX=on (the transfer statement
// writes an outbox row; the relay moves it to events:transfers, the notifier to the customers'
// notification streams) against the gateway with OUTBOX=off EVENT_WORKERS=off, interleaved, on the
// same database, Redis and accounts, in three layouts: the API instance running the relay with the
// notifier in a worker instance on the load generator's CPU (the verdict: what the outbox itself
// runs), the same with the campaign groups (leaderboard, daily stats) added to the worker, then every
// worker in the API process. During the first layout's outbox-on rounds a few recipients keep
// GET /notifications (SSE) open on the API instance, and each transfer to them is timed from its 201
// at the load generator to its `transfer.received` message, and from its createdAt; then every
// committed transfer is checked to have been notified to both customers.
import { randomInt, randomUUID } from 'node:crypto'
import { request as httpRequest } from 'node:http'
import autocannon from 'autocannon'
import { Redis } from 'ioredis'
import pg from 'pg'
import { type CpuCost, costOf, costSpread } from '../lib/cpu-cost.ts'
import { pinBesideLoadGenerator } from '../lib/cpus.ts'
import { seedCustomers, signInCustomers } from '../lib/customers.ts'
import {
  formatTable,
  ratio,
  type Sample,
  type ServerHandle,
  type Summary,
  spread,
  startServer,
  summarize,
} from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'
import { startBenchServices, vacuumTransferTables } from '../lib/services.ts'
import { BENCH_SECRET, GATEWAY_ENTRY } from '../servers/cache-cluster.ts'

const TARGET = 0.9
const CUSTOMERS = 10_000
/** Customers (account indexes) whose notifications are streamed: "a few recipients". */
const WATCHED = [0, 1, 2, 3]
/** One transfer in this many pays a watched recipient, so their delays are measured by the thousand. */
const WATCHED_EVERY = 8
const CONNECTIONS = 20
/**
 * Seconds of load per contender before the rounds. The first phase meets a cold system: 10,000
 * customers' notification streams and a marker per notification created for the first time (a
 * growing Redis keyspace), empty outbox pages, relay and SSE code not yet optimized. With a few
 * seconds, or 20, its outbox-on rounds still climbed round after round and the verdict measured
 * that warm-up; a gateway that has run for a while is past it. The second phase starts on the warm
 * system with one new process.
 */
const WARMUP_SEC = { first: 60, second: 20 }
const _PASSWORD = 'bench-password'
const STREAM = 'events:transfers'

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
 * GET /notifications on a connection of its own (test/helpers/events-sse.ts's approach): resolves once the
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
    // The first server migrates and seeds; the others start on the same database after it. The
    // layout measured first (the verdict): the API instance runs the outbox relay, a worker instance
    // on the load generator's CPU (a machine of its own in production) runs the notifier.
    const api = await startServer(GATEWAY_ENTRY, { ...env, OUTBOX: 'on', EVENT_WORKERS: 'relay' })
    servers.push(api)
    const outboxOff = await startServer(GATEWAY_ENTRY, { ...env, OUTBOX: 'off', EVENT_WORKERS: 'off' })
    servers.push(outboxOff)
    const startWorker = async (workers: string) => {
      const worker = await startServer(GATEWAY_ENTRY, { ...env, EVENT_WORKERS: workers })
      servers.push(worker)
      pinBesideLoadGenerator(worker.pid)
      return worker
    }
    const notifierWorker = await startWorker('notifier')
    await db.connect()

    // Sessions live in the shared Redis: a cookie from one server is valid on the other.
    const seeded = await seedCustomers(db, CUSTOMERS, 1_000_000_000)
    const cookies = await signInCustomers(services.redisUrl, env, seeded)
    const watchedAccounts = new Set(WATCHED.map((i) => seeded.first + i))
    const received = new Map<number, Arrival>()
    for (const i of WATCHED) streams.push(await openNotifications(api.url, cookies[i]!, received))

    const durationSec = quick ? 1 : 5
    const rounds = quick ? 2 : 9
    let turn = 0
    /** A random pair of account indexes; every WATCHED_EVERY-th pays a watched recipient, in turn. */
    const pair = (): [number, number] => {
      turn++
      const to =
        turn % WATCHED_EVERY === 0 ? WATCHED[(turn / WATCHED_EVERY) % WATCHED.length]! : randomInt(CUSTOMERS)
      const from = (to + 1 + randomInt(CUSTOMERS - 1)) % CUSTOMERS
      return [from, to]
    }
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
              const [from, to] = pair()
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
      const groups = (await redis.xinfo('GROUPS', seeded.keyPrefix + STREAM).catch(() => [])) as unknown[][]
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
        const backlog = await count('SELECT count(*) AS n FROM outbox_events')
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

    /** 201s of the verdict layout's rounds addressed to a watched recipient. */
    const watched: Created[] = []
    let createdOn = 0
    type Contender = { name: string; server: ServerHandle; on: boolean }
    /** CPU cost per transfer of each contender's rounds, relay and notifications included. */
    const costs = new Map<string, CpuCost[]>()
    /** Warm-up, then `rounds` interleaved runs of each; the 201s of outbox-on runs are kept if `timed`. */
    const interleave = async (
      contenders: Contender[],
      timed: boolean,
      warmupSec: number,
    ): Promise<Summary[]> => {
      for (const c of contenders) {
        await run(c.server.url, quick ? 1 : warmupSec, null)
        await settle([])
      }
      // One round unmeasured: otherwise the first contender's first run follows the other's whole
      // warm-up (its idle pool has closed its Postgres connections) where every later run follows a
      // round's run, and the first per-round ratio came out lowest in most runs (0.54x, 0.69x).
      for (const c of contenders) {
        await run(c.server.url, durationSec, null)
        await settle([])
      }
      const samples = new Map<string, Sample[]>(contenders.map((c) => [c.name, []]))
      for (let round = 0; round < rounds; round++) {
        // Always the same order, so every run follows a run of the other server and each pays the
        // same switch. Alternating it (ABBA) had half of the runs follow their own server, and a run
        // that followed the other server's cost up to 40 % more CPU per transfer (one cause: a pool
        // idle for 10 s has closed its Postgres connections and opens new ones); the per-round
        // ratios fell into two groups and their median flipped between them from run to run.
        for (const c of contenders) {
          const created: Created[] = []
          await vacuumTransferTables(db)
          // The CPU window closes once the round's events are relayed and notified.
          const { result: sample, cost } = await costOf(
            { redis, serverPid: c.server.pid, units: () => count('SELECT count(*) AS n FROM transfers') },
            async () => {
              const sample = await run(c.server.url, durationSec, c.on && timed ? created : null)
              const mine = created.filter((t) => watchedAccounts.has(t.toAccountId))
              createdOn += created.length
              watched.push(...mine)
              await settle(mine)
              return sample
            },
          )
          samples.get(c.name)!.push(sample)
          costs.set(c.name, [...(costs.get(c.name) ?? []), cost])
          const bad = sample.non2xx + sample.errors + sample.timeouts
          console.error(
            `events round ${round + 1}/${rounds} ${c.name}: ${Math.round(sample.rps)} req/s, p99 ${sample.p99} ms, ${Math.round(cost.underTestMicros)} µs/transfer under test${bad ? `, ${bad} non-2xx/errors` : ''}`,
          )
        }
      }
      return contenders.map((c) => summarize(c.name, samples.get(c.name)!))
    }

    const offName = 'OUTBOX=off, EVENT_WORKERS=off'
    const summaries = await interleave(
      [
        { name: 'OUTBOX=on, relay in the API, notifier in a worker instance', server: api, on: true },
        { name: offName, server: outboxOff, on: false },
      ],
      true,
      WARMUP_SEC.first,
    )
    // Then the campaign groups as well, in the worker: their Redis work runs on the CPU under test.
    // Their groups start at the stream's beginning and catch up during the warm-up.
    await notifierWorker.stop()
    const campaignsWorker = await startWorker('notifier,campaigns')
    /** A reported phase: an outbox-on layout against the same off server, its SSE delays not timed. */
    const reportedPhase = async (name: string, server: ServerHandle, phase: string) => {
      const [on, off] = (await interleave(
        [
          { name, server, on: true },
          { name: `${offName} (${phase} phase)`, server: outboxOff, on: false },
        ],
        false,
        WARMUP_SEC.second,
      )) as [Summary, Summary]
      return { outboxOn: on, outboxOff: off, ratio: ratio(on, off) }
    }
    const withCampaigns = await reportedPhase(
      'OUTBOX=on, relay in the API, notifier and campaign groups in a worker instance',
      api,
      'second',
    )
    // Then every worker in the API process (EVENT_WORKERS=on), against the same off server: the
    // relay and all three consumer groups on the CPU under test.
    await campaignsWorker.stop()
    await api.stop()
    const allInOne = await startServer(GATEWAY_ENTRY, { ...env, OUTBOX: 'on', EVENT_WORKERS: 'on' })
    servers.push(allInOne)
    const oneProcess = await reportedPhase(
      'OUTBOX=on, EVENT_WORKERS=on (every worker in the API process)',
      allInOne,
      'third',
    )
    const [on, off] = summaries as [Summary, Summary]
    const outboxRatio = ratio(on, off)
    // Per round, what the CPUs under test spent on an outbox-off transfer over an outbox-on one.
    const cpuRatio = spread(
      (costs.get(on.name) ?? []).map(
        (c, round) => (costs.get(off.name)?.[round]?.underTestMicros ?? 0) / c.underTestMicros,
      ),
    )

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
      outboxEvents: await count('SELECT count(*) AS n FROM transfers WHERE has_event'),
      unrelayed: await count('SELECT count(*) AS n FROM outbox_events'),
      notifiedRecipient: await scanCount(`${seeded.keyPrefix}notified:*:transfer.received`),
      notifiedSender: await scanCount(`${seeded.keyPrefix}notified:*:transfer.sent`),
      deadLetters: await redis.xlen(`${seeded.keyPrefix}${STREAM}:dead`),
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
          'CPU under test µs/transfer (median)',
          'of which the API process',
          'of which redis-server',
        ],
        [
          on,
          off,
          withCampaigns.outboxOn,
          withCampaigns.outboxOff,
          oneProcess.outboxOn,
          oneProcess.outboxOff,
        ].map((s) => {
          const cpu = costSpread(costs.get(s.name) ?? [])
          return [
            s.name,
            cell(s.rps),
            cell(s.p99, 1),
            bad(s),
            cpu.underTestMicros.toFixed(0),
            cpu.serverMicros.toFixed(0),
            cpu.redisMicros.toFixed(0),
          ]
        }),
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
          [
            'CPU under test per transfer, off / on (the bound where saturated)',
            `${cpuRatio.median.toFixed(2)}x`,
            `${cpuRatio.min.toFixed(2)}x`,
            `${cpuRatio.max.toFixed(2)}x`,
            'reported',
          ],
          [
            'outbox on / off, campaign groups too (in the worker)',
            `${withCampaigns.ratio.median.toFixed(2)}x`,
            `${withCampaigns.ratio.min.toFixed(2)}x`,
            `${withCampaigns.ratio.max.toFixed(2)}x`,
            'reported',
          ],
          [
            'outbox on / off, every worker in the API process',
            `${oneProcess.ratio.median.toFixed(2)}x`,
            `${oneProcess.ratio.min.toFixed(2)}x`,
            `${oneProcess.ratio.max.toFixed(2)}x`,
            'reported',
          ],
        ],
      ),
      '',
      formatTable(
        [
          'delay to the recipient’s SSE `transfer.received`, first layout’s outbox-on rounds',
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
          'transfers committed with OUTBOX=on (every layout)',
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
      `${quick ? 'Quick run: ' : ''}${rounds} interleaved rounds of ${durationSec} s after warm-up load of ${quick ? 1 : WARMUP_SEC.first} s per contender in the first phase and ${quick ? 1 : WARMUP_SEC.second} s in the others, each round in the same order so that every run follows the other server\u2019s (ratio: median of the per-round ratios), ` +
        `${CONNECTIONS} connections, ${CUSTOMERS.toLocaleString('en')} customers with one VND account each (sessions created in Redis as login creates them), ` +
        `1 VND per request between random accounts (one in ${WATCHED_EVERY} to a watched recipient) with a new Idempotency-Key, ` +
        'the demo gateway (`load/servers/gateway.ts`, RATE_LIMITS=off, SCHEDULER=off) on one Redis and one database, in three ' +
        'phases against the same OUTBOX=off server. First (the verdict) what the outbox itself runs, in the layout docs/demo/events.md ' +
        'recommends under load with only the notifier in the worker: the API instance with EVENT_WORKERS=relay and a worker instance with EVENT_WORKERS=notifier, ' +
        'pinned to the load generator\u2019s CPU as a machine of its own (its Redis commands still run on the CPU under test); ' +
        'then the same with the campaign groups (leaderboard, daily stats) added to the worker (EVENT_WORKERS=notifier,campaigns); ' +
        'then one instance with every worker (EVENT_WORKERS=on) on the CPU ' +
        `under test. During the first phase\u2019s outbox-on rounds ${WATCHED.length} recipients keep GET /notifications open on the API instance (SSE clients in ` +
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
        transfers: { outboxOn: on, outboxOff: off, ratio: outboxRatio, cpuRatio, target: TARGET },
        cpu: Object.fromEntries([...costs].map(([name, c]) => [name, costSpread(c)])),
        withCampaignGroups: withCampaigns,
        everyWorkerInTheApi: oneProcess,
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
