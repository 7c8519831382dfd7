import { callScript } from '../../redis/scripts.ts'
import { InvalidArgumentError } from '../checks.ts'
import { createStreamConsumer, type StreamEntry } from '../stream-consumer.ts'
import { type FeedContext, KEYS_PER_CALL } from './context.ts'
import { feedMember } from './items.ts'
import { isId, resolveWorkerOptions } from './options.ts'
import { FEED_FANOUT, FEED_FANOUT_START } from './scripts.ts'
import type { FanoutLag, FanoutStats, FanoutWorker, FanoutWorkerOptions, FeedItem } from './types.ts'

// Fan-out: workers that write a pushed producer's item into the feeds of its recently active
// followers, one job (one stream entry) per publish, and the backlog of those jobs.

const FANOUT_GROUP = 'fanout'
/** A fan-out job's snapshot of followers outlives a worker that died holding it this long. */
const SNAPSHOT_TTL_MS = 600_000

export function createFanoutWorker(context: FeedContext, workerOptions: FanoutWorkerOptions): FanoutWorker {
  const { redis, settings, producerKeys, producerTag, readerKeys, readerTag, scriptGroups, fanoutStream } =
    context
  const { keyPrefix, activeWindowMs, feedMaxItems } = settings
  const { consumer, batch, pageSize, visibilityTimeoutMs, blockMs, onError, onJobDone } =
    resolveWorkerOptions(workerOptions)
  const stats: FanoutStats = { jobs: 0, writes: 0, skipped: 0, largestFanout: 0 }

  async function fanOut(entry: StreamEntry): Promise<void> {
    const { id, producer, at } = entry.fields
    const item = { id, producer, at: Number(at) } as FeedItem
    if (!isId(item.id) || !isId(item.producer) || !Number.isSafeInteger(item.at))
      throw new InvalidArgumentError(`feed: fan-out entry ${entry.id} is not an item`)
    const snapshot = `${keyPrefix}{${producerTag(item.producer)}}:fanout:${entry.id}`
    const followers = await callScript(
      redis,
      FEED_FANOUT_START,
      { followers: producerKeys(item.producer).followers, snapshot },
      { oldestActiveMark: settings.now() - activeWindowMs, snapshotTtlMs: SNAPSHOT_TTL_MS },
    )
    let writes = 0
    let skipped = 0
    for (let offset = 0; offset < followers; offset += pageSize) {
      const readers = await redis.zrange(snapshot, String(offset), String(offset + pageSize - 1))
      const replies = await Promise.all(
        scriptGroups(readers, readerTag, KEYS_PER_CALL).map((group) =>
          callScript(
            redis,
            FEED_FANOUT,
            { feeds: group.map((reader) => readerKeys(reader).feed) },
            { feedMaxItems, at: item.at, member: feedMember(item) },
          ),
        ),
      )
      for (const { added, missing } of replies) {
        writes += added
        skipped += missing
      }
    }
    if (followers > 0) await redis.del(snapshot)
    stats.jobs++
    stats.writes += writes
    stats.skipped += skipped
    stats.largestFanout = Math.max(stats.largestFanout, writes)
    try {
      onJobDone?.({ item, writes, skipped })
    } catch (err) {
      onError?.(err)
    }
  }

  const streamConsumer = createStreamConsumer(redis, {
    stream: fanoutStream,
    group: FANOUT_GROUP,
    consumer,
    batch,
    blockMs,
    visibilityTimeoutMs,
    onError: onError ? (err) => onError(err) : undefined,
    handleBatch: async (entries) => {
      await Promise.all(entries.map(fanOut))
    },
  })
  return {
    start: () => streamConsumer.start(),
    stop: (options) => streamConsumer.stop(options),
    health: () => streamConsumer.health(),
    get running() {
      return streamConsumer.running
    },
    stats: () => ({ ...stats }),
  }
}

/** How old the entry `entryId` is at `now` (its id starts with its time), 0 for none. */
const ageOf = (entryId: string | undefined, now: number) =>
  entryId ? Math.max(0, now - Number(entryId.split('-')[0])) : 0

export async function fanoutLag({ redis, fanoutStream }: FeedContext): Promise<FanoutLag> {
  const now = Date.now()
  if ((await redis.exists(fanoutStream)) === 0) return { entries: 0, pending: 0, oldestAgeMs: 0 }
  const groups = (await redis.xinfo('GROUPS', fanoutStream)) as unknown[][]
  const fields = groups
    .map((flat) => {
      const group: Record<string, unknown> = {}
      for (let i = 0; i + 1 < flat.length; i += 2) group[String(flat[i])] = flat[i + 1]
      return group
    })
    .find((group) => group.name === FANOUT_GROUP)
  if (!fields) {
    // No worker ever started: every entry waits.
    const [first] = (await redis.xrange(fanoutStream, '-', '+', 'COUNT', 1)) as Array<[string, string[]]>
    return { entries: await redis.xlen(fanoutStream), pending: 0, oldestAgeMs: ageOf(first?.[0], now) }
  }
  const pending = Number(fields.pending)
  const lastDelivered = String(fields['last-delivered-id'])
  let undelivered = fields.lag === null || fields.lag === undefined ? Number.NaN : Number(fields.lag)
  if (Number.isNaN(undelivered)) {
    // Redis could not tell (entries deleted from the middle of the stream): count them, up to a bound.
    const after = (await redis.xrange(fanoutStream, `(${lastDelivered}`, '+', 'COUNT', 100_000)) as unknown[]
    undelivered = after.length
  }
  let oldest: string | undefined
  if (pending > 0) oldest = String(((await redis.xpending(fanoutStream, FANOUT_GROUP)) as unknown[])[1])
  else if (undelivered > 0) {
    const [first] = (await redis.xrange(fanoutStream, `(${lastDelivered}`, '+', 'COUNT', 1)) as Array<
      [string, string[]]
    >
    oldest = first?.[0]
  }
  return { entries: pending + undelivered, pending, oldestAgeMs: ageOf(oldest, now) }
}
