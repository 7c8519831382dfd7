import type { RedisClient } from 'fastify-redis-gateway'
import type { Queryable } from './database.ts'

/**
 * The highest transfer id the relay has put on the stream under an identity's keys (a sorted set
 * with one member, raised with ZADD GT): a database whose newest transfer is below it is older than
 * what Redis has seen, a restore of an earlier backup of the same database.
 */
export const highWaterKey = (prefix: string) => `${prefix}events:transfers:high-water`
export const HIGH_WATER_MEMBER = 'transfer'

/** Raises the high-water mark to `transferId` (never lowers it). */
export async function raiseHighWater(redis: RedisClient, prefix: string, transferId: number): Promise<void> {
  await redis.zadd(highWaterKey(prefix), 'GT', transferId, HIGH_WATER_MEMBER)
}

export interface IdentityCheck {
  /** The identity the database has now. */
  identity: string
  /** The database is older than the high-water mark of `identity`'s keys: it was restored. */
  restored: boolean
}

/**
 * Compares the database's newest transfer with the high-water mark Redis holds under
 * `<basePrefix><identity>:`, for `identity` (a relay's) or, without it, the identity the database
 * has now. Throws when Redis does not answer.
 *
 * Redis is read first: every transfer at or below the mark was committed before the mark was raised,
 * so a database read after it sees them all unless it is a restore. Read the other way round, a
 * transfer another instance commits and relays between the two reads looks like a restore, and
 * the database would get a new identity while the other instances keep writing under the old one.
 */
export async function checkDatabaseIdentity(
  db: Queryable,
  redis: RedisClient,
  basePrefix: string,
  identity?: string,
): Promise<IdentityCheck> {
  let asked = identity ?? (await readIdentity(db))
  for (;;) {
    const highWater = await redis.zscore(highWaterKey(`${basePrefix}${asked}:`), HIGH_WATER_MEMBER)
    const [row] = await db.query<{ identity: string; newest: string }>(
      `SELECT identity, (SELECT coalesce(max(id), 0) FROM transfers)::text AS newest FROM database_identity`,
    )
    if (!row) throw new Error('database_identity is empty: the migrations did not run')
    if (row.identity === asked)
      return { identity: asked, restored: highWater !== null && Number(row.newest) < Number(highWater) }
    // Renewed since: a relay's identity is no longer the database's; a boot asks again under the new one.
    if (identity !== undefined) return { identity: row.identity, restored: false }
    asked = row.identity
  }
}

async function readIdentity(db: Queryable): Promise<string> {
  const [row] = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
  if (!row) throw new Error('database_identity is empty: the migrations did not run')
  return row.identity
}

/**
 * Gives a restored database a new identity, unless another instance already did: keys written
 * under the old one (feeds, notification markers, the leaderboard) are never met again. Returns the
 * identity the database has now.
 */
export async function renewDatabaseIdentity(db: Queryable, from: string): Promise<string> {
  await db.query(
    `UPDATE database_identity SET identity = left(replace(gen_random_uuid()::text, '-', ''), 12)
     WHERE identity = $1`,
    [from],
  )
  return await readIdentity(db)
}

/**
 * The identity to put the gateway's keys under at boot: the database's, renewed first if the
 * database is a restore of an older backup. When Redis does not answer, the database's as it is
 * (the relay checks again on each pass, see src/events/outbox-relay.ts).
 */
export async function settleDatabaseIdentity(
  db: Queryable,
  redis: RedisClient,
  basePrefix: string,
  onRestore: (from: string, to: string) => void,
): Promise<string> {
  if (redis.status === 'ready') {
    const check = await checkDatabaseIdentity(db, redis, basePrefix).catch(() => null)
    if (check && !check.restored) return check.identity
    if (check) {
      const renewed = await renewDatabaseIdentity(db, check.identity)
      onRestore(check.identity, renewed)
      return renewed
    }
  }
  return await readIdentity(db)
}
