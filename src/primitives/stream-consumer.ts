import type { Redis } from 'ioredis'
import { type Lifecycle, LifecycleStatus } from '../plugins/common/lifecycle.ts'
import { type AnyRedisClient, checkRedisClient, type RedisClient } from '../redis/client.ts'
import { blockingConnection, whenReady } from './stream-consumer/connection.ts'
import {
  checkConsumerOptions,
  type StreamConsumerOptions,
  type StreamEntry,
} from './stream-consumer/options.ts'

export type { Lifecycle, LifecycleHealth, StopOptions, StopResult } from '../plugins/common/lifecycle.ts'
export {
  type AppendEachOnceOptions,
  type AppendJsonEntriesOptions,
  type AppendOnceEntry,
  type AppendOnceOptions,
  appendEachOnce,
  appendJsonEntries,
  appendOnce,
} from './stream-consumer/append.ts'
export type { StreamConsumerOptions, StreamEntry } from './stream-consumer/options.ts'

/**
 * A stream consumer's lifecycle (`Lifecycle`):
 * - `start()` creates the group if needed (XGROUP CREATE MKSTREAM) and starts the read loop.
 * - `stop({ deadlineMs })` stops gracefully: no new reads; the entry (or batch) being handled
 *   finishes and is acknowledged (or, if its handler fails, stays pending). Then every entry still
 *   pending for this consumer (delivered and not started, a failed one, or one whose read reply the
 *   stop cut off) is handed back: it stays pending, marked idle past the visibility timeout, so
 *   another consumer's next claim takes it at once. Closes the blocking connection.
 * - `health()`: its state, the latest error of the loop or a handler, and `lagMs`, the age of the
 *   oldest entry of its latest read (0 when that read found nothing new).
 */
export interface StreamConsumer extends Lifecycle {
  /** True from `start()` until `stop()` is called. */
  readonly running: boolean
}

type Fields = string[]
type ReadReply = Array<[string, Array<[string, Fields]>]> | null

function toFields(list: Fields): Record<string, string> {
  const fields: Record<string, string> = {}
  for (let i = 0; i + 1 < list.length; i += 2) fields[list[i]!] = list[i + 1]!
  return fields
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms).unref())

/**
 * A consumer of one stream in one consumer group: XREADGROUP (blocking, on its own connection),
 * XACK after the handler succeeds, XAUTOCLAIM of entries idle longer than the visibility timeout
 * (their consumer crashed or failed them), and a dead-letter stream (capped at about
 * `deadLetterMaxLen` entries) once an entry was delivered `maxDeliveries` times. Several groups may read one stream, each at its own pace.
 */
