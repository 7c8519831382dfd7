import assert from 'node:assert/strict'
import { type ChildProcess, execFile, spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { test } from 'node:test'
import { promisify } from 'node:util'
import Fastify from 'fastify'
import type { Cluster } from 'ioredis'
import { freePort, redisAnswers } from '../src/embedded/redis-server.ts'
import { registerProblemHandlers } from '../src/errors.ts'
import idempotency from '../src/plugins/idempotency/index.ts'
import redisPlugin, { createRedisClient } from '../src/plugins/redis.ts'
import { uniquePrefix } from './helpers.ts'

const run = promisify(execFile)

/** Three masters on free ports, slots assigned by redis-cli; stopped and removed by the returned function. */
async function startCluster(): Promise<{
  nodes: Array<{ host: string; port: number }>
  stop(): Promise<void>
}> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-cluster-'))
  const ports = [await freePort(), await freePort(), await freePort()]
  const children: ChildProcess[] = ports.map((port) =>
    spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--cluster-enabled',
        'yes',
        '--dir',
        dir,
        '--cluster-config-file',
        `nodes-${port}.conf`,
        '--save',
        '',
        '--appendonly',
        'no',
      ],
      { stdio: 'ignore' },
    ),
  )
  const stop = async () => {
    await Promise.all(
      children.map((child) =>
        child.exitCode === null
          ? new Promise((resolve) => child.once('exit', resolve).kill('SIGTERM'))
          : null,
      ),
    )
    rmSync(dir, { recursive: true, force: true })
  }
  for (const port of ports)
    while (!(await redisAnswers('127.0.0.1', port))) await new Promise((r) => setTimeout(r, 50))
  await run('redis-cli', [
    '--cluster',
    'create',
    ...ports.map((p) => `127.0.0.1:${p}`),
    '--cluster-replicas',
    '0',
    '--cluster-yes',
  ])
  for (const port of ports) {
    while (
      !(await run('redis-cli', ['-p', String(port), 'cluster', 'info'])).stdout.includes('cluster_state:ok')
    ) {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  return { nodes: ports.map((port) => ({ host: '127.0.0.1', port })), stop }
}

test('claims, replays, conflicts and mismatches work unchanged on a three-master Redis Cluster', async () => {
  const cluster = await startCluster()
  const client = createRedisClient({ clusterNodes: cluster.nodes })
  const app = Fastify()
  try {
    registerProblemHandlers(app)
    await app.register(redisPlugin, { client })
    await app.register(idempotency, { keyPrefix: uniquePrefix('idem'), scope: () => 'one-principal' })
    let runs = 0
    app.post('/things', { config: { idempotency: true } }, async (request, reply) =>
      reply.code(201).send({ run: ++runs, body: request.body }),
    )
    await app.ready()
    const post = (key: string, payload: object) =>
      app.inject({ method: 'POST', url: '/things', headers: { 'idempotency-key': key }, payload })
    // Enough keys to land on every master's slots.
    const keys = Array.from({ length: 60 }, (_, i) => `cluster-key-${i}`)
    const firsts = await Promise.all(keys.map((key) => post(key, { key })))
    const replays = await Promise.all(keys.map((key) => post(key, { key })))
    for (let i = 0; i < keys.length; i++) {
      assert.equal(firsts[i]!.statusCode, 201)
      assert.deepEqual([replays[i]!.statusCode, replays[i]!.body], [201, firsts[i]!.body])
      assert.equal(replays[i]!.headers['idempotent-replayed'], 'true')
    }
    assert.equal(runs, keys.length)
    assert.equal((await post('cluster-key-0', { other: true })).statusCode, 422)
    const perMaster = await Promise.all((client as Cluster).nodes('master').map((node) => node.dbsize()))
    assert.ok(
      perMaster.every((n) => n > 0),
      `records on every master: ${perMaster.join(', ')}`,
    )
  } finally {
    await app.close()
    client.disconnect()
    await cluster.stop()
  }
})
