// A local Redis Cluster of `redis-server` processes in a temp dir, for tests that must prove their
// keys share hash tags (no CROSSSLOT). Library: `startRedisCluster()`. CLI:
//   tsx scripts/redis-cluster.ts                 start, print the nodes, stop on Ctrl-C
//   tsx scripts/redis-cluster.ts <cmd> [args]    start, run <cmd> with REDIS_CLUSTER_NODES set, stop
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { redisAnswers } from '../src/embedded/redis-server.ts'

export interface RedisClusterProcess {
  nodes: Array<{ host: string; port: number }>
  /** `host:port,host:port,...`, the REDIS_CLUSTER_NODES format. */
  nodesEnv: string
  stop(): Promise<void>
}

const SLOTS = 16384

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer()
    server.once('error', () => resolve(false))
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)))
  })
}

/** A port whose cluster bus port (port + 10000) is free as well. */
async function clusterPort(taken: Set<number>): Promise<number> {
  for (;;) {
    const port = 20000 + Math.floor(Math.random() * 20000)
    if (taken.has(port) || taken.has(port + 10000)) continue
    if ((await portFree(port)) && (await portFree(port + 10000))) {
      taken.add(port)
      taken.add(port + 10000)
      return port
    }
  }
}

async function until(check: () => Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`Redis Cluster: timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

/** Starts `masters` redis-server processes (default 3) with the slots split evenly; no replicas. */
export async function startRedisCluster(masters = 3): Promise<RedisClusterProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'redis-cluster-'))
  const taken = new Set<number>()
  const ports: number[] = []
  for (let i = 0; i < masters; i++) ports.push(await clusterPort(taken))
  const children = ports.map((port) =>
    spawn(
      'redis-server',
      [
        '--port', String(port), '--bind', '127.0.0.1', '--cluster-enabled', 'yes',
        '--cluster-config-file', `nodes-${port}.conf`, '--cluster-node-timeout', '2000', '--dir', dir,
        '--save', '', '--appendonly', 'no', '--protected-mode', 'no',
      ],
      { stdio: 'ignore' },
    ),
  )
  const exits = children.map((child) => new Promise<void>((resolve) => child.once('exit', () => resolve())))
  const clients = ports.map((port) => new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 1 }))
  for (const c of clients) c.on('error', () => {})
  const stop = async () => {
    for (const c of clients) c.disconnect()
    for (const child of children) if (child.exitCode === null) child.kill('SIGTERM')
    await Promise.all(exits)
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    for (const port of ports) await until(() => redisAnswers('127.0.0.1', port), 'nodes to start')
    for (const c of clients) await c.connect()
    for (const [i, c] of clients.entries()) {
      const from = Math.floor((SLOTS * i) / masters)
      const to = Math.floor((SLOTS * (i + 1)) / masters) - 1
      await c.call('CLUSTER', 'ADDSLOTSRANGE', from, to)
    }
    for (const port of ports.slice(1)) await clients[0]!.call('CLUSTER', 'MEET', '127.0.0.1', port)
    for (const c of clients) {
      await until(async () => {
        const info = String(await c.call('CLUSTER', 'INFO'))
        return info.includes('cluster_state:ok') && info.includes(`cluster_known_nodes:${masters}`)
      }, 'cluster_state:ok')
    }
  } catch (err) {
    await stop()
    throw err
  }
  for (const c of clients) c.disconnect()
  const nodes = ports.map((port) => ({ host: '127.0.0.1', port }))
  return { nodes, nodesEnv: nodes.map((n) => `${n.host}:${n.port}`).join(','), stop }
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop()!)) {
  const cluster = await startRedisCluster()
  const [command, ...args] = process.argv.slice(2)
  console.error(`Redis Cluster up: REDIS_CLUSTER_NODES=${cluster.nodesEnv}`)
  if (!command) {
    process.once('SIGINT', () => cluster.stop().then(() => process.exit(0)))
  } else {
    const child = spawn(command, args, { stdio: 'inherit', env: { ...process.env, REDIS_CLUSTER_NODES: cluster.nodesEnv } })
    const code = await new Promise<number>((resolve) => child.once('exit', (c) => resolve(c ?? 1)))
    await cluster.stop()
    process.exit(code)
  }
}
