import type { Database, Queryable } from '../db/database.ts'
import type { RedisClient } from '../index.ts'

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

interface OutboxRow {
  id: string
  type: 'transfer.completed'
  transfer_id: string
  from_customer_id: number
  to_customer_id: number
  from_account_id: number
  to_account_id: number
  amount: string
  currency: string
  occurred_at: Date | string
}

export interface OutboxRelayOptions {
  db: Database
  redis: RedisClient
  /** The stream key (`events:transfers` under the gateway's key prefix). */
  stream: string
  /**
   * Approximate number of entries the stream keeps (XADD ... MAXLEN ~); the outbox keeps as many
   * relayed rows to refill it from, and the relay deletes older ones.
   */
  retention: number
  /** Rows claimed per transaction. Default 100. */
  batch?: number
  /** The poll period; `wake()` runs a pass sooner. */
  intervalMs: number
  /**
   * How long a wake-up waits for more commits to join its pass. Default 50 ms: under load one pass
   * (three statements) relays the commits of those milliseconds together instead of one each.
   */
  wakeDelayMs?: number
  onError?: (err: unknown) => void
}

export interface OutboxRelay {
  /** Relays every committed, unrelayed event now; resolves with how many went to the stream. */
  relayPending(): Promise<number>
  /** Asks for a pass soon (after a commit in this process); wake-ups close together share one pass. */
  wake(): void
  start(): void
  /** Stops the timer and waits for a running pass (its transaction commits or rolls back). */
  stop(): Promise<void>
}

/** Relayed rows deleted per timer pass at most (one pass a second by default: far above any transfer rate). */
const PRUNE_BATCH = 10_000

const toEvent = (row: OutboxRow): TransferEvent => ({
  eventId: String(row.id),
  type: row.type,
  transferId: Number(row.transfer_id),
  fromCustomerId: row.from_customer_id,
  toCustomerId: row.to_customer_id,
  fromAccountId: row.from_account_id,
  toAccountId: row.to_account_id,
  amount: Number(row.amount),
  currency: row.currency,
  occurredAt: new Date(row.occurred_at).toISOString(),
})

/**
 * Moves committed outbox rows to the Redis stream. One pass, per batch: a transaction claims
 * unrelayed rows with FOR UPDATE SKIP LOCKED (parallel relays take disjoint rows), XADDs each with
 * its event id, marks them relayed and commits. A relay that dies before COMMIT rolls back and its
 * rows are claimed again; only a death between XADD and COMMIT puts an event on the stream twice,
 * which consumers absorb by event id.
 */
export function createOutboxRelay(options: OutboxRelayOptions): OutboxRelay {
  const {
    db,
    redis,
    stream,
    retention,
    batch = 100,
    intervalMs,
    wakeDelayMs = 50,
    onError = () => {},
  } = options
  let timer: NodeJS.Timeout | null = null
  let wakeTimer: NodeJS.Timeout | null = null
  let running: Promise<unknown> | null = null
  let again = false
  let stopped = true

  /**
   * Claims and marks a batch in one statement; the mark only counts if the XADDs succeed and the
   * transaction commits (a failure rolls it back and the rows stay unrelayed). The commit does not
   * wait for its WAL flush (synchronous_commit off, for this transaction only): a mark lost in a
   * Postgres crash relays those events again, which consumers absorb, and the relay stops costing
   * the disk a flush per pass beside the transfers' own.
   */
  async function relayBatch(tx: Queryable): Promise<number> {
    const rows = await tx.query<OutboxRow>(
      `UPDATE outbox_events SET relayed_at = now()
       WHERE id IN (SELECT id FROM outbox_events WHERE relayed_at IS NULL ORDER BY id LIMIT $1
                    FOR UPDATE SKIP LOCKED)
         AND set_config('synchronous_commit', 'off', true) = 'off'
       RETURNING id, type, transfer_id, from_customer_id, to_customer_id, from_account_id, to_account_id,
                 amount, currency, occurred_at`,
      [batch],
    )
    if (rows.length === 0) return 0
    // RETURNING has no order: the stream gets them in commit (id) order.
    rows.sort((a, b) => Number(a.id) - Number(b.id))
    const pipeline = redis.pipeline()
    for (const row of rows) {
      const event = toEvent(row)
      pipeline.xadd(
        stream,
        'MAXLEN',
        '~',
        retention,
        '*',
        'eventId',
        event.eventId,
        'type',
        event.type,
        'data',
        JSON.stringify(event),
      )
    }
    const results = (await pipeline.exec()) ?? []
    const failed = results.find(([err]) => err)
    if (failed || results.length !== rows.length) throw failed?.[0] ?? new Error('XADD pipeline incomplete')
    return rows.length
  }

  /**
   * Redis lost entries (restart without persistence, failover to a replica that had not got them):
   * the newest event ids on the stream are behind what Postgres says was relayed. The rows after
   * the newest one still on the stream (at most `retention` of them) are marked unrelayed again.
   * Resolves with the newest relayed id (0: none).
   */
  async function refillAfterLoss(): Promise<number> {
    const [row] = await db.query<{ max: string | null }>(
      'SELECT max(id)::text AS max FROM outbox_events WHERE relayed_at IS NOT NULL',
    )
    if (!row?.max) return 0
    const relayed = Number(row.max)
    const tail = (await redis.xrevrange(stream, '+', '-', 'COUNT', Math.min(batch, 100))) as Array<
      [string, string[]]
    >
    let newest = 0
    for (const [, fields] of tail) {
      const at = fields.indexOf('eventId')
      if (at >= 0 && at % 2 === 0) newest = Math.max(newest, Number(fields[at + 1]))
    }
    if (newest >= relayed) return relayed
    await db.query(
      'UPDATE outbox_events SET relayed_at = NULL WHERE relayed_at IS NOT NULL AND id > GREATEST($1::bigint, $2::bigint)',
      [newest, relayed - retention],
    )
    return relayed
  }

  /**
   * Deletes relayed rows no refill can need: a refill goes back at most `retention` events from the
   * newest relayed one, so the rows before that are only taking space. Oldest first, a bounded
   * batch per pass; rows another relay is deleting are skipped, not waited for.
   */
  async function pruneRelayed(newestRelayed: number): Promise<void> {
    const upTo = newestRelayed - retention
    if (upTo <= 0) return
    await db.query(
      `DELETE FROM outbox_events WHERE id IN (
         SELECT id FROM outbox_events WHERE id <= $1 AND relayed_at IS NOT NULL ORDER BY id LIMIT $2
         FOR UPDATE SKIP LOCKED)`,
      [upTo, PRUNE_BATCH],
    )
  }

  /** `checkLoss`: on the timer's passes and direct calls; a commit's wake-up only relays. */
  async function relayPending(checkLoss = true): Promise<number> {
    if (checkLoss) await pruneRelayed(await refillAfterLoss())
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
    start() {
      if (!stopped) return
      stopped = false
      timer = setInterval(pass, intervalMs, true)
      timer.unref()
      pass(true)
    },
    async stop() {
      stopped = true
      if (timer) clearInterval(timer)
      if (wakeTimer) clearTimeout(wakeTimer)
      timer = null
      wakeTimer = null
      await running
    },
  }
}
