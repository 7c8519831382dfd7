import assert from 'node:assert/strict'
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import http from 'node:http'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type RouteHandlerMethod } from 'fastify'
import { Redis } from 'ioredis'
import pg from 'pg'
import { freePort, type RedisServerProcess, startRedisServer } from '../../src/embedded/redis-server.ts'
import { notificationKeys } from '../../src/events/notifier.ts'
import { idempotency, redis as redisPlugin } from '../../src/index.ts'
import { SAME_SIGNAL_WINDOW_MS, SECOND_SIGNAL_EXIT_CODE } from '../../src/shutdown.ts'
import {
  createCustomer,
  createTestDatabase,
  gatewayKeyPrefix,
  ledgerInvariants,
  type TestCustomer,
  type TestDatabase,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { scanKeys, TEST_SECRET, uniquePrefix } from '../helpers/index.ts'
import { RUN_TYPESCRIPT } from '../helpers/tsx.ts'

// Rolling deploys (docs/demo/operations.md): real gateway processes get SIGTERM. /ready fails at once while
// the rest is served; clients retrying with Idempotency-Key see every transfer done exactly once and no
// reset during the drain; the workers finish or hand back what they hold, so nothing waits for a timeout.

interface Gateway {
  child: ChildProcess
  url: string
  port: number
  exited: Promise<number | null>
  output(): string
}

const children: ChildProcess[] = []
after(() => {
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
})

/** Spawns `node --conditions=fastify-redis-gateway:source --import tsx <script>` and resolves once it listens (its URL from its output). */
function spawnGateway(script: string, env: Record<string, string>, ready: RegExp): Promise<Gateway> {
  return spawnListening(spawn(process.execPath, [...RUN_TYPESCRIPT, script], spawnOptions(env)), ready)
}

function spawnOptions(env: Record<string, string>) {
  return {
    env: { PATH: process.env.PATH, HOME: process.env.HOME, SESSION_SECRET: TEST_SECRET, ...env },
    stdio: ['ignore', 'pipe', 'pipe'] as ['ignore', 'pipe', 'pipe'],
  }
}

function spawnListening(child: ChildProcess, ready: RegExp): Promise<Gateway> {
  children.push(child)
  let output = ''
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  return new Promise((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = ready.exec(output)
      if (match?.[1]) {
        const url = match[1]
        resolve({ child, url, port: Number(new URL(url).port), exited, output: () => output })
      }
    }
    child.stdout?.on('data', onData)
    child.stderr?.on('data', onData)
    exited.then((code) => reject(new Error(`gateway exited ${code}: ${output}`)))
  })
}

const LISTENING = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/

async function serverEnv(env: Record<string, string>): Promise<Record<string, string>> {
  const port = await freePort()
  return { NODE_ENV: 'test', LOG_LEVEL: 'info', SEED_DEMO: 'false', PORT: String(port), ...env }
}

/** `src/server.ts` as `npm start` runs it, on a free port. */
async function startServer(env: Record<string, string>): Promise<Gateway> {
  return spawnGateway('src/server.ts', await serverEnv(env), LISTENING)
}

/** `npm start` itself, leading its own process group as in a terminal or a systemd unit. */
async function npmStart(env: Record<string, string>): Promise<Gateway> {
  const options = spawnOptions({ ...(await serverEnv(env)), npm_config_update_notifier: 'false' })
  return spawnListening(spawn('npm', ['start'], { ...options, detached: true }), LISTENING)
}

/** Pino's `time` of the first log line containing `message` (this machine's clock). */
function loggedAt(gateway: Gateway, message: string): number | undefined {
  const line = gateway
    .output()
    .split('\n')
    .find((l) => l.includes(message))
  return line ? (JSON.parse(line) as { time: number }).time : undefined
}

interface Answer {
  status: number
  headers: http.IncomingHttpHeaders
  body: string
}

function request(
  agent: http.Agent,
  url: string,
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: unknown,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body)
    const req = http.request(
      `${url}${path}`,
      {
        method,
        agent,
        headers: { ...headers, ...(payload ? { 'content-type': 'application/json' } : {}) },
      },
      (res) => {
        let text = ''
        res.setEncoding('utf8')
        res.on('data', (chunk) => {
          text += chunk
        })
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }))
        res.on('error', reject)
      },
    )
    req.on('error', reject)
    req.end(payload)
  })
}

