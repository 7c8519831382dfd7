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
 * Reads the database's identity and compares its newest transfer with the high-water mark Redis
 * holds under `<basePrefix><identity>:`. Throws when Redis does not answer.
 */
export async function checkDatabaseIdentity(
  db: Queryable,
  redis: RedisClient,
  basePrefix: string,
): Promise<IdentityCheck> {
  const [row] = await db.query<{ identity: string; newest: string }>(
    `SELECT identity, (SELECT coalesce(max(id), 0) FROM transfers)::text AS newest FROM database_identity`,
  )
  if (!row) throw new Error('database_identity is empty: the migrations did not run')
  const highWater = await redis.zscore(highWaterKey(`${basePrefix}${row.identity}:`), HIGH_WATER_MEMBER)
  return { identity: row.identity, restored: highWater !== null && Number(row.newest) < Number(highWater) }
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
  const [row] = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
  return row!.identity
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
  const [row] = await db.query<{ identity: string }>('SELECT identity FROM database_identity')
  return row!.identity
}