export function createStreamConsumer(client: AnyRedisClient, options: StreamConsumerOptions): StreamConsumer {
  const redis = checkRedisClient('createStreamConsumer', client)
  checkConsumerOptions(options)
  const {
    stream,
    group,
    consumer,
    handler,
    handleBatch,
    visibilityTimeoutMs = 30_000,
    maxDeliveries = 5,
    deadLetterStream = `${stream}:dead`,
    deadLetterMaxLen = 10_000,
    batch = 10,
    blockMs = 2000,
    batchWaitMs = 0,
    startId = '0',
    onError: onErrorOption = () => {},
  } = options
  const status = new LifecycleStatus()
  /** How far behind the latest read was (the age of its oldest entry), 0 when it found nothing. */
  let lagMs = 0
  /** Reports to `onError`; a callback that throws must not end the loop. */
  const onError = (err: unknown, entry?: StreamEntry) => {
    status.failed(err)
    try {
      onErrorOption(err, entry)
    } catch {
      // The loop goes on regardless: there is no one else to tell.
    }
  }
  const claimIntervalMs = options.claimIntervalMs ?? Math.min(5000, Math.max(10, visibilityTimeoutMs / 2))
  let blocking: RedisClient | null = null
  let starting: Promise<void> | null = null
  let stopping = false
  let loop: Promise<void> | null = null
  let nextClaimAt = 0

  async function createGroup(): Promise<void> {
    try {
      await redis.xgroup('CREATE', stream, group, startId, 'MKSTREAM')
    } catch (err) {
      if (!(err as Error).message?.startsWith('BUSYGROUP')) throw err
    }
  }

  async function deadLetter(entry: StreamEntry, reason: string): Promise<void> {
    await redis.xadd(
      deadLetterStream,
      'MAXLEN',
      '~',
      deadLetterMaxLen,
      '*',
      ...Object.entries(entry.fields).flat(),
      '_id',
      entry.id,
      '_group',
      group,
      '_deliveries',
      String(entry.deliveries),
      '_error',
      reason.slice(0, 500),
    )
    await redis.xack(stream, group, entry.id)
  }

  const runOne = handler ?? ((entry: StreamEntry) => handleBatch!([entry]))

  async function handle(entry: StreamEntry): Promise<void> {
    if (entry.deliveries > maxDeliveries) {
      await deadLetter(entry, 'delivered more often than maxDeliveries (its consumers kept dying)')
      return
    }
    try {
      await runOne(entry)
    } catch (err) {
      onError(err, entry)
      if (entry.deliveries >= maxDeliveries) await deadLetter(entry, String((err as Error)?.message ?? err))
      // Otherwise it stays pending: XAUTOCLAIM hands it out again after the visibility timeout.
      return
    }
    await redis.xack(stream, group, entry.id)
  }

  /**
   * The entries of one read or claim, in stream order: one at a time through `handler` (stopping
   * hands back those not started), or together through `handleBatch` with one XACK.
   */
  async function handleAll(entries: StreamEntry[]): Promise<void> {
    if (!handleBatch) {
      for (const [index, entry] of entries.entries()) {
        if (stopping) return handBack(entries.slice(index).map((entry) => entry.id))
        await handle(entry)
      }
      return
    }
    const fresh = entries.filter((entry) => entry.deliveries <= maxDeliveries)
    for (const entry of entries) if (entry.deliveries > maxDeliveries) await handle(entry)
    if (fresh.length <= 1) return fresh[0] && handle(fresh[0])
    try {
      await handleBatch(fresh)
    } catch (err) {
      onError(err)
      for (const entry of fresh) await handle(entry)
      return
    }
    await redis.xack(stream, group, ...fresh.map((entry) => entry.id))
  }

  /** Entries pending longer than the visibility timeout, with their delivery counts (XPENDING). */
  async function reclaim(): Promise<void> {
    let cursor = '0-0'
    do {
      if (stopping) return
      const reply = (await redis.xautoclaim(
        stream,
        group,
        consumer,
        visibilityTimeoutMs,
        cursor,
        'COUNT',
        batch,
      )) as [string, Array<[string, Fields] | null>, string[]?]
      cursor = reply[0]
      const claimed = reply[1].filter(
        (claim): claim is [string, Fields] => claim !== null && Array.isArray(claim[1]),
      )
      if (claimed.length === 0) continue
      // Delivery counts from this consumer's pending entries over the claimed range, which may
      // also hold others of its own (failed, not idle yet): every page, not the first
      // `claimed.length` entries. A claimed entry no longer pending here was acknowledged or
      // claimed by another consumer since: it is not this consumer's to handle.
      const counts = new Map<string, number>()
      for await (const page of pendingHere(claimed[0]![0], claimed[claimed.length - 1]![0]))
        for (const [id, , , deliveries] of page) counts.set(id, Number(deliveries))
      await handleAll(
        claimed
          .filter(([id]) => counts.has(id))
          .map(([id, list]) => ({ id, fields: toFields(list), deliveries: counts.get(id)! })),
      )
    } while (cursor !== '0-0')
  }

  /** This consumer's pending entries from `start` to `end` (XPENDING), in pages of 100. */
  async function* pendingHere(start: string, end: string) {
    for (;;) {
      const page = (await redis.xpending(stream, group, start, end, 100, consumer)) as Array<
        [string, string, number, number]
      >
      yield page
      if (page.length < 100) return
      start = `(${page[page.length - 1]![0]}`
    }
  }

  /** Reads and handles new entries; resolves with how many there were. */
  async function read(): Promise<number> {
    const reply = (await (blocking as Redis).xreadgroup(
      'GROUP',
      group,
      consumer,
      'COUNT',
      batch,
      'BLOCK',
      blockMs,
      'STREAMS',
      stream,
      '>',
    )) as ReadReply
    const oldest = reply?.[0]?.[1][0]?.[0]
    lagMs = oldest ? Math.max(0, Date.now() - Number(oldest.split('-')[0])) : 0
    let count = 0
    for (const [, entries] of reply ?? []) {
      count += entries.length
      await handleAll(entries.map(([id, list]) => ({ id, fields: toFields(list), deliveries: 1 })))
    }
    return count
  }

  /**
   * Entries delivered here and not started, on stop: still pending, but marked idle for the visibility
   * timeout (XCLAIM IDLE, JUSTID so their delivery count is not raised), so the next XAUTOCLAIM of any
   * consumer takes them at once. If Redis cannot be asked, they are claimed after the timeout anyway.
   */
  async function handBack(ids: string[]): Promise<void> {
    if (ids.length === 0) return
    await redis
      .call('XCLAIM', stream, group, consumer, '0', ...ids, 'IDLE', String(visibilityTimeoutMs), 'JUSTID')
      .catch(onError)
  }

  /**
   * On stop, once nothing is being handled: everything still pending for this consumer is handed
   * back. That includes entries of a read whose reply the stop cut off (Redis delivered them, the
   * closed connection never brought them here), which no one would otherwise see before the timeout.
   */
  async function handBackPending(): Promise<void> {
    for await (const page of pendingHere('-', '+')) await handBack(page.map(([id]) => id))
  }

  async function run(): Promise<void> {
    let failures = 0
    while (!stopping) {
      try {
        if (Date.now() >= nextClaimAt) {
          nextClaimAt = Date.now() + claimIntervalMs
          await reclaim()
        }
        if (stopping) break
        await whenReady(blocking!, () => stopping)
        if (stopping) break
        const count = await read()
        failures = 0
        if (batchWaitMs > 0 && count > 0 && count < batch && !stopping) await sleep(batchWaitMs)
      } catch (err) {
        if (stopping) break
        // The stream or group vanished (Redis restarted without persistence, the key was deleted).
        if ((err as Error).message?.startsWith('NOGROUP')) await createGroup().catch(() => {})
        else onError(err)
        await sleep(Math.min(2000, 100 * 2 ** failures++))
      }
    }
  }

  async function stop(): Promise<void> {
    stopping = true
    if (starting) await starting
    if (!loop) return
    // Ends a blocked XREADGROUP now; an entry being handled still finishes on the main client.
    blocking?.disconnect()
    await loop
    await handBackPending().catch(onError)
    loop = null
    blocking = null
  }

  return {
    get running() {
      return loop !== null && !stopping
    },
    health: () => status.health({ lagMs }),
    start() {
      if (loop) return Promise.resolve()
      // Called again while starting: the same start, not a second loop.
      if (starting) return starting
      stopping = false
      status.state = 'running'
      starting = (async () => {
        // Redis unreachable now: the loop creates the group once it answers (NOGROUP).
        await createGroup().catch(onError)
        // stop() came while the group was being created: nothing starts.
        if (stopping) return
        blocking = blockingConnection(redis, blockMs)
        blocking.on('error', () => {})
        loop = run()
      })().finally(() => {
        starting = null
      })
      return starting
    },
    stop: (options) => status.stopWithin(stop(), options),
  }
}
