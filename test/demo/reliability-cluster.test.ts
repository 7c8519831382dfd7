import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { startRedisCluster } from '../../scripts/redis-cluster.ts'
import { buildTestApp, createCustomer, login } from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'
import { type Actor, mixedLoad, moneyAndKeyInvariants, settle } from '../helpers/mixed-load.ts'

test('six-node Redis Cluster: a primary killed mid-run fails over without losing or repeating a transfer', async (context) => {
  const cluster = await startRedisCluster(3, 1)
  const t = await buildTestApp({ RATE_LIMITS: 'off', REDIS_CLUSTER_NODES: cluster.nodesEnv, REDIS_URL: '' })
  context.after(async () => {
    await t.close()
    await cluster.stop()
  })
  const actors: Actor[] = []
  for (let i = 0; i < 6; i++) {
    const customer = await createCustomer(t.db, `c${i}`, [1_000_000])
    actors.push({ cookie: await login(t.app, customer), accountId: customer.accountIds[0]! })
  }
  const url = await listen(t.app)
  const victim = cluster.primaries[1]!.port
  // The app's client losing its connection to the victim: the failover happened during the load.
  let nodeErrors = 0
  t.redis.on('node error', () => nodeErrors++)
  const report = await mixedLoad(() => url, actors, {
    requests: 800,
    inFlight: 30,
    onProgress: (done) => (done === 200 ? cluster.kill(victim) : undefined),
  })
  assert.equal(report.statuses.get('timeout') ?? 0, 0, 'no request hung during the failover')
  // Seen by the app's client; answered with 503s where a request needed the killed primary before
  // its replica took over, or not at all when the session L1 answered every session meanwhile (a
  // session on the killed primary could not be changed or ended while it was down).
  assert.ok(
    nodeErrors > 0 || (report.statuses.get(503) ?? 0) > 0,
    `the failover was seen: ${JSON.stringify([...report.statuses])}`,
  )
  const unexpected = [...report.statuses.keys()].filter(
    (s) => ![200, 201, 409, 422, 503].includes(s as number),
  )
  assert.deepEqual(unexpected, [], JSON.stringify([...report.statuses]))
  let ready = 0
  for (let i = 0; i < 100 && ready !== 200; i++) {
    ready = (await fetch(`${url}/ready`)).status
    if (ready !== 200) await sleep(200)
  }
  assert.equal(ready, 200, 'ready again after the failover')
  await settle(() => url, report.attempts)
  const invariants = await moneyAndKeyInvariants(t.db, report.attempts)
  assert.deepEqual(
    { ...invariants, transfers: 0, entries: 0 },
    {
      totalUnchanged: true,
      negativeBalances: 0,
      unbalancedTransfers: 0,
      accountsNotMatchingLedger: 0,
      transfers: 0,
      entries: 0,
      keysRunTwice: 0,
      keysAnswered201WithoutRow: 0,
      rowsWithoutA201: 0,
    },
  )
  assert.ok(invariants.transfers > 100)
})
