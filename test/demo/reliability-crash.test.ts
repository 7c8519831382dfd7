import assert from 'node:assert/strict'
import { type ChildProcess, spawn } from 'node:child_process'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { freePort, startRedisServer } from '../../src/embedded/redis-server.ts'
import { createCustomer, createTestDatabase, USE_PGLITE } from '../helpers/gateway.ts'
import { TEST_SECRET } from '../helpers/index.ts'
import { type Actor, mixedLoad, moneyAndKeyInvariants, settle } from '../helpers/mixed-load.ts'
import { RUN_TYPESCRIPT } from '../helpers/tsx.ts'

/** The gateway as `npm start` runs it, on a fixed port so clients can retry against the restarted one. */
function startGateway(env: Record<string, string>): Promise<ChildProcess> {
  const child = spawn(process.execPath, [...RUN_TYPESCRIPT, 'src/server.ts'], {
    env: { PATH: process.env.PATH, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  return new Promise((resolve, reject) => {
    let output = ''
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString()
      if (output.includes('Server listening at')) resolve(child)
    })
    child.once('exit', (code) => reject(new Error(`gateway exited ${code}`)))
  })
}

describe('app process crash', { skip: USE_PGLITE && 'needs a database shared across processes' }, () => {
  test('SIGKILL during transfers, then restart: invariants hold and retries complete exactly once', async (t) => {
    const database = await createTestDatabase()
    const redis = await startRedisServer()
    const port = await freePort()
    const env = {
      PORT: String(port),
      DATABASE_URL: database.url!,
      REDIS_URL: redis.url,
      SESSION_SECRET: TEST_SECRET,
      RATE_LIMITS: 'off',
      SEED_DEMO: 'false',
    }
    const url = `http://127.0.0.1:${port}`
    let gateway = await startGateway(env)
    t.after(async () => {
      gateway.kill('SIGKILL')
      await sleep(100)
      await redis.stop()
      await database.drop()
    })
    const actors: Actor[] = []
    for (let i = 0; i < 4; i++) {
      const customer = await createCustomer(database.db, `c${i}`, [1_000_000])
      const res = await fetch(`${url}/session`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username: customer.username, password: customer.password }),
      })
      actors.push({
        cookie: res.headers.get('set-cookie')!.split(';')[0]!,
        accountId: customer.accountIds[0]!,
      })
    }
    let restarting: Promise<void> | undefined
    const report = await mixedLoad(() => url, actors, {
      requests: 600,
      inFlight: 40,
      onProgress: (done) => {
        if (done !== 200) return
        const killed = gateway
        restarting = new Promise<void>((resolve) => killed.once('exit', () => resolve())).then(async () => {
          gateway = await startGateway(env)
        })
        killed.kill('SIGKILL')
      },
    })
    await restarting
    const lost = (report.statuses.get('network') ?? 0) + (report.statuses.get('timeout') ?? 0)
    assert.ok(lost > 0, 'some requests died with the process')
    await settle(() => url, report.attempts)
    const invariants = await moneyAndKeyInvariants(database.db, report.attempts)
    assert.deepEqual(
      { ...invariants, transfers: undefined, entries: undefined },
      {
        totalUnchanged: true,
        negativeBalances: 0,
        unbalancedTransfers: 0,
        accountsNotMatchingLedger: 0,
        transfers: undefined,
        entries: undefined,
        keysRunTwice: 0,
        keysAnswered201WithoutRow: 0,
        rowsWithoutA201: 0,
      },
    )
    assert.ok(invariants.transfers > 0)
  })
})
