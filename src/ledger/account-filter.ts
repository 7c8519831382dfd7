import {
  BLOOM_MAX_BATCH,
  type BloomFilter,
  createBloomFilter,
  type Lifecycle,
  LifecycleStatus,
  type RedisClient,
} from 'fastify-redis-gateway'
import { Gauge, type Registry } from 'prom-client'
import type { Database } from '../db/database.ts'

// Which account ids exist, as a Bloom filter in Redis: a read of an id that no account has is
// answered without the database and without a "not found" cache entry per id (cache penetration).
// No existing account is ever reported missing: the filter never answers "absent" for an id it was
// given, a filter Redis lost answers "unknown" (the read goes on to the database) until it is
// rebuilt from Postgres, and its "absent" is trusted only for ids its last catch-up covered. An id
// above that asks Postgres for its newest id (one query shared by the reads waiting for it).

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
  /** The registry its metrics go to (the metrics plugin's); without it they are not registered. */
  registry?: Registry
}

/**
 * Where the filter stands: `starting` (its first catch-up not ended yet), `building` (a rebuild
 * from Postgres under way), `ready` (its latest catch-up or rebuild succeeded: its "absent" is
 * trusted), `degraded` (its latest one failed). Every state but `ready` sends every id to Postgres.
 */
export type AccountFilterState = 'starting' | 'building' | 'ready' | 'degraded'
const STATES: readonly AccountFilterState[] = ['starting', 'building', 'ready', 'degraded']

/**
 * The filter's lifecycle: `start()` builds it if needed and catches up on a timer; `stop()` stops
 * the timer and waits for a build or catch-up under way; `health()` has the latest error.
 */
export interface AccountFilter extends Lifecycle {
  readonly bloom: BloomFilter
  /** False only when no account has this id. Redis unable to answer: true (the database decides). */
  mightExist(accountId: number): Promise<boolean>
  /** Adds new accounts: call after their insert, before anyone may read them. */
  add(accountIds: readonly number[]): Promise<void>
  /**
   * Builds the filter from Postgres unless it is built and knows where its catch-up stands (in the
   * background: meanwhile reads go on to the database), then catches up on a timer.
   */
  start(): Promise<void>
  /** Catches up now (or joins the catch-up under way): adds the accounts Postgres has that it lacks. */
  catchUp(): Promise<void>
  /** Resolves once the build or catch-up under way (if any) is over. */
  settled(): Promise<void>
  state(): AccountFilterState
}

/** Ids read from Postgres per query, for a rebuild or a catch-up. */
const PAGE = 10_000
/**
 * A catch-up reads back this many ids below the newest it saw: an account whose insert committed
 * after a later one's (two transactions at once) is still added. Below the newest id covered less
 * this, the filter's "absent" is trusted as it is.
 */
const CATCH_UP_OVERLAP = 1000
/** An account's id and creation time in µs: `<id>:<µs>`, the same text on every read. */
const STAMP = 'id, (extract(epoch FROM created_at) * 1000000)::bigint::text AS created'

