import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import pg from 'pg'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { pinLoadGenerator, pinPostgres, pinUnderTest, placement } from './cpus.ts'
import { stopAllServers } from './runner.ts'

export const ADMIN_DATABASE_URL =
  process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'

export interface BenchServices {
  redisUrl: string
  databaseUrl: string
  stop(): Promise<void>
}

/**
 * A private redis-server and a fresh Postgres database for one benchmark run, so command counts
 * are exact and nothing else on the machine shares their keys or rows.
 */
export async function startBenchServices(): Promise<BenchServices> {
  const redis = await startRedisServer()
  // A crashed run must not leave its redis-server behind (kill() signals synchronously).
  const killOnExit = () => void redis.kill()
  process.on('exit', killOnExit)
  const info = new Redis(redis.url)
  pinUnderTest(Number(/process_id:(\d+)/.exec(await info.info('server'))?.[1]))
  info.disconnect()
  const name = `gw_bench_${randomBytes(4).toString('hex')}`
  const admin = new pg.Client({ connectionString: ADMIN_DATABASE_URL })
  await admin.connect()
  await admin.query(`CREATE DATABASE ${name}`)
  await admin.end()
  const url = new URL(ADMIN_DATABASE_URL)
  url.pathname = `/${name}`
  return {
    redisUrl: redis.url,
    databaseUrl: url.toString(),
    async stop() {
      process.off('exit', killOnExit)
      await redis.stop()
      const client = new pg.Client({ connectionString: ADMIN_DATABASE_URL })
      await client.connect()
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      await client.end()
    },
  }
}

/**
 * Vacuums and analyzes the tables a transfer load grows, as autovacuum would between runs. This
 * machine's Postgres runs with autovacuum off, and then nothing does: a connection keeps the plans
 * it made while the tables were small (the prepared transfer statement's idempotency lookup, the
 * foreign-key checks of its inserts, the relay's claim) and scans them sequentially as they grow,
 * slower with every transfer, and the outbox's deleted rows pile up. Autovacuum (on by default)
 * analyzes a table once a tenth of it has changed, which makes every connection plan again, and
 * vacuums the outbox as rows are deleted; scenarios call this before each measured run.
 */
export async function vacuumTransferTables(db: { query(sql: string): Promise<unknown> }): Promise<void> {
  await db.query('VACUUM (ANALYZE) accounts, transfers, ledger_entries, outbox_events')
}

/**
 * A benchmark process's placement before it starts servers: the load generator (this process) on
 * its CPU, Postgres beside the servers under test until the process exits, a crash included; Ctrl-C
 * stops the servers.
 */
export async function placeBenchProcess(): Promise<void> {
  pinLoadGenerator()
  const admin = new pg.Client({ connectionString: ADMIN_DATABASE_URL })
  await admin.connect()
  const unpinPostgres = await pinPostgres(admin)
  await admin.end()
  process.on('exit', unpinPostgres)
  console.error(`CPU placement: ${placement()}`)
  process.once('SIGINT', () => {
    console.error('\ninterrupted: stopping the servers under test')
    stopAllServers().finally(() => process.exit(130))
  })
}
