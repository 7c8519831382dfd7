import { Gauge, Histogram, type Registry } from 'prom-client'
import type { Database } from './database.ts'

const BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]

/** First keyword of a statement the code wrote: a small fixed set of label values. */
function statementLabel(sql: string): string {
  const word = /^\s*([A-Za-z]+)/.exec(sql)?.[1]?.toUpperCase() ?? ''
  return ['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'WITH', 'BEGIN', 'COMMIT', 'ROLLBACK'].includes(word)
    ? word
    : 'OTHER'
}

/** Statement and transaction latency and pool usage of the demo's database; returns the remover. */
export function observeDatabase(registry: Registry, db: Database): () => void {
  const registers = [registry]
  const statements = new Histogram({
    name: 'db_query_duration_seconds',
    help: 'Postgres statement latency by statement keyword and outcome (ok, error)',
    labelNames: ['statement', 'outcome'] as const,
    buckets: BUCKETS,
    registers,
  })
  const transactions = new Histogram({
    name: 'db_transaction_duration_seconds',
    help: 'Postgres transaction latency (BEGIN to COMMIT or ROLLBACK) by outcome',
    labelNames: ['outcome'] as const,
    buckets: BUCKETS,
    registers,
  })
  new Gauge({
    name: 'db_pool_connections',
    help: 'Postgres pool connections by state (active, idle) and the pool maximum (max)',
    labelNames: ['state'] as const,
    registers,
    collect() {
      this.reset()
      const stats = db.poolStats?.()
      if (!stats) return
      this.set({ state: 'active' }, stats.total - stats.idle)
      this.set({ state: 'idle' }, stats.idle)
      this.set({ state: 'max' }, stats.max)
    },
  })
  new Gauge({
    name: 'db_pool_waiting_requests',
    help: 'Queries waiting for a free Postgres pool connection',
    registers,
    collect() {
      this.set(db.poolStats?.().waiting ?? 0)
    },
  })
  return (
    db.observe?.({
      query: ({ sql, seconds, error }) =>
        statements.observe({ statement: statementLabel(sql), outcome: error ? 'error' : 'ok' }, seconds),
      transaction: ({ seconds, outcome }) => transactions.observe({ outcome }, seconds),
    }) ?? (() => {})
  )
}
