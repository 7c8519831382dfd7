import { randomUUID } from 'node:crypto'
import { appendJsonEntries, type Lifecycle, LifecycleStatus, type RedisClient } from 'fastify-redis-gateway'
import type { Database, Queryable } from '../db/database.ts'
import { checkDatabaseIdentity, raiseHighWater, renewDatabaseIdentity } from '../db/identity.ts'

/** An outbox row as it goes onto the stream: the `data` field of the entry (JSON). */
export interface TransferEvent {
  eventId: string
  type: 'transfer.completed'
  transferId: number
  fromCustomerId: number
  toCustomerId: number
  fromAccountId: number
  toAccountId: number
  amount: number
  currency: string
  occurredAt: string
}

/** A claimed batch: how many events, and their stream entries as one JSON array. */
interface ClaimedBatch {
  n: number
  events: string | null
  /** The batch's highest event id. */
  newest: string | null
}

export interface OutboxRelayOptions {
  db: Database
  redis: RedisClient
  /** The stream key (`events:transfers` under the gateway's key prefix). */
  stream: string
  /**
   * Approximate number of entries the stream keeps (XADD ... MAXLEN ~), and how many transfers
   * back a refill after Redis lost entries reaches.
   */
  retention: number
  /** Rows claimed per transaction. Default 200: a wake-up's pass at 2,000 transfers/s. */
  batch?: number
  /** The poll period; `wake()` runs a pass sooner. */
  intervalMs: number
  /**
   * How long a wake-up waits for more commits to join its pass. Default 100 ms: under load one pass
   * (four statements and one script call) relays the commits of those milliseconds together instead
   * of one each. A pass costs about as much again as the rows it moves: relaying a backlog in passes
   * of 50 rows took 11 µs of Node and 15 µs of Postgres CPU per row, in passes of 200 7.5 and 7.
   */
  wakeDelayMs?: number
  /**
   * The database identity the stream's key is under, and the prefix before it (src/db/identity.ts).
   * Given, each pass first checks that the database still has that identity and is not a restore of
   * an older backup (its newest transfer below the high-water mark of the events relayed); if it
   * is, the pass gives the database a new identity and relays nothing, nor does any later pass of
   * a relay started under the old one: events of a database that reuses ids never reach the keys of
   * the one it replaced.
   */
  database?: { basePrefix: string; identity: string }
  onError?: (err: unknown) => void
}

/** Thrown by a pass of a relay whose database is no longer the one its keys belong to. */
export class DatabaseReplacedError extends Error {
  constructor(identity: string) {
    super(
      `the database is no longer the one under identity ${identity} (restored from an older backup, or replaced): ` +
        'the relay stops until the instance restarts under its new identity',
    )
    this.name = 'DatabaseReplacedError'
  }
}

/**
 * The relay's lifecycle: `start()` runs a pass now and every `intervalMs`; `stop()` stops the timer
 * and waits for a running pass (its transaction commits or rolls back); `health()` has the latest
 * error of a pass.
 */
export interface OutboxRelay extends Lifecycle {
  /** Relays every committed, unrelayed event now; resolves with how many went to the stream. */
  relayPending(): Promise<number>
  /** Asks for a pass soon (after a commit in this process); wake-ups close together share one pass. */
  wake(): void
}

/** How long a loss check's canary outlives a check that died before deleting it. */
const CANARY_TTL_MS = 600_000

/** An event's columns in outbox_events. */
const COLUMNS =
  'id, type, transfer_id, from_customer_id, to_customer_id, from_account_id, to_account_id, amount, currency, occurred_at'

/**
 * The event's JSON, byte for byte what JSON.stringify of a `TransferEvent` gives (same keys, same
 * order), built in the DELETE that claims the row: the relay parses one text column per row instead
 * of ten typed ones, and serializes nothing. Ids and amounts are whole numbers, the two strings are
 * escaped by to_json, and occurredAt has milliseconds as the API's createdAt.
 */
const EVENT_JSON = `format('{"eventId":"%s","type":%s,"transferId":%s,"fromCustomerId":%s,"toCustomerId":%s,'
  '"fromAccountId":%s,"toAccountId":%s,"amount":%s,"currency":%s,"occurredAt":"%s"}',
  id, to_json(type), transfer_id, from_customer_id, to_customer_id, from_account_id, to_account_id, amount,
  to_json(currency::text), to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))`

