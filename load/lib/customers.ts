// Many bench customers at once: seeded in bulk in Postgres, signed in by creating their sessions in
// Redis directly (as login does), for scenarios that move money between random accounts.
import fastifyCookie from '@fastify/cookie'
import { Redis } from 'ioredis'
import type pg from 'pg'
import { loadConfig } from '../../src/config.ts'
import { hashPassword } from '../../src/ledger/passwords.ts'
import { SessionStore, sessionCookieName } from '../../src/plugins/session/index.ts'

export const BENCH_PASSWORD = 'bench-password'

export interface Seeded {
  /** Account ids first..last, one per customer; customer id = account id + customerOffset. */
  first: number
  last: number
  customerOffset: number
  count: number
  /** The running gateway's Redis key prefix: its keys live under the database's identity. */
  keyPrefix: string
}

/**
 * `count` customers with one funded VND account each, in two bulk statements (one password hash for
 * all of them). Their ids come out consecutive and in step, which pgbench scripts rely on: it is checked.
 */
export async function seedCustomers(db: pg.Client, count: number, openingBalance: number): Promise<Seeded> {
  const hash = await hashPassword(BENCH_PASSWORD)
  const { rows } = await db.query<{ id: number; customer_id: number }>(
    `WITH c AS (
       INSERT INTO customers (username, password_hash)
       SELECT 'load-' || i, $1 FROM generate_series(1, $2::integer) AS i ORDER BY i RETURNING id
     )
     INSERT INTO accounts (customer_id, currency, balance, opening_balance)
     SELECT id, 'VND', $3::bigint, $3::bigint FROM c ORDER BY id
     RETURNING id, customer_id`,
    [hash, count, openingBalance],
  )
  rows.sort((a, b) => a.id - b.id)
  const first = rows[0]!.id
  const customerOffset = rows[0]!.customer_id - first
  rows.forEach((row, i) => {
    if (row.id !== first + i || row.customer_id - row.id !== customerOffset)
      throw new Error('seeded account ids are not consecutive and in step with their customers')
  })
  await db.query('ANALYZE')
  const identity = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
  return {
    first,
    last: first + count - 1,
    customerOffset,
    count,
    keyPrefix: `${identity.rows[0]!.identity}:`,
  }
}

/**
 * One session per customer, created in Redis by the session store exactly as login creates it and
 * signed with the gateway's secret: 10,000 logins would cost 10,000 scrypt verifications (minutes
 * of CPU) and measure nothing a load scenario is about. Returns the Cookie header per account index.
 */
export async function signInCustomers(
  redisUrl: string,
  env: Record<string, string>,
  seeded: Seeded,
): Promise<string[]> {
  const config = loadConfig({ ...env, NODE_ENV: 'production' })
  const redis = new Redis(redisUrl)
  try {
    const store = new SessionStore(redis, {
      keyPrefix: `${seeded.keyPrefix}sess:`,
      idleTimeoutMs: config.session.idleTimeoutMs,
      absoluteTimeoutMs: config.session.absoluteTimeoutMs,
    })
    const signer = fastifyCookie.signerFactory(config.session.secrets)
    const name = sessionCookieName({ secure: config.session.secure })
    const cookies: string[] = []
    for (let start = 0; start < seeded.count; start += 500) {
      const batch = await Promise.all(
        Array.from({ length: Math.min(500, seeded.count - start) }, async (_, j) => {
          const session = await store.create(String(seeded.first + start + j + seeded.customerOffset))
          return `${name}=${encodeURIComponent(signer.sign(session.id))}`
        }),
      )
      cookies.push(...batch)
    }
    return cookies
  } finally {
    redis.disconnect()
  }
}
