import type { Database } from '../db/database.ts'
import { type BloomAnswer, type BloomFilter, createBloomFilter, type RedisClient } from '../index.ts'

// Which account ids exist, as a Bloom filter in Redis: a read of an id that no account has is
// answered without the database and without a "not found" cache entry per id (cache penetration).
// The filter never answers "absent" for an id it was given, and a filter Redis lost answers
// "unknown" (the read goes on to the database) until it is rebuilt from Postgres.

export interface AccountFilterOptions {
  db: Database
  redis: RedisClient
  /** Base name of the filter's keys (the gateway's key prefix + `accounts`). */
  key: string
  /** Accounts the filter is sized for at a 1 % false-positive rate (ACCOUNT_FILTER_CAPACITY). */
  capacity: number
  /** How often accounts inserted behind the gateway's back are added. Default 10 s. */
  catchUpIntervalMs?: number
  onError?: (err: unknown) => void
}

export interface AccountFilter {
  readonly bloom: BloomFilter
  /** False only when no account has this id. Redis unable to answer: true (the database decides). */
  mightExist(accountId: number): Promise<boolean>
  /** Adds new accounts: call after their insert, before anyone may read them. */
  add(accountIds: readonly number[]): Promise<void>
  /**
   * Builds the filter from Postgres unless it is built and knows where its catch-up stands (in the
   * background: meanwhile reads go on to the database), then catches up on a timer.
   */
  start(): void
  /** Resolves once the build or catch-up under way (if any) is over. */
  settled(): Promise<void>
  stop(): Promise<void>
}

/** Ids read from Postgres per query, for a rebuild or a catch-up. */
const PAGE = 10_000
/**
 * A catch-up reads back this many ids below the newest it saw: an account whose insert committed
 * after a later one's (two transactions at once) is still added.
 */
const CATCH_UP_OVERLAP = 1000

export function createAccountFilter(options: AccountFilterOptions): AccountFilter {
  const { db, redis, onError = () => {} } = options
  const bloom = createBloomFilter(redis, {
    key: options.key,
    expectedItems: options.capacity,
    falsePositiveRate: 0.01,
  })
  // The newest account id the filter was given by a rebuild or a catch-up (a key of its own: it
  // goes with the filter when Redis loses data, and its absence asks for a rebuild).
  const newestKey = `${options.key}:newest`
  let rebuilding: Promise<void> | null = null
  let timer: NodeJS.Timeout | null = null
  let catchingUp: Promise<void> | null = null

  async function* idsAbove(after: number): AsyncGenerator<string> {
    for (let from = after; ; ) {
      const rows = await db.query<{ id: number }>(
        'SELECT id FROM accounts WHERE id > $1 ORDER BY id LIMIT $2',
        [from, PAGE],
      )
      for (const row of rows) yield String(row.id)
      if (rows.length < PAGE) return
      from = rows.at(-1)!.id
    }
  }

  async function rebuild(): Promise<void> {
    const [row] = await db.query<{ newest: number }>(
      'SELECT coalesce(max(id), 0)::int AS newest FROM accounts',
    )
    await bloom.rebuild(idsAbove(0))
    // Accounts inserted while it ran went to the filter through `add` or come with the next catch-up.
    await redis.set(newestKey, String(row!.newest))
  }

  function rebuildOnce(): Promise<void> {
    rebuilding ??= rebuild()
      .catch(onError)
      .finally(() => {
        rebuilding = null
      })
    return rebuilding
  }

  async function catchUp(): Promise<void> {
    const newest = await redis.get(newestKey)
    if (newest === null || !(await bloom.ready())) return rebuildOnce()
    let last = Number(newest)
    let batch: string[] = []
    for await (const id of idsAbove(Math.max(0, last - CATCH_UP_OVERLAP))) {
      batch.push(id)
      last = Math.max(last, Number(id))
      if (batch.length === PAGE) {
        await bloom.add(batch)
        batch = []
      }
    }
    if (batch.length > 0) await bloom.add(batch)
    await redis.set(newestKey, String(last))
  }

  function catchUpOnce(): Promise<void> {
    catchingUp ??= catchUp()
      .catch(onError)
      .finally(() => {
        catchingUp = null
      })
    return catchingUp
  }

  return {
    bloom,
    async mightExist(accountId) {
      let answer: BloomAnswer
      try {
        answer = await bloom.check(String(accountId))
      } catch (err) {
        onError(err)
        return true
      }
      // Lost or never built: the database answers meanwhile.
      if (answer === 'unknown') void rebuildOnce()
      return answer !== 'absent'
    },
    async add(accountIds) {
      if (accountIds.length > 0) await bloom.add(accountIds.map(String))
    },
    start() {
      void catchUpOnce()
      timer = setInterval(() => void catchUpOnce(), options.catchUpIntervalMs ?? 10_000)
      timer.unref()
    },
    async settled() {
      await catchingUp
      await rebuilding
    },
    async stop() {
      if (timer) clearInterval(timer)
      timer = null
      await Promise.all([rebuilding, catchingUp])
    },
  }
}