/**
 * Claims up to $1 of the oldest unrelayed events by deleting them, and returns them as one row: how
 * many, and their stream entries (eventId, type and data fields) in id order as one JSON array,
 * which the relay hands to Redis as it is (`appendJsonEntries`). The claimed ids go in as an array
 * (`= ANY`), so the delete finds them by primary key: as `id IN (subquery)` the planner hashed the
 * ids and scanned the whole table for them, the dead rows of earlier passes included, which cost
 * Postgres more than the rows it moved.
 */
export const CLAIM_SQL = `WITH claimed AS (
    DELETE FROM outbox_events
    WHERE id = ANY (ARRAY(SELECT id FROM outbox_events ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
      AND set_config('synchronous_commit', 'off', true) = 'off'
    RETURNING id, type, ${EVENT_JSON} AS data)
  SELECT count(*)::int AS n,
    json_agg(json_build_array('eventId', id::text, 'type', type, 'data', data) ORDER BY id)::text AS events,
    max(id)::text AS newest
  FROM claimed`

/**
 * Sent in the claim's transaction before CLAIM_SQL, so that the claim is planned without sequential
 * scans. outbox_events is a queue table: (auto)vacuum usually analyzes it empty or nearly so, and a
 * claim planned from those statistics (or while the backlog is small) scans and sorts the whole
 * table, live rows and every row deleted since the last vacuum, and keeps that plan while the
 * backlog grows, until the next analyze. Without sequential scans both of its scans walk the primary
 * key, at any size. SET LOCAL ends with the transaction; nothing else runs in it.
 */
export const CLAIM_PLAN_SETTING = 'SET LOCAL enable_seqscan = off'

/** The event id of a stream entry (its `eventId` field), or null. */
const eventIdOf = (entry: [string, string[]] | undefined): number | null => {
  const fields = entry?.[1] ?? []
  const at = fields.indexOf('eventId')
  return at >= 0 && at % 2 === 0 ? Number(fields[at + 1]) : null
}

/**
 * Moves committed outbox rows to the Redis stream. One pass, per batch: a transaction deletes
 * the oldest rows it can lock with FOR UPDATE SKIP LOCKED (parallel relays take disjoint rows),
 * XADDs each with its event id and commits. A relay that dies before COMMIT rolls back and its
 * rows are claimed again; only a death between XADD and COMMIT puts an event on the stream twice,
 * which consumers absorb by event id.
 */