export function createAccountFilter(options: AccountFilterOptions): AccountFilter {
  const { db, redis } = options
  const status = new LifecycleStatus()
  const onError = (err: unknown) => {
    status.failed(err)
    options.onError?.(err)
  }
  const bloom = createBloomFilter(redis, {
    key: options.key,
    expectedItems: options.capacity,
    falsePositiveRate: 0.01,
  })
  // The newest account the filter was given by a rebuild or a catch-up, as `<id>:<created µs>` (a
  // key of its own: it goes with the filter when Redis loses data, and its absence asks for a
  // rebuild). Postgres no longer having that account with that time means the database was
  // restored or replaced (ids start again): the filter is rebuilt.
  const newestKey = `${options.key}:newest`
  let rebuilding: Promise<void> | null = null
  let timer: NodeJS.Timeout | null = null
  let catchingUp: Promise<void> | null = null
  // This instance's last rebuild or catch-up succeeded, and `covered` is the newest id it saw: until
  // then (at start, after a failure, during a rebuild for a restore) no "absent" is trusted.
  let current = false
  let covered = 0
  // The newest account id this instance has read from Postgres (its probes and catch-ups).
  let seenNewest = 0
  // The latest rebuild or catch-up failed (until one succeeds).
  let failed = false

  async function* idsAbove(after: number, last: { id: number; created: string }): AsyncGenerator<string> {
    for (let from = after; ; ) {
      const rows = await db.query<{ id: number; created: string }>(
        `SELECT ${STAMP} FROM accounts WHERE id > $1 ORDER BY id LIMIT $2`,
        [from, PAGE],
      )
      for (const row of rows) {
        if (row.id > last.id) Object.assign(last, row)
        yield String(row.id)
      }
      if (rows.length < PAGE) return
      from = rows.at(-1)!.id
    }
  }

  async function addAll(ids: AsyncIterable<string>): Promise<void> {
    let batch: string[] = []
    for await (const id of ids) {
      batch.push(id)
      if (batch.length === BLOOM_MAX_BATCH) {
        await bloom.add(batch)
        batch = []
      }
    }
    if (batch.length > 0) await bloom.add(batch)
  }

  async function rebuild(): Promise<void> {
    current = false
    const [newest = { id: 0, created: '' }] = await db.query<{ id: number; created: string }>(
      `SELECT ${STAMP} FROM accounts ORDER BY id DESC LIMIT 1`,
    )
    await bloom.rebuild(idsAbove(0, { id: 0, created: '' }))
    // Accounts inserted while it ran went to the filter through `add` or come with the next catch-up.
    await redis.set(newestKey, `${newest.id}:${newest.created}`)
    covered = newest.id
    current = true
    failed = false
  }

  function rebuildOnce(): Promise<void> {
    rebuilding ??= rebuild()
      .catch((err) => {
        current = false
        failed = true
        onError(err)
      })
      .finally(() => {
        rebuilding = null
      })
    return rebuilding
  }

  async function catchUp(): Promise<void> {
    const marker = await redis.get(newestKey)
    const [id, created] = (marker ?? '').split(':')
    if (marker === null || created === undefined || !(await bloom.ready())) return rebuildOnce()
    const last = { id: Number(id), created }
    seenNewest = Math.max(seenNewest, last.id)
    if (last.id > 0) {
      const [row] = await db.query<{ created: string }>(`SELECT ${STAMP} FROM accounts WHERE id = $1`, [
        last.id,
      ])
      if (row?.created !== created) return rebuildOnce()
    }
    await addAll(idsAbove(Math.max(0, last.id - CATCH_UP_OVERLAP), last))
    await redis.set(newestKey, `${last.id}:${last.created}`)
    // A rebuild started meanwhile (Redis lost the filter) says when the filter is current again.
    if (rebuilding) return
    covered = last.id
    current = true
    failed = false
  }

  function catchUpOnce(): Promise<void> {
    catchingUp ??= catchUp()
      .catch((err) => {
        current = false
        failed = true
        onError(err)
      })
      .finally(() => {
        catchingUp = null
      })
    return catchingUp
  }

  // Postgres' newest account id, from a query that starts after the call: an account committed
  // before a read began is at or below it. Reads waiting at once share one query.
  let probe: Promise<number> | null = null
  let nextProbe: Promise<number> | null = null
  function newestId(): Promise<number> {
    if (probe) {
      nextProbe ??= probe
        .catch(() => {})
        .then(() => {
          nextProbe = null
          return newestId()
        })
      return nextProbe
    }
    probe = db
      .query<{ newest: number }>('SELECT coalesce(max(id), 0)::int AS newest FROM accounts')
      .then(([row]) => {
        seenNewest = Math.max(seenNewest, row!.newest)
        return row!.newest
      })
      .finally(() => {
        probe = null
      })
    return probe
  }

  const state = (): AccountFilterState =>
    rebuilding ? 'building' : current ? 'ready' : failed ? 'degraded' : 'starting'
  // From what this instance already read: a scrape never queries Postgres (it would wait on a
  // locked accounts table, holding a pool connection, while the requests wait too).
  observeFilter(options.registry, state, () => Math.max(0, seenNewest - covered))

  return {
    bloom,
    state,
    async mightExist(accountId) {
      try {
        const answer = await bloom.check(String(accountId))
        // Lost or never built: the database answers meanwhile.
        if (answer === 'unknown') void rebuildOnce()
        if (answer !== 'absent' || !current) return true
        if (accountId <= covered - CATCH_UP_OVERLAP) return false
        // Newer than the last catch-up: absent only when above every account Postgres has.
        if (accountId > (await newestId())) return false
        void catchUpOnce()
        return true
      } catch (err) {
        onError(err)
        return true
      }
    },
    async add(accountIds) {
      for (let i = 0; i < accountIds.length; i += BLOOM_MAX_BATCH)
        await bloom.add(accountIds.slice(i, i + BLOOM_MAX_BATCH).map(String))
    },
    async start() {
      if (status.state === 'running') return
      status.state = 'running'
      void catchUpOnce()
      timer = setInterval(() => void catchUpOnce(), options.catchUpIntervalMs ?? 10_000)
      timer.unref()
    },
    catchUp: catchUpOnce,
    async settled() {
      await catchingUp
      await rebuilding
    },
    stop(stopOptions) {
      if (timer) clearInterval(timer)
      timer = null
      return status.stopWithin(Promise.all([rebuilding, catchingUp]), stopOptions)
    },
    health: () => status.health(),
  }
}

/** The filter's state (1 for the current one), and how far Postgres' newest account id is ahead of its catch-up. */
function observeFilter(
  registry: Registry | undefined,
  state: () => AccountFilterState,
  lag: () => number,
): void {
  const registers = registry ? [registry] : []
  new Gauge({
    name: 'account_filter_state',
    help: 'Account filter state (starting, building, ready, degraded): 1 for the current one, 0 for the others',
    labelNames: ['state'] as const,
    registers,
    collect() {
      const now = state()
      for (const s of STATES) this.set({ state: s }, s === now ? 1 : 0)
    },
  })
  new Gauge({
    name: 'account_filter_catch_up_lag',
    help: "Account ids above the newest one the account filter's latest catch-up covered (the newest id this instance read from Postgres minus it)",
    registers,
    collect() {
      this.set(lag())
    },
  })
}
