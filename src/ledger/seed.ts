import type { Database } from '../db/database.ts'
import { findCustomerByUsername } from './ledger.ts'
import { hashPassword } from './passwords.ts'

export const DEMO_PASSWORD = 'demo-password'
export const DEMO_OPENING_BALANCE = 100_000_000

/** The demo's public account: a relief fund whose movements its followers see in their feed. */
export const DEMO_PUBLIC_ACCOUNT = { owner: 'charity', name: 'Central Vietnam Flood Relief Fund' }

/**
 * Creates alice and bob with one VND account each, and `charity` with a public one (the relief
 * fund), once; later starts leave them as they are.
 */
export async function seedDemo(db: Database): Promise<void> {
  for (const username of ['alice', 'bob', DEMO_PUBLIC_ACCOUNT.owner]) {
    const existing = await findCustomerByUsername(db, username)
    if (existing) continue
    const hash = await hashPassword(DEMO_PASSWORD)
    const publicName = username === DEMO_PUBLIC_ACCOUNT.owner ? DEMO_PUBLIC_ACCOUNT.name : null
    await db.transaction(async (tx) => {
      const [customer] = await tx.query<{ id: number }>(
        'INSERT INTO customers (username, password_hash) VALUES ($1, $2) ON CONFLICT (username) DO NOTHING RETURNING id',
        [username, hash],
      )
      if (!customer) return
      await tx.query(
        "INSERT INTO accounts (customer_id, currency, balance, opening_balance, public_name) VALUES ($1, 'VND', $2, $2, $3)",
        [customer.id, DEMO_OPENING_BALANCE, publicName],
      )
    })
  }
}
