// A relay or notifier process for test/demo/events-crash.test.ts, killed by itself mid-work:
//   MODE=relay:    relays in batches of 10 and SIGKILLs itself in batch CRASH_AT, after its XADDs
//                  reached Redis and before its COMMIT;
//   MODE=notifier: consumes `notifier` and SIGKILLs itself right after its CRASH_AT-th notification
//                  script replied (a batch's notifications partly written, its entries still pending).
// DATABASE_URL, REDIS_URL and PREFIX name the shared database, Redis and key prefix.
import { Redis } from 'ioredis'
import { createPgDatabase, type Database } from '../../src/db/database.ts'
import { createNotifier } from '../../src/events/notifier.ts'
import { createOutboxRelay } from '../../src/events/outbox-relay.ts'

const { MODE, CRASH_AT, DATABASE_URL, REDIS_URL, PREFIX = '' } = process.env
const crashAt = Number(CRASH_AT ?? 1)
const redis = new Redis(REDIS_URL!)
const stream = `${PREFIX}events:transfers`
const die = () => process.kill(process.pid, 'SIGKILL')

if (MODE === 'relay') {
  const db = createPgDatabase({ connectionString: DATABASE_URL! })
  let batches = 0
  const dying: Database = {
    ...db,
    get queryCount() {
      return db.queryCount
    },
    query: db.query.bind(db),
    // The batch's work (claim and XADDs) done, its COMMIT not sent.
    transaction: (fn) =>
      db.transaction(async (tx) => {
        const result = await fn(tx)
        if (++batches === crashAt) die()
        return result
      }),
  }
  const relay = createOutboxRelay({
    db: dying,
    redis,
    stream,
    retention: 100_000,
    batch: 10,
    intervalMs: 1000,
  })
  await relay.relayPending()
  console.log('relay finished without crashing')
  process.exit(1)
} else {
  let scripts = 0
  const call = redis.call.bind(redis) as (...args: unknown[]) => Promise<unknown>
  ;(redis as unknown as { call: typeof call }).call = async (...args: unknown[]) => {
    const reply = await call(...args)
    if (/^eval/i.test(String(args[0])) && ++scripts === crashAt) die()
    return reply
  }
  const notifier = createNotifier({
    db: createPgDatabase({ connectionString: DATABASE_URL! }),
    refillReach: 100_000,
    redis,
    prefix: PREFIX,
    stream,
    consumer: `child-${process.pid}`,
    retention: 100_000,
    dedupTtlMs: 3_600_000,
    visibilityTimeoutMs: 60_000,
    blockMs: 200,
  })
  await notifier.start()
}
