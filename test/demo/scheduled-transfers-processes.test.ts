import assert from 'node:assert/strict'
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import {
  createCustomer,
  createTestDatabase,
  ledgerInvariants,
  type TestCustomer,
  type TestDatabase,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { scanKeys, TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from '../helpers/index.ts'
import { RUN_TYPESCRIPT } from '../helpers/tsx.ts'

// Three gateway processes share Postgres and Redis; one is SIGKILLed. Scheduled transfers still run
// exactly once each, and the reconciliation job never runs twice at once and survives its holder.

interface Gateway {
  child: ChildProcess
  url: string
  instanceId: string
}

function startGateway(env: Record<string, string>): Promise<Gateway> {
  const child = spawn(process.execPath, [...RUN_TYPESCRIPT, 'test/helpers/scheduled-transfers-gateway.ts'], {
    env: {
      PATH: process.env.PATH,
      LOG_LEVEL: 'warn',
      RATE_LIMITS: 'off',
      SESSION_SECRET: TEST_SECRET,
      ...env,
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  return new Promise((resolve, reject) => {
    let output = ''
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = /READY (\S+)/.exec(output)
      if (match) {
        child.stdout!.off('data', onData)
        child.stdout!.resume()
        resolve({ child, url: match[1]!, instanceId: `gw-${child.pid}` })
      }
    }
    child.stdout!.on('data', onData)
    child.once('exit', (code) => reject(new Error(`gateway exited ${code}`)))
  })
}

async function stopAll(gateways: Gateway[]) {
  await Promise.all(
    gateways.map(
      (g) =>
        new Promise<void>((resolve) => {
          if (g.child.exitCode !== null || g.child.signalCode !== null) return resolve()
          g.child.once('exit', () => resolve())
          g.child.kill('SIGKILL')
        }),
    ),
  )
}

async function kill(gateway: Gateway) {
  const exited = new Promise((resolve) => gateway.child.once('exit', resolve))
  gateway.child.kill('SIGKILL')
  await exited
}

async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | false>,
  timeoutMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value) return value as T
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

async function cleanup(database: TestDatabase, prefix: string) {
  await database.drop()
  const redis = new Redis(TEST_REDIS_URL)
  const keys = await scanKeys(redis, prefix)
  if (keys.length) await redis.del(...keys)
  await redis.quit()
}

describe('three gateway processes', {
  skip: USE_PGLITE && 'needs a database shared across processes',
}, () => {
  test('200 schedules due within seconds, one process SIGKILLed mid-run: each completes exactly once', async (t) => {
    const database = await createTestDatabase()
    const prefix = uniquePrefix('st')
    const tuning = {
      transfers: {
        moveIntervalMs: 100,
        heartbeatTtlMs: 1000,
        visibilityTimeoutMs: 5000,
        reconcileIntervalMs: 1000,
        retryDelayMs: () => 200,
      },
      reconciliation: { periodMs: 3_600_000 },
    }
    const env = {
      DATABASE_URL: database.url!,
      REDIS_URL: TEST_REDIS_URL,
      TEST_KEY_PREFIX: prefix,
      TEST_SCHEDULER: JSON.stringify(tuning),
    }
    const gateways: Gateway[] = []
    t.after(async () => {
      await stopAll(gateways)
      await cleanup(database, prefix)
    })
    for (let i = 0; i < 3; i++) gateways.push(await startGateway(env))
    const customers: TestCustomer[] = []
    for (let i = 0; i < 10; i++) customers.push(await createCustomer(database.db, `c${i}`, [1_000_000]))
    const cookies: string[] = []
    for (const [i, c] of customers.entries()) {
      const res = await fetch(`${gateways[i % 3]!.url}/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username: c.username, password: c.password }),
      })
      assert.equal(res.status, 200)
      cookies.push(res.headers.get('set-cookie')!.split(';')[0]!)
    }
    const base = Date.now() + 4000
    const expected = new Map<number, number>(customers.map((c) => [c.accountIds[0]!, 1_000_000]))
    const requests = Array.from({ length: 200 }, (_, i) => i)
    // Created through all three gateways (each queues into its own set), 20 at a time.
    for (let start = 0; start < requests.length; start += 20) {
      await Promise.all(
        requests.slice(start, start + 20).map(async (i) => {
          const from = customers[i % 10]!
          const to = customers[(i + 1) % 10]!
          const amount = 100 + i
          const res = await fetch(`${gateways[i % 3]!.url}/scheduled-transfers`, {
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              cookie: cookies[i % 10]!,
              'idempotency-key': randomUUID(),
            },
            body: JSON.stringify({
              fromAccountId: from.accountIds[0],
              toAccountId: to.accountIds[0],
              amount,
              currency: 'VND',
              // Still in the future when sent if creating them took longer than planned.
              // (2 s: a loaded machine has taken over 500 ms between here and the gateway's check.)
              runAt: new Date(Math.max(base + (i % 50) * 40, Date.now() + 2000)).toISOString(),
            }),
          })
          assert.equal(res.status, 201, await res.text())
          expected.set(from.accountIds[0]!, expected.get(from.accountIds[0]!)! - amount)
          expected.set(to.accountIds[0]!, expected.get(to.accountIds[0]!)! + amount)
        }),
      )
    }
    const completed = async () => {
      const [row] = await database.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM scheduled_transfers WHERE status = 'completed'",
      )
      return row!.n
    }
    // Mid-run: some have run, most have not.
    await waitFor('the first completions', async () => (await completed()) >= 20, 30_000)
    await kill(gateways[0]!)
    assert.ok((await completed()) < 200, 'killed before the end')
    await waitFor('every schedule completed', async () => (await completed()) === 200, 60_000)

    const rows = await database.db.query<{ n: number; distinct_transfers: number }>(
      'SELECT count(*)::int AS n, count(DISTINCT transfer_id)::int AS distinct_transfers FROM scheduled_transfers',
    )
    assert.deepEqual(rows[0], { n: 200, distinct_transfers: 200 })
    // One transfer row per schedule, with the schedule's accounts and amount, and no other.
    const [matched] = await database.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM scheduled_transfers s JOIN transfers t ON t.id = s.transfer_id
         WHERE t.from_account_id = s.from_account_id AND t.to_account_id = s.to_account_id AND t.amount = s.amount`,
    )
    assert.equal(matched!.n, 200)
    const balances = await database.db.query<{ id: number; balance: string }>(
      'SELECT id, balance FROM accounts',
    )
    for (const { id, balance } of balances) assert.equal(Number(balance), expected.get(id), `account ${id}`)
    assert.deepEqual(await ledgerInvariants(database.db), {
      totalUnchanged: true,
      negativeBalances: 0,
      unbalancedTransfers: 0,
      accountsNotMatchingLedger: 0,
      transfers: 200,
      entries: 400,
    })
  })

  test('reconciliation job: runs never overlap; after its holder is SIGKILLed it runs within one watchdog interval', async (t) => {
    const database = await createTestDatabase()
    const prefix = uniquePrefix('rj')
    const watchdogIntervalMs = 3000
    const tuning = {
      reconciliation: {
        periodMs: 300,
        maxWorkTimeMs: 1000,
        bufferMs: 500,
        watchdogIntervalMs,
        lockTtlMs: 1000,
        heartbeatTtlMs: 1000,
        moveIntervalMs: 50,
      },
    }
    const env = {
      DATABASE_URL: database.url!,
      REDIS_URL: TEST_REDIS_URL,
      TEST_KEY_PREFIX: prefix,
      TEST_SCHEDULER: JSON.stringify(tuning),
    }
    const gateways: Gateway[] = []
    type Run = { id: string; instance_id: string; fence: string; started_at: Date; finished_at: Date | null }
    const runs = () =>
      database.db.query<Run>(
        'SELECT id::text, instance_id, fence::text, started_at, finished_at FROM reconciliation_runs ORDER BY started_at',
      )
    const assertNoOverlap = (list: Run[]) => {
      for (let i = 1; i < list.length; i++) {
        const previous = list[i - 1]!
        const run = list[i]!
        assert.ok(previous.finished_at, `run ${previous.id} finished before run ${run.id} started`)
        assert.ok(previous.finished_at <= run.started_at, `run ${previous.id} overlaps run ${run.id}`)
        assert.ok(BigInt(run.fence) > BigInt(previous.fence), `fences grow (${run.id})`)
      }
    }
    t.after(async () => {
      await stopAll(gateways)
      await cleanup(database, prefix)
    })
    for (let i = 0; i < 3; i++) gateways.push(await startGateway(env))
    await createCustomer(database.db, 'c0', [1000])
    // 30 periods with three processes competing for every trigger.
    const first = await waitFor(
      '30 runs',
      async () => {
        const list = await runs()
        return list.length >= 30 && list
      },
      60_000,
    )
    assertNoOverlap(first)
    const instances = new Set(first.map((r) => r.instance_id))
    assert.ok([...instances].every((id) => gateways.some((g) => g.instanceId === id)))

    // The holder: the instance of the latest run, whose set holds the re-armed trigger.
    const latest = first.at(-1)!
    const holder = gateways.find((g) => g.instanceId === latest.instance_id)!
    await kill(holder)
    const [{ killedAt }] = (await database.db.query<{ killedAt: Date }>('SELECT now() AS "killedAt"')) as [
      { killedAt: Date },
    ]
    const next = await waitFor(
      'a run after the kill',
      async () => (await runs()).find((r) => r.started_at > killedAt && r.finished_at),
      4 * watchdogIntervalMs,
    )
    assert.notEqual(next.instance_id, holder.instanceId)
    // One watchdog tick re-seeds the token; the queue's mover (1 s) then delivers it: a bound, not a timing.
    assert.ok(
      next.started_at.getTime() - killedAt.getTime() <= watchdogIntervalMs + 1000 + 2000,
      `ran again ${next.started_at.getTime() - killedAt.getTime()} ms after the kill`,
    )
    // Some more periods with two processes, then the whole table once more.
    const count = (await runs()).length
    await waitFor('5 more runs', async () => (await runs()).length >= count + 5, 30_000)
    await stopAll(gateways)
    const all = (await runs()).filter((r) => r.finished_at)
    assertNoOverlap(all)
    const [results] = await database.db.query<{ bad: number }>(
      "SELECT count(*)::int AS bad FROM reconciliation_runs WHERE result <> 'ok'",
    )
    assert.equal(results!.bad, 0)
  })
})
