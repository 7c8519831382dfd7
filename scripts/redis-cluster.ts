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
  /** The nodes that own slots at start (the first `masters` of `nodes`). */
  primaries: Array<{ host: string; port: number }>
  /** `host:port,host:port,...`, the REDIS_CLUSTER_NODES format. */
  nodesEnv: string
  /** SIGKILL one node (a crash, for failover tests). */
  kill(port: number): Promise<void>
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

/**
 * Starts `masters` primaries (default 3) with the slots split evenly, each with `replicasPerMaster`
 * replicas (default 0). With replicas, killing a primary fails its slots over to a replica after
 * the node timeout (2 s).
 */
export async function startRedisCluster(masters = 3, replicasPerMaster = 0): Promise<RedisClusterProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'redis-cluster-'))
  const taken = new Set<number>()
  const total = masters * (1 + replicasPerMaster)
  const ports: number[] = []
  for (let i = 0; i < total; i++) ports.push(await clusterPort(taken))
  const children = ports.map((port) =>
    spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        `nodes-${port}.conf`,
        '--cluster-node-timeout',
        '2000',
        '--dir',
        dir,
        '--save',
        '',
        '--appendonly',
        'no',
        '--protected-mode',
        'no',
      ],
      { stdio: 'ignore' },
    ),
  )
  const exits = children.map((child) => new Promise<void>((resolve) => child.once('exit', () => resolve())))
  const clients = ports.map(
    (port) => new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 1 }),
  )
  for (const c of clients) c.on('error', () => {})
  const stop = async () => {
    for (const c of clients) c.disconnect()
    for (const child of children) if (child.exitCode === null) child.kill('SIGTERM')
    await Promise.all(exits)
    rmSync(dir, { recursive: true, force: true })
  }
  const primaries = ports.slice(0, masters)
  try {
    for (const port of ports) await until(() => redisAnswers('127.0.0.1', port), 'nodes to start')
    for (const c of clients) await c.connect()
    for (const [i, c] of clients.slice(0, masters).entries()) {
      const from = Math.floor((SLOTS * i) / masters)
      const to = Math.floor((SLOTS * (i + 1)) / masters) - 1
      await c.call('CLUSTER', 'ADDSLOTSRANGE', from, to)
    }
    for (const port of ports.slice(1)) await clients[0]!.call('CLUSTER', 'MEET', '127.0.0.1', port)
    for (const c of clients) {
      await until(
        async () => String(await c.call('CLUSTER', 'INFO')).includes(`cluster_known_nodes:${total}`),
        'all nodes to meet',
      )
    }
    // Replica r of primary m is node masters + m * replicasPerMaster + r.
    for (let m = 0; m < masters; m++) {
      const id = String(await clients[m]!.call('CLUSTER', 'MYID'))
      for (let r = 0; r < replicasPerMaster; r++) {
        const replica = clients[masters + m * replicasPerMaster + r]!
        await until(
          async () => (await replica.call('CLUSTER', 'REPLICATE', id)) === 'OK',
          'a replica to attach',
        )
      }
    }
    for (const c of clients) {
      await until(
        async () => String(await c.call('CLUSTER', 'INFO')).includes('cluster_state:ok'),
        'cluster_state:ok',
      )
    }
    for (const c of clients.slice(0, masters)) {
      await until(
        async () =>
          (String(await c.info('replication')).match(/^slave\d+:.*state=online/gm) ?? []).length ===
          replicasPerMaster,
        'replicas to sync',
      )
    }
  } catch (err) {
    await stop()
    throw err
  }
  for (const c of clients) c.disconnect()
  const nodes = ports.map((port) => ({ host: '127.0.0.1', port }))
  return {
    nodes,
    primaries: primaries.map((port) => ({ host: '127.0.0.1', port })),
    nodesEnv: nodes.map((n) => `${n.host}:${n.port}`).join(','),
    async kill(port: number) {
      const child = children[ports.indexOf(port)]
      if (!child) throw new Error(`no cluster node on port ${port}`)
      child.kill('SIGKILL')
      await exits[ports.indexOf(port)]
    },
    stop,
  }
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop()!)) {
  // `--replicas N` gives each of the three primaries N replicas (six nodes with N = 1).
  const argv = process.argv.slice(2)
  const replicas = argv[0] === '--replicas' ? Number(argv.splice(0, 2)[1]) : 0
  const cluster = await startRedisCluster(3, replicas)
  const [command, ...args] = argv
  console.error(`Redis Cluster up: REDIS_CLUSTER_NODES=${cluster.nodesEnv}`)
  if (!command) {
    process.once('SIGINT', () => cluster.stop().then(() => process.exit(0)))
  } else {
    const child = spawn(command, args, {
      stdio: 'inherit',
      env: { ...process.env, REDIS_CLUSTER_NODES: cluster.nodesEnv },
    })
    const code = await new Promise<number>((resolve) => child.once('exit', (c) => resolve(c ?? 1)))
    await cluster.stop()
    process.exit(code)
  }
}
