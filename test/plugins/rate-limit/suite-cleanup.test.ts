// The suites' closing checks and cleanups run on a client of their own: a suite's client carries the
// plugins' short command timer, which a loaded machine overruns ("Command timed out").
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import {
  deleteKeys,
  keysWithoutTtl,
  scanKeys,
  startTcpProxy,
  type TcpProxy,
  testRedisConnection,
  uniquePrefix,
} from '../../helpers/index.ts'

const prefix = uniquePrefix('rlc')
let proxy: TcpProxy
let direct: RedisClient
let slow: RedisClient

before(async () => {
  direct = createRedisClient(testRedisConnection())
  await connectRedis(direct)
  const port = Number(new URL(testRedisConnection().url ?? 'redis://127.0.0.1:6379').port || 6379)
  proxy = await startTcpProxy(port)
  // A suite's client whose every reply comes later than its command bound, as on a loaded machine.
  slow = createRedisClient({ url: `redis://127.0.0.1:${proxy.port}`, commandTimeoutMs: 20 })
  await connectRedis(slow)
  proxy.delay(60)
})

after(async () => {
  slow.disconnect()
  await proxy.close()
  direct.disconnect()
})

test('scanKeys, keysWithoutTtl and deleteKeys outlast the command timer of the client they are given', async (t) => {
  if (process.env.REDIS_CLUSTER_NODES) return t.skip('one node behind a proxy')
  await direct.set(`${prefix}a`, '1', 'PX', 60_000)
  await direct.set(`${prefix}b`, '1')
  await assert.rejects(slow.get(`${prefix}a`), /Command timed out/, 'the client itself times out')
  assert.deepEqual((await scanKeys(slow, prefix)).sort(), [`${prefix}a`, `${prefix}b`])
  assert.deepEqual(await keysWithoutTtl(slow, prefix), [`${prefix}b`])
  await deleteKeys(slow, prefix)
  assert.deepEqual(await scanKeys(direct, prefix), [])
})
