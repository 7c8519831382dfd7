import { randomBytes } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import { buildApp, type GatewayDependencies } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { createPgDatabase, createPgliteDatabase, type Database } from '../../src/db/database.ts'
import { migrate } from '../../src/db/migrate.ts'
import { hashPassword } from '../../src/ledger/passwords.ts'
import type { RedisClient } from '../../src/redis/client.ts'
import { cookieHeader, TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from './index.ts'

// The demo gateway's test helpers: its Postgres databases, the gateway built as server.ts builds it,
// customers and logins, ledger invariants. Only the demo's suites (test/demo, test/model,
// test/openapi) and the soak use them; the library's suites build plain Fastify apps on Redis alone
// (./index.ts, ./plain-app.ts), which test/library-tests-standalone.test.ts checks.

export const TEST_ADMIN_DATABASE_URL =
  process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
/** `TEST_DATABASE=pglite` runs the suites on embedded PGlite instead of the Postgres server. */
export const USE_PGLITE = process.env.TEST_DATABASE === 'pglite'

export interface TestDatabase {
  db: Database
  /** postgres:// URL of the database (undefined on PGlite). */
  url?: string
  drop(): Promise<void>
}

/** A fresh, migrated database per suite: tests never see each other's rows. */
export async function createTestDatabase(): Promise<TestDatabase> {
  if (USE_PGLITE) {
    const db = await createPgliteDatabase()
    await migrate(db)
    return { db, drop: () => db.close() }
  }
  const name = `gw_test_${randomBytes(6).toString('hex')}`
  const admin = new pg.Client({ connectionString: TEST_ADMIN_DATABASE_URL })
  await admin.connect()
  await admin.query(`CREATE DATABASE ${name}`)
  await admin.end()
  const url = new URL(TEST_ADMIN_DATABASE_URL)
  url.pathname = `/${name}`
  // A long pool wait: suites fire hundreds of concurrent requests at 20 connections on two cores.
  const db = createPgDatabase({ connectionString: url.toString(), max: 20, connectionTimeoutMs: 10_000 })
  await migrate(db)
  return {
    db,
    url: url.toString(),
    async drop() {
      await db.close()
      const client = new pg.Client({ connectionString: TEST_ADMIN_DATABASE_URL })
      await client.connect()
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      await client.end()
    },
  }
}

export interface TestApp {
  app: FastifyInstance
  db: Database
  redis: RedisClient
  /** What the gateway's keys start with (`app.keyPrefix`): `basePrefix` and the database's identity. */
  prefix: string
  /** The key prefix the gateway was given: another gateway on the same database takes this one. */
  basePrefix: string
  close(): Promise<void>
}

/** What the keys of a gateway given `basePrefix` on this database start with (`app.keyPrefix`). */
export async function gatewayKeyPrefix(db: Database, basePrefix: string): Promise<string> {
  const [row] = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
  return `${basePrefix}${row!.identity}:`
}

/** Builds the gateway the way server.ts does, on its own database and Redis key prefix. */
export async function buildTestApp(
  env: Record<string, string> = {},
  deps: GatewayDependencies & { testDatabase?: TestDatabase } = {},
): Promise<TestApp> {
  // Under `npm run test:cluster` the suites run on the Redis Cluster it started, unless a test brings its own Redis.
  const redis =
    process.env.REDIS_CLUSTER_NODES && !env.REDIS_URL
      ? { REDIS_CLUSTER_NODES: process.env.REDIS_CLUSTER_NODES }
      : { REDIS_URL: TEST_REDIS_URL }
  const config = loadConfig({ NODE_ENV: 'test', ...redis, SESSION_SECRET: TEST_SECRET, ...env })
  const testDatabase = deps.testDatabase ?? (await createTestDatabase())
  const prefix = deps.keyPrefix ?? uniquePrefix()
  const app = await buildApp(config, { ...deps, database: testDatabase.db, keyPrefix: prefix })
  await app.ready()
  return {
    app,
    db: testDatabase.db,
    redis: app.redis,
    prefix: app.keyPrefix,
    basePrefix: prefix,
    async close() {
      await app.close()
      if (!deps.testDatabase) await testDatabase.drop()
    },
  }
}

export interface TestCustomer {
  customerId: number
  username: string
  password: string
  accountIds: number[]
}

/** A customer with one account per entry of `balances` (VND unless given as [amount, currency]). */
export async function createCustomer(
  db: Database,
  username: string,
  balances: Array<number | [number, string]> = [1_000_000],
  password = 'correct horse battery',
): Promise<TestCustomer> {
  const [customer] = await db.query<{ id: number }>(
    'INSERT INTO customers (username, password_hash) VALUES ($1, $2) RETURNING id',
    [username, await hashPassword(password)],
  )
  const accountIds: number[] = []
  for (const entry of balances) {
    const [amount, currency] = typeof entry === 'number' ? [entry, 'VND'] : entry
    const [account] = await db.query<{ id: number }>(
      'INSERT INTO accounts (customer_id, currency, balance, opening_balance) VALUES ($1, $2, $3, $3) RETURNING id',
      [customer!.id, currency, amount],
    )
    accountIds.push(account!.id)
  }
  return { customerId: customer!.id, username, password, accountIds }
}

/** Logs in through the API and returns the Cookie header value to send. */
export async function login(
  app: FastifyInstance,
  customer: { username: string; password: string },
): Promise<string> {
  const response = await app.inject({
    method: 'POST',
    url: '/session',
    payload: { username: customer.username, password: customer.password },
  })
  if (response.statusCode !== 200) throw new Error(`login failed: ${response.statusCode} ${response.body}`)
  return cookieHeader(response.headers['set-cookie'])
}

/** Ledger invariants that must hold after any test that moves money. */
export async function ledgerInvariants(db: Database) {
  const [row] = await db.query<{
    total: string
    opening: string
    negative: string
    unbalanced: string
    mismatched: string
    transfers: string
    entries: string
  }>(`SELECT
        (SELECT sum(balance) FROM accounts)::text AS total,
        (SELECT sum(opening_balance) FROM accounts)::text AS opening,
        (SELECT count(*) FROM accounts WHERE balance < 0)::text AS negative,
        (SELECT count(*) FROM (SELECT transfer_id FROM ledger_entries GROUP BY transfer_id
                               HAVING count(*) <> 2 OR sum(amount) <> 0) u)::text AS unbalanced,
        (SELECT count(*) FROM accounts a WHERE a.balance <> a.opening_balance +
           coalesce((SELECT sum(amount) FROM ledger_entries e WHERE e.account_id = a.id), 0))::text AS mismatched,
        (SELECT count(*) FROM transfers)::text AS transfers,
        (SELECT count(*) FROM ledger_entries)::text AS entries`)
  return {
    totalUnchanged: row!.total === row!.opening,
    negativeBalances: Number(row!.negative),
    unbalancedTransfers: Number(row!.unbalanced),
    accountsNotMatchingLedger: Number(row!.mismatched),
    transfers: Number(row!.transfers),
    entries: Number(row!.entries),
  }
}
