import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import pg from 'pg'
import { startRedisServer } from '../../src/embedded/redis-server.ts'
import { pinUnderTest } from './cpus.ts'

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