async function loginCookie(url: string, customer: TestCustomer): Promise<string> {
  const res = await fetch(`${url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: customer.username, password: customer.password }),
  })
  assert.equal(res.status, 200, await res.text())
  return res.headers.get('set-cookie')!.split(';')[0]!
}

async function waitFor<T>(what: string, check: () => Promise<T | undefined | false>, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value) return value as T
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

describe('shutdown on SIGTERM', { skip: USE_PGLITE && 'needs a database shared across processes' }, () => {
  let redis: RedisServerProcess
  let database: TestDatabase
  before(async () => {
    // A private Redis: server.ts writes unprefixed keys, and the instances here must share them.
    redis = await startRedisServer()
    database = await createTestDatabase()
  })
  after(async () => {
    await database?.drop()
    await redis?.stop()
  })

  test('GET /ready answers 503 during the drain while the other routes answer; a second signal exits at once', async () => {
    const customer = await createCustomer(database.db, `ready-${randomUUID().slice(0, 8)}`, [1000, 1000])
    const gateway = await startServer({
      REDIS_URL: redis.url,
      DATABASE_URL: database.url!,
      SHUTDOWN_DRAIN: '60s',
    })
    const cookie = await loginCookie(gateway.url, customer)
    assert.equal((await fetch(`${gateway.url}/ready`)).status, 200)
    gateway.child.kill('SIGTERM')
    const ready = await waitFor(
      '/ready to fail',
      async () => {
        const res = await fetch(`${gateway.url}/ready`)
        return res.status === 503 ? res : undefined
      },
      10_000,
    )
    assert.match(ready.headers.get('content-type') ?? '', /^application\/problem\+json/)
    assert.equal(ready.headers.get('retry-after'), '1')
    const problem = (await ready.json()) as { type: string; detail: string }
    assert.equal(problem.type, '/problems/not-ready')
    assert.equal(problem.detail, 'This instance is shutting down.')
    // Still serving: liveness, reads and writes.
    assert.equal((await fetch(`${gateway.url}/health`)).status, 200)
    const accounts = await fetch(`${gateway.url}/accounts`, { headers: { cookie } })
    assert.equal(accounts.status, 200)
    const transfer = await fetch(`${gateway.url}/transfers`, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/json', 'idempotency-key': randomUUID() },
      body: JSON.stringify({
        fromAccountId: customer.accountIds[0],
        toAccountId: customer.accountIds[1],
        amount: 1,
        currency: 'VND',
      }),
    })
    assert.equal(transfer.status, 201, await transfer.text())
    assert.equal((await fetch(`${gateway.url}/ready`)).status, 503)
    // The drain would last a minute: a second signal, later than the same signal delivered twice
    // would arrive, does not wait for it.
    const drainingAt = loggedAt(gateway, 'shutting down: draining')
    assert.ok(drainingAt, gateway.output())
    await sleep(Math.max(0, drainingAt + SAME_SIGNAL_WINDOW_MS + 200 - Date.now()))
    gateway.child.kill('SIGTERM')
    assert.equal(await gateway.exited, SECOND_SIGNAL_EXIT_CODE)
  })

  test('`npm start` stopped by SIGTERM to its whole process group drains once and exits 0', async (t) => {
    const gateway = await npmStart({
      REDIS_URL: redis.url,
      DATABASE_URL: database.url!,
      SHUTDOWN_DRAIN: '5s',
    })
    const pgid = gateway.child.pid!
    t.after(() => {
      // On failure: whatever is left of the group (npm killed by a signal can leave the gateway).
      if (gateway.child.exitCode === 0) return
      try {
        process.kill(-pgid, 'SIGKILL')
      } catch {}
    })
    assert.equal((await fetch(`${gateway.url}/ready`)).status, 200)
    // What Ctrl-C, systemd's KillMode=control-group and `kill -TERM -PGID` do: npm and the gateway
    // both get it, and npm relays it to the gateway too.
    process.kill(-pgid, 'SIGTERM')
    await waitFor('/ready to fail', async () => (await fetch(`${gateway.url}/ready`)).status === 503, 10_000)
    assert.equal((await fetch(`${gateway.url}/health`)).status, 200, 'still serving during the drain')
    assert.equal(await gateway.exited, 0, gateway.output())
    assert.ok(loggedAt(gateway, 'shutting down: closing'), 'the drain ran to its end')
  })

  test('a second SIGTERM within a second is the same shutdown: the drain still runs, exit 0', async () => {
    const gateway = await startServer({
      REDIS_URL: redis.url,
      DATABASE_URL: database.url!,
      SHUTDOWN_DRAIN: '5s',
    })
    assert.equal((await fetch(`${gateway.url}/ready`)).status, 200)
    gateway.child.kill('SIGTERM')
    // The second once the first is handled: the kernel merges a signal sent while the same one is pending.
    await waitFor('the drain', async () => loggedAt(gateway, 'shutting down: draining'), 10_000)
    gateway.child.kill('SIGTERM')
    await waitFor('/ready to fail', async () => (await fetch(`${gateway.url}/ready`)).status === 503, 10_000)
    assert.equal((await fetch(`${gateway.url}/health`)).status, 200, 'still serving during the drain')
    assert.equal(await gateway.exited, 0, gateway.output())
    assert.ok(loggedAt(gateway, 'the same shutdown, ignored'), 'the repeated signal was seen')
  })

  test('closing with a request still running releases its idempotency claim: a retry elsewhere runs at once', async (t) => {
    const client = new Redis(redis.url)
    const prefix = uniquePrefix('idem')
    const build = async (handler: RouteHandlerMethod) => {
      const app = Fastify()
      await app.register(redisPlugin, { redis: client })
      await app.register(idempotency, { keyPrefix: prefix, scope: () => 'everyone' })
      app.post('/slow', { config: { idempotency: true } }, handler)
      await app.ready()
      return app
    }
    const call = { method: 'POST' as const, url: '/slow', headers: { 'idempotency-key': 'k1' }, payload: {} }
    let started!: () => void
    const running = new Promise<void>((resolve) => {
      started = resolve
    })
    let finish!: () => void
    const finished = new Promise<void>((resolve) => {
      finish = resolve
    })
    const first = await build(async (_request, reply) => {
      started()
      await finished
      return reply.code(201).send({ run: 1 })
    })
    t.after(async () => {
      finish()
      await client.quit()
    })
    const inFlight = first.inject(call)
    await running
    assert.equal((await scanKeys(client, prefix)).length, 1, 'claimed while the handler runs')
    // The process closes while the handler still runs (its request cut by the shutdown).
    await first.close()
    assert.deepEqual(await scanKeys(client, prefix), [], 'the claim is released on close')
    finish()
    await inFlight
    // A retry on another instance runs at once: no 409 until the lease would have ended.
    const second = await build(async (_request, reply) => reply.code(201).send({ run: 2 }))
    const retry = await second.inject(call)
    assert.equal(retry.statusCode, 201)
    assert.deepEqual(retry.json(), { run: 2 })
    await second.close()
  })

  test('a request still running at the end of the grace period is cut, its claim released: the retry elsewhere gets 201, once', async (t) => {
    const [from, to] = await Promise.all([
      createCustomer(database.db, `cut-a-${randomUUID().slice(0, 8)}`),
      createCustomer(database.db, `cut-b-${randomUUID().slice(0, 8)}`),
    ])
    const env = {
      REDIS_URL: redis.url,
      DATABASE_URL: database.url!,
      SHUTDOWN_DRAIN: '0s',
      SHUTDOWN_GRACE: '500ms',
    }
    const [a, b] = await Promise.all([startServer(env), startServer(env)])
    const probe = new Redis(redis.url)
    const locker = new pg.Client({ connectionString: database.url })
    await locker.connect()
    t.after(async () => {
      await locker.end()
      await probe.quit()
      b.child.kill('SIGTERM')
      await b.exited
      if (a.child.exitCode === null) a.child.kill('SIGKILL')
    })
    const cookie = await loginCookie(a.url, from)
    const key = randomUUID()
    const send = (url: string, agent: http.Agent) =>
      request(
        agent,
        url,
        'POST',
        '/transfers',
        { cookie, 'idempotency-key': key },
        {
          fromAccountId: from.accountIds[0],
          toAccountId: to.accountIds[0],
          amount: 10,
          currency: 'VND',
        },
      )
    // The sender's account row is locked here: the transfer on a waits for it, past the grace period.
    await locker.query('BEGIN')
    await locker.query('SELECT id FROM accounts WHERE id = $1 FOR UPDATE', [from.accountIds[0]])
    // Idempotency records being processed (claimed, not completed) in this Redis, under the
    // database's identity: Hashes (a
    // completed record, such as the first test's transfer, is a String).
    const claimed = async () => {
      let n = 0
      for (const k of await probe.keys('*idem:*'))
        if ((await probe.type(k)) === 'hash' && (await probe.hget(k, 'state')) === 'processing') n++
      return n
    }
    const agent = new http.Agent({ keepAlive: true })
    const cut = send(a.url, agent).then(
      (answer) => ({ answer }),
      (err: NodeJS.ErrnoException) => ({ error: err.code ?? err.message }),
    )
    await waitFor('the claim', async () => (await claimed()) > 0, 10_000)
    a.child.kill('SIGTERM')
    assert.deepEqual(await cut, { error: 'ECONNRESET' }, 'cut at the end of the grace period')
    await waitFor('the claim released', async () => (await claimed()) === 0, 10_000)
    await locker.query('ROLLBACK')
    // The retry elsewhere runs at once (no 409 until a lease ends); the database guard keeps it once.
    const retry = await send(b.url, agent)
    assert.equal(retry.status, 201, retry.body)
    agent.destroy()
    assert.equal(await a.exited, 0, a.output())
    const [row] = await database.db.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM transfers WHERE idempotency_key = $1',
      [key],
    )
    assert.equal(row!.n, 1, 'one transfer for the key')
  })

  test('two instances under load, one stopped mid-load: every transfer once, no reset during the drain, exit 0 in time', async () => {
    const customers: TestCustomer[] = []
    for (let i = 0; i < 8; i++)
      customers.push(
        await createCustomer(database.db, `load-${i}-${randomUUID().slice(0, 8)}`, [1_000_000_000]),
      )
    const env = {
      REDIS_URL: redis.url,
      DATABASE_URL: database.url!,
      SHUTDOWN_DRAIN: '1s',
      SHUTDOWN_GRACE: '5s',
    }
    const [a, b] = await Promise.all([startServer(env), startServer(env)])
    const gateways = [a, b] as const
    const cookies = await Promise.all(customers.map((c, i) => loginCookie(gateways[i % 2]!.url, c)))
    const agents = gateways.map(() => new http.Agent({ keepAlive: true, maxSockets: 8 }))

    let stopSent = 0
    let exitedAfterMs: number | null = null
    // Connection errors from instance a, by phase: during the drain none is allowed.
    const errors: Array<{ code: string; at: number }> = []
    const statuses = new Map<number, number>()
    const keys: string[] = []
    let done = 0

    const transferOnce = async (i: number) => {
      const key = randomUUID()
      keys.push(key)
      const from = customers[i % customers.length]!
      const to = customers[(i + 1) % customers.length]!
      const body = {
        fromAccountId: from.accountIds[0],
        toAccountId: to.accountIds[0],
        amount: 1,
        currency: 'VND',
      }
      const headers = { cookie: cookies[i % customers.length]!, 'idempotency-key': key }
      let target = i % 2
      for (let attempt = 0; attempt < 50; attempt++) {
        try {
          const res = await request(
            agents[target]!,
            gateways[target]!.url,
            'POST',
            '/transfers',
            headers,
            body,
          )
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
          if (res.status === 201) return
          if (res.status === 503) target = 1 - target
          else if (res.status === 409) await sleep(100)
          else throw new Error(`transfer answered ${res.status}: ${res.body}`)
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message
          if (target === 0 && stopSent) errors.push({ code, at: Date.now() })
          if (!(err as NodeJS.ErrnoException).code && !/socket hang up/.test((err as Error).message))
            throw err
          // A connection error: the same request, same key, on the other instance.
          target = 1 - target
        }
      }
      throw new Error(`transfer ${key} never got 201`)
    }

    const aExited = a.exited.then((code) => {
      exitedAfterMs = Date.now() - stopSent
      return code
    })
    let extraAfterExit = 0
    const worker = async (w: number) => {
      for (let i = w; ; i += 8) {
        if (exitedAfterMs !== null && extraAfterExit++ > 40) return
        if (i > 4000) return
        await transferOnce(i)
        done++
        if (done === 60 && !stopSent) {
          stopSent = Date.now()
          a.child.kill('SIGTERM')
        }
      }
    }
    await Promise.all(Array.from({ length: 8 }, (_, w) => worker(w)))
    const code = await aExited
    for (const agent of agents) agent.destroy()

    assert.equal(code, 0, a.output())
    // When the drain ended: the instance logs it before it closes.
    const closedAt = loggedAt(a, 'shutting down: closing')
    assert.ok(closedAt, 'the drain ended and the instance closed')
    const errorsDuringDrain = errors
      .filter((e) => e.at < closedAt)
      .map((e) => `${e.code} +${e.at - stopSent}ms`)
    const errorsAfterDrain = errors.filter((e) => e.at >= closedAt).map((e) => e.code)
    assert.ok(
      exitedAfterMs !== null && exitedAfterMs < 1000 + 5000,
      `exited ${exitedAfterMs} ms after SIGTERM`,
    )
    assert.deepEqual(errorsDuringDrain, [], 'no connection error while draining')
    // Exactly one transfer per key, each key's transfer present.
    const rows = await database.db.query<{ idempotency_key: string; n: number }>(
      'SELECT idempotency_key, count(*)::int AS n FROM transfers WHERE idempotency_key = ANY($1) GROUP BY 1',
      [keys],
    )
    assert.equal(rows.length, keys.length, 'a transfer for every key')
    assert.ok(
      rows.every((r) => r.n === 1),
      'one transfer per key',
    )
    const invariants = await ledgerInvariants(database.db)
    assert.equal(invariants.totalUnchanged, true)
    assert.equal(invariants.unbalancedTransfers, 0)
    assert.equal(invariants.accountsNotMatchingLedger, 0)
    b.child.kill('SIGTERM')
    assert.equal(await b.exited, 0)
    // Reported for the reader: how the load met the shutdown.
    console.log({ transfers: keys.length, statuses: Object.fromEntries(statuses), errorsAfterDrain })
  })

  test('SIGTERM while the relay, the notifier and the scheduler hold work: nothing lost, doubled or left for a timeout', async (context) => {
    const prefix = uniquePrefix('sd')
    // Timeouts far beyond the test: only a finished or handed-back item can explain a run elsewhere.
    const tuning = {
      transfers: {
        moveIntervalMs: 100,
        heartbeatTtlMs: 600_000,
        visibilityTimeoutMs: 600_000,
        reconcileIntervalMs: 600_000,
      },
      reconciliation: { periodMs: 3_600_000 },
    }
    const env = {
      DATABASE_URL: database.url!,
      REDIS_URL: redis.url,
      LOG_LEVEL: 'warn',
      RATE_LIMITS: 'off',
      OUTBOX_RELAY_INTERVAL: '100ms',
      SHUTDOWN_DRAIN: '200ms',
      SHUTDOWN_GRACE: '5s',
      TEST_KEY_PREFIX: prefix,
      TEST_SCHEDULER: JSON.stringify(tuning),
      // Stream entries too: only a hand-back (a read cut off by the stop included) lets another take them.
      TEST_EVENT_CONSUMER: JSON.stringify({ visibilityTimeoutMs: 600_000 }),
      // Every notification of the run stays on its stream, so the count below can reach the expected one.
      NOTIFICATIONS_RETENTION: '100000',
    }
    const start = () => spawnGateway('test/helpers/shutdown-gateway.ts', env, /READY (\S+)/)
    const [a, b] = await Promise.all([start(), start()])
    const keyPrefix = await gatewayKeyPrefix(database.db, prefix)
    let c: Gateway | null = null
    context.after(async () => {
      for (const g of [a, b, c]) {
        if (!g || g.child.exitCode !== null) continue
        g.child.kill('SIGTERM')
        await g.exited
      }
    })
    const customers: TestCustomer[] = []
    for (let i = 0; i < 6; i++)
      customers.push(
        await createCustomer(database.db, `work-${i}-${randomUUID().slice(0, 8)}`, [1_000_000_000]),
      )
    const customerIds = customers.map((x) => x.customerId)
    // Sessions on b: the schedules go into b's delayed set, so a's stop (not an adoption) decides.
    const cookies = await Promise.all(customers.map((x) => loginCookie(b.url, x)))
    const post = (url: string, path: string, i: number, extra: Record<string, unknown> = {}) =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          cookie: cookies[i % 6]!,
          'idempotency-key': randomUUID(),
        },
        body: JSON.stringify({
          fromAccountId: customers[i % 6]!.accountIds[0],
          toAccountId: customers[(i + 1) % 6]!.accountIds[0],
          amount: 1 + i,
          currency: 'VND',
          ...extra,
        }),
      })
    const base = Date.now() + 5000
    const scheduleCount = 120
    for (let i = 0; i < scheduleCount; i += 20) {
      await Promise.all(
        Array.from({ length: 20 }, async (_, j) => {
          const res = await post(b.url, '/scheduled-transfers', i + j, {
            // Still in the future when it arrives if creating them took longer than planned.
            runAt: new Date(Math.max(base + ((i + j) % 60) * 50, Date.now() + 2000)).toISOString(),
          })
          assert.equal(res.status, 201, await res.text())
        }),
      )
    }
    const completed = async () => {
      const [row] = await database.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM scheduled_transfers WHERE status = 'completed' AND from_account_id = ANY($1)",
        [customers.map((x) => x.accountIds[0])],
      )
      return row!.n
    }
    // Immediate transfers on both instances keep the relay and the notifiers busy meanwhile (a
    // bounded number: a fast machine would otherwise make thousands).
    let stop = false
    const load = (async () => {
      for (let i = 0; !stop && i < 2000; i++) {
        const target = i % 2 === 0 ? a : b
        if (target === a && a.child.exitCode !== null) continue
        await post(target.url, '/transfers', i).catch(() => {})
      }
    })()
    await waitFor('the first completions', async () => (await completed()) >= 10, 30_000)
    a.child.kill('SIGTERM')
    assert.equal(await a.exited, 0, a.output())
    stop = true
    await load
    // After the restart: a new instance joins b.
    c = await start()
    await waitFor('every schedule completed', async () => (await completed()) === scheduleCount, 60_000)

    const [runs] = await database.db.query<{ n: number; transfers: number }>(
      `SELECT count(*)::int AS n, count(DISTINCT transfer_id)::int AS transfers FROM scheduled_transfers
         WHERE from_account_id = ANY($1)`,
      [customers.map((x) => x.accountIds[0])],
    )
    assert.deepEqual(runs, { n: scheduleCount, transfers: scheduleCount }, 'each schedule ran exactly once')

    // Every committed transfer of these customers: one notification to each side, none twice.
    const transfers = await database.db.query<{ id: number; from_customer: number; to_customer: number }>(
      `SELECT t.id, fa.customer_id AS from_customer, ta.customer_id AS to_customer
         FROM transfers t JOIN accounts fa ON fa.id = t.from_account_id JOIN accounts ta ON ta.id = t.to_account_id
         WHERE fa.customer_id = ANY($1)`,
      [customerIds],
    )
    // An instance that joins while the others relay must not take the database for a restored one.
    assert.equal(await gatewayKeyPrefix(database.db, prefix), keyPrefix, 'the database kept its identity')
    const probe = new Redis(redis.url)
    try {
      const expected = new Set<string>()
      for (const t of transfers) {
        expected.add(`${t.from_customer}:transfer.sent:${t.id}`)
        expected.add(`${t.to_customer}:transfer.received:${t.id}`)
      }
      const seen = async () => {
        const got: string[] = []
        for (const id of customerIds) {
          const entries = (await probe.xrange(notificationKeys(keyPrefix, id).stream, '-', '+')) as Array<
            [string, string[]]
          >
          for (const [, fields] of entries) {
            const f: Record<string, string> = {}
            for (let i = 0; i + 1 < fields.length; i += 2) f[fields[i]!] = fields[i + 1]!
            got.push(`${id}:${f.event}:${(JSON.parse(f.data ?? '{}') as { transferId: number }).transferId}`)
          }
        }
        return got
      }
      let latest: string[] = []
      const got = await waitFor(
        'every notification',
        async () => {
          latest = await seen()
          return latest.length >= expected.size ? latest : undefined
        },
        90_000,
      ).catch((error: Error) => {
        const missing = [...expected].filter((x) => !latest.includes(x))
        throw new Error(
          `${error.message}: ${latest.length} of ${expected.size}, missing ${missing.slice(0, 10).join(', ')}`,
        )
      })
      assert.equal(new Set(got).size, got.length, 'no notification twice')
      assert.deepEqual(new Set(got), expected, 'one notification per transfer and side')
      const [pending] = (await probe.xpending(`${keyPrefix}events:transfers`, 'notifier')) as [number]
      assert.equal(pending, 0, 'no stream entry left pending')
      const [unrelayed] = await database.db.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM outbox_events',
      )
      assert.equal(unrelayed!.n, 0, 'every outbox event relayed')
    } finally {
      await probe.quit()
    }
  })
})