export function createOutboxRelay(options: OutboxRelayOptions): OutboxRelay {
  const { db, redis, stream, retention, batch = 200, intervalMs, wakeDelayMs = 100, database } = options
  const status = new LifecycleStatus()
  const onError = (err: unknown) => {
    status.failed(err)
    options.onError?.(err)
  }
  let timer: NodeJS.Timeout | null = null
  let wakeTimer: NodeJS.Timeout | null = null
  let running: Promise<unknown> | null = null
  let again = false
  let stopped = true
  /** The loss check's search reads transfers above this id only (see refillAfterLoss). */
  let searchAbove = 0
  const epochKey = `${stream}:relay-epoch`

  /**
   * Claims a batch by deleting it (outbox_events holds only the backlog); the delete only counts if
   * the XADDs succeed and the transaction commits (a failure rolls it back and the rows stay). The
   * commit does not wait for its WAL flush (synchronous_commit off, for this transaction only): a
   * delete lost in a Postgres crash relays those events again, which consumers absorb, and the
   * relay stops costing the disk a flush per pass beside the transfers' own.
   */
  async function relayBatch(tx: Queryable): Promise<number> {
    await tx.query(CLAIM_PLAN_SETTING)
    // Prepared once per connection: the relay runs it many times a second under load.
    const [claimed] = await tx.query<ClaimedBatch>(CLAIM_SQL, [batch], { prepare: 'outbox-relay-claim' })
    if (!claimed?.events) return 0
    const ids = await appendJsonEntries(redis, { stream, maxLen: retention, entries: claimed.events })
    if (ids.length !== claimed.n) throw new Error(`appended ${ids.length} of ${claimed.n} events`)
    if (database)
      await raiseHighWater(redis, `${database.basePrefix}${database.identity}:`, Number(claimed.newest))
    return claimed.n
  }

  /**
   * Redis lost entries, and the events of the transfers they held go back to the backlog, rebuilt
   * from the transfers table (at most `retention` transfers back). "Relayed" is the newest transfer
   * with an event that is no longer in the backlog (an event's id is its transfer's); Postgres is
   * read before the stream, so events relayed in between are not taken for lost ones.
   * Its search reads only transfers above `searchAbove`, never more than `retention` back: an
   * unbounded walk back from the newest transfer would step over every transfer without an event
   * (instances with OUTBOX=off, or all of them) on every timed pass.
   * - Redis restarted without its data: the key `<stream>:relay-epoch`, set after each such check,
   *   is gone. Every relayed event (up to the newest transfer, see the insert) is lost but those
   *   relays appended to the empty stream since (read up to 10 batches from its start; any beyond
   *   are relayed twice). The stream's oldest entry is no boundary: a relay whose pass the restart
   *   broke appends its older events after another relay's newer, committed ones.
   * - Redis lost only its newest writes (failover to a replica that had not got them): the stream's
   *   newest event ids are behind the newest relayed one, or events of the window are missing (`lossOnTail`).
   * A check after a restart first sets a canary key of its own. Redis losing its data again before
   * the check set the epoch key takes the canary too: what the check read (the relayed events, the
   * stream's head) was from before that loss, so the epoch key it set is dropped again and the next
   * check refills (duplicates, which consumers absorb) instead of taking the stream for whole.
   */
  async function refillAfterLoss(): Promise<void> {
    // While Redis is unreachable there is nothing to compare with, and the query below walks back
    // over the growing backlog: skip it.
    if (redis.status !== 'ready') return
    const restarted = (await redis.exists(epochKey)) === 0
    const canary = restarted ? `${epochKey}:check:${randomUUID()}` : null
    if (canary) await redis.set(canary, '1', 'PX', CANARY_TTL_MS)
    const [bounds] = await db.query<{ newest: string; backlog_from: string | null }>(
      `SELECT coalesce(max(id), 0)::text AS newest, (SELECT min(id) FROM outbox_events)::text AS backlog_from
       FROM transfers`,
    )
    const newest = Number(bounds!.newest)
    // The bound goes in as a value, so the plan is a backward walk of the primary key down to it.
    const [row] = await db.query<{ id: string }>(
      `SELECT t.id::text AS id FROM transfers t
       WHERE t.id > $1::bigint AND t.has_event AND NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = t.id)
       ORDER BY t.id DESC LIMIT 1`,
      [Math.max(searchAbove, newest - retention)],
    )
    if (!row) {
      // No relayed event above the bound. One relayed later is newer than `newest` or waits in the
      // backlog now: the next search starts below both. (A transfer below `newest` still
      // committing now is found only once a newer event is relayed.)
      searchAbove = bounds!.backlog_from ? Math.min(newest, Number(bounds!.backlog_from) - 1) : newest
      // Nothing relayed, so nothing lost (a new stream): the epoch starts here. Left unset, a later
      // check would take the missing key for a restart and refill what was relayed since.
      if (canary) await setEpoch(canary)
      return
    }
    const relayed = Number(row.id)
    // The newest relayed event only moves up, unless a refill puts it back in the backlog (then
    // the search finds nothing above it until it is relayed again, and starts from the backlog).
    searchAbove = relayed - 1
    let lostAfter = 0
    /** Events appended since the restart: not lost. */
    let onStream: number[] = []
    /** Relayed events of the window that the stream's tail does not hold. */
    let missing: number[] = []
    // Another check set the epoch since this one read it missing: that check is the restart's.
    if (canary && (await redis.exists(epochKey)) === 1) {
      await redis.del(canary)
      return
    }
    if (restarted) {
      const head = (await redis.xrange(stream, '-', '+', 'COUNT', 10 * batch)) as Array<[string, string[]]>
      onStream = head.map(eventIdOf).filter((id) => id !== null)
    } else {
      ;({ lostAfter, missing } = await lossOnTail(relayed))
      if (lostAfter >= relayed && missing.length === 0) return
    }
    await db.query(
      `INSERT INTO outbox_events (${COLUMNS})
       SELECT t.id, 'transfer.completed', t.id, t.customer_id, a.customer_id, t.from_account_id,
              t.to_account_id, t.amount, t.currency, t.created_at
       FROM transfers t JOIN accounts a ON a.id = t.to_account_id
       WHERE t.has_event AND t.id > $2::bigint AND t.id <= $3::bigint
         AND (t.id > $1::bigint OR t.id = ANY ($5::bigint[])) AND t.id <> ALL ($4::bigint[])
       ON CONFLICT (id) DO NOTHING`,
      // After a restart, up to the newest transfer rather than the newest relayed event: another
      // instance's relay may have appended an event to the lost stream and not yet committed its
      // claim when Postgres was read. Its row, still in the backlog then, makes the insert wait for
      // that claim: committed, the event is refilled; rolled back, the row stays in the backlog.
      [lostAfter, relayed - retention, restarted ? newest : relayed, onStream, missing],
    )
    // Set only once the refill is in the backlog: a relay that dies before this leaves the next
    // check to find the key missing and refill again (duplicates, which consumers absorb).
    if (canary) await setEpoch(canary)
  }

  /** Sets the epoch key at the end of a check after a restart; dropped again if Redis lost its data meanwhile. */
  async function setEpoch(canary: string): Promise<void> {
    await redis.set(epochKey, String(Date.now()))
    // The canary gone: Redis lost its data since this check began (see refillAfterLoss).
    if ((await redis.del(canary)) === 0) await redis.del(epochKey)
  }

  /**
   * What Redis lost of its newest writes (a failover to a replica that had not got them), read from
   * the stream's tail: the newest event id on it (`lostAfter`; every relayed event above it is
   * lost), and the relayed events of the window (the newest `2 * batch` by id) that are not on it.
   * Relays append in parallel, so entries do not follow id order: a slower relay appends older
   * events after another's newer ones, and a loss of only its entries leaves the newest ids in
   * place. The tail is read back in pages of 100 until it holds every event of the window, at most
   * 10 batches deep; an event of the window appended earlier than that is taken for lost and
   * relayed again (a duplicate, which consumers absorb).
   */
  async function lossOnTail(relayed: number): Promise<{ lostAfter: number; missing: number[] }> {
    const window = await db.query<{ id: string }>(
      `SELECT t.id::text AS id FROM transfers t
       WHERE t.id > $1::bigint AND t.id <= $2::bigint AND t.has_event
         AND NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = t.id)
       ORDER BY t.id DESC LIMIT $3`,
      [relayed - retention, relayed, Math.min(2 * batch, retention)],
    )
    const unseen = new Set(window.map((r) => Number(r.id)))
    let newestSeen = 0
    let before = '+'
    for (let read = 0; read < 10 * batch && unseen.size > 0; ) {
      const page = (await redis.xrevrange(stream, before, '-', 'COUNT', 100)) as Array<[string, string[]]>
      for (const entry of page) {
        const id = eventIdOf(entry) ?? 0
        newestSeen = Math.max(newestSeen, id)
        unseen.delete(id)
      }
      if (page.length < 100) break
      read += page.length
      before = `(${page.at(-1)![0]}`
    }
    return { lostAfter: Math.min(newestSeen, relayed), missing: [...unseen].filter((id) => id <= newestSeen) }
  }

  /** `checkLoss`: on the timer's passes and direct calls; a commit's wake-up only relays. */
  /** Throws DatabaseReplacedError unless the database is still the one under `database.identity`. */
  async function checkDatabase(): Promise<void> {
    if (!database) return
    const check = await checkDatabaseIdentity(db, redis, database.basePrefix, database.identity)
    if (check.identity === database.identity && !check.restored) return
    if (check.identity === database.identity) await renewDatabaseIdentity(db, check.identity)
    throw new DatabaseReplacedError(database.identity)
  }

  async function relayPending(checkLoss = true): Promise<number> {
    await checkDatabase()
    if (checkLoss) await refillAfterLoss()
    let total = 0
    for (;;) {
      const moved = await db.transaction(relayBatch)
      total += moved
      if (moved < batch) return total
    }
  }

  function pass(checkLoss: boolean): void {
    if (running) {
      again = true
      return
    }
    running = relayPending(checkLoss)
      .catch(onError)
      .finally(() => {
        running = null
        if (again && !stopped) {
          again = false
          pass(false)
        }
      })
  }

  return {
    relayPending: () => relayPending(),
    wake() {
      // Commits arriving while a pass runs are taken by one more pass after it, not one each.
      if (stopped || wakeTimer) return
      wakeTimer = setTimeout(() => {
        wakeTimer = null
        pass(false)
      }, wakeDelayMs)
    },
    async start() {
      if (!stopped) return
      stopped = false
      status.state = 'running'
      timer = setInterval(pass, intervalMs, true)
      timer.unref()
      pass(true)
    },
    stop(stopOptions) {
      stopped = true
      if (timer) clearInterval(timer)
      if (wakeTimer) clearTimeout(wakeTimer)
      timer = null
      wakeTimer = null
      return status.stopWithin(Promise.resolve(running), stopOptions)
    },
    health: () => status.health(),
  }
}
