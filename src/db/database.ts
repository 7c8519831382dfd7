import type { PGlite, Transaction } from '@electric-sql/pglite'
import pg from 'pg'
import { DomainError } from '../domain-error.ts'

export interface Queryable {
  query<R = Record<string, unknown>>(sql: string, params?: unknown[], options?: QueryOptions): Promise<R[]>
}

export interface QueryOptions {
  /**
   * Prepares the statement once per connection under this name and reuses its plan (pg): for a hot
   * statement whose planning costs more than its execution. One name, one SQL text. PGlite ignores it.
   */
  prepare?: string
}

/** The one interface the gateway uses for Postgres, satisfied by a pg pool and by embedded PGlite. */
export interface Database extends Queryable {
  readonly kind: 'postgres' | 'pglite'
  /** Runs fn inside BEGIN/COMMIT on one connection; rolls back and rethrows if fn throws. */
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>
  /** Statements sent since start (a transaction's BEGIN/COMMIT count as well); benchmarks read it. */
  readonly queryCount: number
  close(): Promise<void>
  /** Adds an observer of every statement and transaction (metrics); returns its remover. */
  observe?(observer: DatabaseObserver): () => void
  /** Connection pool usage where there is a pool (pg); PGlite has a single connection and none. */
  poolStats?(): PoolStats
}

export interface DatabaseObserver {
  /** `sql` is the statement as written in the code, never client input; `error` set when it failed. */
  query?(event: { sql: string; seconds: number; error?: unknown }): void
  transaction?(event: { seconds: number; outcome: 'commit' | 'rollback' }): void
}

export interface PoolStats {
  total: number
  idle: number
  waiting: number
  max: number
}

/** Observers of one database; a failing observer must never fail the query it observes. */
function observers() {
  const list = new Set<DatabaseObserver>()
  const notify = (fn: (o: DatabaseObserver) => void) => {
    for (const o of list) {
      try {
        fn(o)
      } catch {}
    }
  }
  return {
    observe(observer: DatabaseObserver) {
      list.add(observer)
      return () => void list.delete(observer)
    },
    async timed<R>(sql: string, run: () => Promise<R>): Promise<R> {
      if (list.size === 0) return run()
      const start = performance.now()
      try {
        const result = await run()
        notify((o) => o.query?.({ sql, seconds: (performance.now() - start) / 1000 }))
        return result
      } catch (error) {
        notify((o) => o.query?.({ sql, seconds: (performance.now() - start) / 1000, error }))
        throw error
      }
    },
    transactionDone(start: number, outcome: 'commit' | 'rollback') {
      notify((o) => o.transaction?.({ seconds: (performance.now() - start) / 1000, outcome }))
    },
  }
}

export interface PostgresOptions {
  connectionString: string
  max?: number
  connectionTimeoutMs?: number
  statementTimeoutMs?: number
}

// Failures a retry gets past (server gone, unreachable, timed out, shutting down; a transaction
// rolled back by Postgres): thrown as `database-unavailable`, which the HTTP layer answers with a 503
// and a Retry-After.
const UNAVAILABLE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  '57P01',
  '57P02',
  '57P03',
  '57014',
  // A transaction Postgres rolled back to break a deadlock or a serialization conflict: nothing
  // of it was written, and a retry runs.
  '40P01',
  '40001',
])
const UNAVAILABLE_MESSAGE = /Connection terminated|timeout exceeded when trying to connect|Query read timeout/

export function databaseUnavailable(err: unknown): unknown {
  const e = err as { code?: string; message?: string }
  if (!(UNAVAILABLE_CODES.has(e?.code ?? '') || UNAVAILABLE_MESSAGE.test(e?.message ?? ''))) return err
  return new DomainError('database-unavailable', 'The database is not answering.')
}

/** Connections in the pool unless `max` says otherwise. */
export const DEFAULT_POOL_MAX = 10

export function createPgDatabase(options: PostgresOptions): Database {
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.max ?? DEFAULT_POOL_MAX,
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 2000,
    // Fail fast rather than queue forever behind a stuck server.
    statement_timeout: options.statementTimeoutMs ?? 5000,
    query_timeout: (options.statementTimeoutMs ?? 5000) + 1000,
  })
  // An idle client losing its connection must not crash the process; the next query reports it.
  pool.on('error', () => {})
  let queryCount = 0
  const watch = observers()
  const run = async <R>(
    client: pg.Pool | pg.PoolClient,
    sql: string,
    params?: unknown[],
    options?: QueryOptions,
  ) => {
    queryCount++
    try {
      const result = await watch.timed(sql, () =>
        options?.prepare
          ? client.query({ name: options.prepare, text: sql, values: params as unknown[] })
          : client.query(sql, params as unknown[]),
      )
      return result.rows as R[]
    } catch (err) {
      throw databaseUnavailable(err)
    }
  }
  return {
    kind: 'postgres',
    get queryCount() {
      return queryCount
    },
    query: (sql, params, options) => run(pool, sql, params, options),
    async transaction(fn) {
      const client = await pool.connect().catch((err) => Promise.reject(databaseUnavailable(err)))
      // A checked-out client that loses its connection emits 'error'; unheard, that crashes the
      // process. The failing query rejects as well, so the listener only has to exist.
      const ignore = () => {}
      client.on('error', ignore)
      const start = performance.now()
      let broken = false
      try {
        await run(client, 'BEGIN')
        const result = await fn({ query: (sql, params, options) => run(client, sql, params, options) })
        await run(client, 'COMMIT')
        watch.transactionDone(start, 'commit')
        return result
      } catch (err) {
        await run(client, 'ROLLBACK').catch(() => {
          broken = true
        })
        watch.transactionDone(start, 'rollback')
        throw err
      } finally {
        client.off('error', ignore)
        client.release(broken)
      }
    },
    close: () => pool.end(),
    observe: watch.observe,
    poolStats: () => ({
      total: pool.totalCount,
      idle: pool.idleCount,
      waiting: pool.waitingCount,
      max: pool.options.max,
    }),
  }
}

export async function createPgliteDatabase(dataDir?: string): Promise<Database> {
  const { PGlite } = await import('@electric-sql/pglite')
  const db: PGlite = new PGlite(dataDir)
  await db.waitReady
  let queryCount = 0
  const watch = observers()
  const run = async <R>(client: PGlite | Transaction, sql: string, params?: unknown[]) => {
    queryCount++
    const result = await watch.timed(sql, () => client.query<R>(sql, params))
    return result.rows
  }
  return {
    kind: 'pglite',
    get queryCount() {
      return queryCount
    },
    query: (sql, params) => run(db, sql, params),
    // PGlite has one connection: its transactions run one at a time, which keeps FOR UPDATE correct.
    async transaction(fn) {
      const start = performance.now()
      try {
        const result = await db.transaction((tx) => fn({ query: (sql, params) => run(tx, sql, params) }))
        watch.transactionDone(start, 'commit')
        return result
      } catch (err) {
        watch.transactionDone(start, 'rollback')
        throw err
      }
    },
    close: () => db.close(),
    observe: watch.observe,
  }
}

/** pg returns bigint as text and PGlite as BigInt; money must come back as an exact safe integer. */
export function toSafeInteger(value: unknown): number {
  const n = typeof value === 'bigint' ? Number(value) : typeof value === 'string' ? Number(value) : value
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || String(value) !== String(n)) {
    throw new Error(`Expected a safe integer from the database, got ${String(value)}`)
  }
  return n
}
