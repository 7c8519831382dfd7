import type { Redis } from 'ioredis'
import { runScript } from '../lua/index.ts'
import { type OptionChecker, optionChecker, optionKeys } from '../plugins/common/options.ts'
import {
  type AnyRedisClient,
  checkRedisClient,
  isCluster,
  type RedisClient,
} from '../plugins/common/redis.ts'
import { checkedOptions, shown } from './checks.ts'

/** One stream entry as a handler gets it. */
export interface StreamEntry {
  /** The entry's stream id (`<ms>-<seq>`). */
  id: string
  fields: Record<string, string>
  /** How many times the group delivered it, this delivery included (1 on the first read). */
  deliveries: number
}

export interface StreamConsumerOptions {
  /** The stream key. */
  stream: string
  /** The consumer group: every group sees every entry; within a group each entry goes to one consumer. */
  group: string
  /** This consumer's name within the group, unique per process (e.g. host and pid). */
  consumer: string
  /**
   * Processes one entry. Resolving acknowledges it (XACK); throwing leaves it pending, so it is
   * delivered again once idle longer than `visibilityTimeoutMs`. Make it idempotent: delivery is
   * at-least-once. Give this or `handleBatch`.
   */
  handler?: (entry: StreamEntry) => Promise<void>
  /**
   * Processes the entries of one read together (one Redis round trip for all, say); resolving
   * acknowledges them all in one XACK. If it throws, each entry is tried again alone through it, so
   * one failing entry neither holds back nor re-runs the others' acknowledgement. Idempotent, as `handler`.
   */
  handleBatch?: (entries: StreamEntry[]) => Promise<void>
  /** An entry pending this long (its consumer died or failed it) is claimed again (XAUTOCLAIM). Default 30 s. */
  visibilityTimeoutMs?: number
  /** After this many deliveries an entry goes to the dead-letter stream and is acknowledged. Default 5. */
  maxDeliveries?: number
  /** Where given-up entries go (their fields plus `_id`, `_group`, `_deliveries`, `_error`). Default `<stream>:dead`. */
  deadLetterStream?: string
  /** Approximate cap of the dead-letter stream (MAXLEN ~): the oldest dead letters go first. Default 10 000. */
  deadLetterMaxLen?: number
  /** Entries read per XREADGROUP / XAUTOCLAIM call. Default 10. */
  batch?: number
  /** How long one XREADGROUP blocks waiting for entries. Default 2000 ms. */
  blockMs?: number
  /**
   * After a read that got some entries but fewer than `batch`, wait this long before reading again,
   * so the next read takes what arrived meanwhile in one go: under a steady flow, fewer and fuller
   * reads (one XREADGROUP, one handleBatch and one XACK for many entries) for this much more delay.
   * Default 0 (read again at once).
   */
  batchWaitMs?: number
  /** Where a group created now starts: '0' the whole retained stream (default), '$' only new entries. */
  startId?: string
  /** How often pending entries are looked for. Default half the visibility timeout (at most 5 s). */
  claimIntervalMs?: number
  /** Called with errors of the loop (Redis unreachable, a handler's failure); the loop goes on. */
  onError?: (err: unknown, entry?: StreamEntry) => void
}

export interface StreamConsumer {
  /** Creates the group if needed (XGROUP CREATE MKSTREAM) and starts the read loop. */
  start(): Promise<void>
  /**
   * Graceful stop: no new reads; the entry (or batch) being handled finishes and is acknowledged
   * (or, if its handler fails, stays pending). Then every entry still pending for this consumer
   * (delivered and not started, a failed one, or one whose read reply the stop cut off) is handed
   * back: it stays pending, marked idle past the visibility timeout, so another consumer's next
   * claim takes it at once. Closes the blocking connection.
   */
  stop(): Promise<void>
  readonly running: boolean
}

type Fields = string[]
type ReadReply = Array<[string, Array<[string, Fields]>]> | null

/**
 * A connection of its own for the blocking reads, so they never hold up the caller's client. A read
 * is sent only while it is connected (no offline queue) and never sent again after a reconnect:
 * a read that timed out during an outage and went out once Redis was back would take entries for
 * a reply nobody awaits, and they would wait a visibility timeout. The loop waits for `ready`.
 */
function blockingConnection(redis: RedisClient, blockMs: number): RedisClient {
  const commandTimeout = blockMs + 5000
  if (isCluster(redis)) {
    return redis.duplicate(undefined, {
      // Connects now even when the caller's client connects lazily: the loop waits for `ready`.
      lazyConnect: false,
      enableOfflineQueue: false,
      redisOptions: { ...redis.options.redisOptions, commandTimeout, autoResendUnfulfilledCommands: false },
    })
  }
  return (redis as Redis).duplicate({
    commandTimeout,
    maxRetriesPerRequest: null,
    lazyConnect: false,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
  })
}

/** Resolves once the connection is ready, or at once when it is (or `stopped` says to give up). */
function whenReady(connection: RedisClient, stopped: () => boolean): Promise<void> {
  if (connection.status === 'ready' || stopped()) return Promise.resolve()
  return new Promise((resolve) => {
    const done = () => {
      clearInterval(poll)
      connection.off('ready', done)
      resolve()
    }
    connection.once('ready', done)
    // A stop disconnects the connection for good: no 'ready' comes, the loop must still end.
    const poll = setInterval(() => stopped() && done(), 50)
  })
}

function toFields(list: Fields): Record<string, string> {
  const fields: Record<string, string> = {}
  for (let i = 0; i + 1 < list.length; i += 2) fields[list[i]!] = list[i + 1]!
  return fields
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms).unref())

const CONSUMER_OPTIONS = optionKeys<StreamConsumerOptions>({
  stream: true,
  group: true,
  consumer: true,
  handler: true,
  handleBatch: true,
  visibilityTimeoutMs: true,
  maxDeliveries: true,
  deadLetterStream: true,
  deadLetterMaxLen: true,
  batch: true,
  blockMs: true,
  batchWaitMs: true,
  startId: true,
  claimIntervalMs: true,
  onError: true,
})

function checkString(check: OptionChecker, value: unknown, option: string): void {
  if (typeof value !== 'string' || value.length === 0)
    check.fail(`\`${option}\` must be a non-empty string, got ${shown(value)}`)
}

function checkInteger(check: OptionChecker, value: unknown, option: string, min: number): void {
  if (!Number.isSafeInteger(value) || (value as number) < min)
    check.fail(`\`${option}\` must be an integer of ${min} or more, got ${shown(value)}`)
}

/** The consumer's options, checked (unknown keys too) before anything connects. */
function checkConsumerOptions(options: StreamConsumerOptions): void {
  const check = optionChecker('createStreamConsumer')
  checkedOptions(check, options, CONSUMER_OPTIONS)
  for (const option of ['stream', 'group', 'consumer'] as const) checkString(check, options[option], option)
  if (!options.handler === !options.handleBatch)
    check.fail('give `handler` (one entry at a time) or `handleBatch` (a read at a time), not both')
  for (const option of ['handler', 'handleBatch', 'onError'] as const)
    if (options[option] !== undefined && typeof options[option] !== 'function')
      check.fail(`\`${option}\` must be a function, got ${shown(options[option])}`)
  for (const option of ['deadLetterStream', 'startId'] as const)
    if (options[option] !== undefined) checkString(check, options[option], option)
  const minimum = {
    visibilityTimeoutMs: 1,
    maxDeliveries: 1,
    deadLetterMaxLen: 1,
    batch: 1,
    blockMs: 1,
    batchWaitMs: 0,
    claimIntervalMs: 1,
  }
  for (const [option, min] of Object.entries(minimum) as Array<[keyof typeof minimum, number]>)
    if (options[option] !== undefined) checkInteger(check, options[option], option, min)
}

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
  /** Reports to `onError`; a callback that throws must not end the loop. */
  const onError = (err: unknown, entry?: StreamEntry) => {
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
        if (stopping) return handBack(entries.slice(index).map((e) => e.id))
        await handle(entry)
      }
      return
    }
    const fresh = entries.filter((e) => e.deliveries <= maxDeliveries)
    for (const entry of entries) if (entry.deliveries > maxDeliveries) await handle(entry)
    if (fresh.length <= 1) return fresh[0] && handle(fresh[0])
    try {
      await handleBatch(fresh)
    } catch (err) {
      onError(err)
      for (const entry of fresh) await handle(entry)
      return
    }
    await redis.xack(stream, group, ...fresh.map((e) => e.id))
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
      const claimed = reply[1].filter((e): e is [string, Fields] => e !== null && Array.isArray(e[1]))
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

  return {
    get running() {
      return loop !== null && !stopping
    },
    start() {
      if (loop) return Promise.resolve()
      // Called again while starting: the same start, not a second loop.
      if (starting) return starting
      stopping = false
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
    async stop() {
      stopping = true
      if (starting) await starting
      if (!loop) return
      // Ends a blocked XREADGROUP now; an entry being handled still finishes on the main client.
      blocking?.disconnect()
      await loop
      await handBackPending().catch(onError)
      loop = null
      blocking = null
    },
  }
}

export interface AppendOnceEntry {
  /** Names the source event (e.g. `<prefix>seen:{tag}:<eventId>`); must share its stream's hash tag. */
  marker: string
  fields: Record<string, string>
  /** The published JSON object (when there is a channel), sent with `"id"` (the entry's id) put first. Default `{}`. */
  message?: Record<string, unknown>
  /** This entry's stream, when it is not the call's `stream`: one call appends to several streams. */
  stream?: string
  /** This entry's channel, when it is not the call's `channel`. */
  channel?: string
}

export interface AppendEachOnceOptions {
  /** The stream of every entry that does not name its own. */
  stream?: string
  /** How long each marker is remembered: longer than any redelivery of the source event. */
  markerTtlMs: number
  /** Approximate cap of the streams (MAXLEN ~). Default none. */
  maxLen?: number
  /**
   * How long a stream lives after its latest append, in ms: each stream appended to gets this TTL
   * (PEXPIRE, refreshed by every append) and loses its entries older than this by the Redis clock
   * (XTRIM MINID ~, whole nodes at a time). Default none: the streams never expire.
   */
  streamTtlMs?: number
  /** Published (PUBLISH) with each entry appended now, for entries that do not name their own. */
  channel?: string
  entries: readonly AppendOnceEntry[]
}

export type AppendOnceOptions = Omit<AppendEachOnceOptions, 'entries' | 'stream'> &
  AppendOnceEntry & { stream: string }

const APPEND_EACH_ONCE_OPTIONS = optionKeys<AppendEachOnceOptions>({
  stream: true,
  markerTtlMs: true,
  maxLen: true,
  streamTtlMs: true,
  channel: true,
  entries: true,
})
const APPEND_ONCE_ENTRY_KEYS = optionKeys<AppendOnceEntry>({
  marker: true,
  fields: true,
  message: true,
  stream: true,
  channel: true,
})

/** MAXLEN ~ takes a whole number; 0 (the scripts' "no cap") is the default. */
function checkMaxLen(check: OptionChecker, maxLen: unknown): void {
  if (maxLen !== undefined && (!Number.isSafeInteger(maxLen) || (maxLen as number) < 0))
    check.fail(`\`maxLen\` must be a whole number, 0 or more, got ${shown(maxLen)}`)
}

/**
 * Entries per script call. Redis serves nobody else while a script runs (about 10 µs an entry), so a
 * large batch goes as several calls, sent together.
 */
const APPEND_ENTRIES_PER_CALL = 100

/**
 * Appends entries, each once per marker, in one script call (one round trip; several of at most
 * `APPEND_ENTRIES_PER_CALL` entries, sent together, for a larger batch): for each entry the marker
 * (SET PX) with its id, the XADD and the PUBLISH happen together or not at all; with `streamTtlMs`,
 * the same call then sets the TTL of each stream it appended to and trims their expired entries. A handler running
 * again for the same source events gets the first ids back and `appended: false`. On a Cluster,
 * entries of different streams may live on different nodes: one call per stream, all in flight
 * together.
 */
export async function appendEachOnce(
  redis: RedisClient,
  options: AppendEachOnceOptions,
): Promise<Array<{ id: string; appended: boolean }>> {
  const check: OptionChecker = optionChecker('appendEachOnce')
  checkedOptions(check, options, APPEND_EACH_ONCE_OPTIONS)
  // Checked here: in the script, a refused SET PX would come after its XADD, leaving an entry
  // without a marker that every retry appends again.
  if (!Number.isSafeInteger(options.markerTtlMs) || options.markerTtlMs <= 0)
    check.fail(
      `\`markerTtlMs\` must be a whole number of milliseconds above 0, got ${shown(options.markerTtlMs)}`,
    )
  if (
    options.streamTtlMs !== undefined &&
    (!Number.isSafeInteger(options.streamTtlMs) || options.streamTtlMs <= 0)
  )
    check.fail(
      `\`streamTtlMs\` must be a whole number of milliseconds above 0, got ${shown(options.streamTtlMs)}`,
    )
  checkMaxLen(check, options.maxLen)
  if (!Array.isArray(options.entries))
    check.fail(`\`entries\` must be an array, got ${shown(options.entries)}`)
  const entries = options.entries.map((entry: AppendOnceEntry) => {
    checkedOptions(check, entry, APPEND_ONCE_ENTRY_KEYS, 'entries[]')
    const stream = entry.stream ?? options.stream
    if (!stream) check.fail('an entry has no stream (give options.stream or entry.stream)')
    const marker: unknown = entry.marker
    if (typeof marker !== 'string' || marker === '')
      check.fail(`an entry's \`marker\` must be a non-empty string, got ${shown(marker)}`)
    return { ...entry, stream, channel: entry.channel ?? options.channel ?? '' }
  })
  // Entries by call, in order: calls to one node run in the order sent, so a stream's entries keep
  // theirs and a marker repeated in a later call finds the earlier one's.
  const perStream = isCluster(redis)
  const groups: number[][] = []
  const filling = new Map<string, number[]>()
  entries.forEach((entry, index) => {
    const key = perStream ? entry.stream : ''
    let group = filling.get(key)
    if (!group || group.length === APPEND_ENTRIES_PER_CALL) {
      group = []
      filling.set(key, group)
      groups.push(group)
    }
    group.push(index)
  })
  const results: Array<{ id: string; appended: boolean }> = new Array(entries.length)
  await Promise.all(
    groups.map(async (indexes) => {
      const keys: string[] = []
      const args: Array<string | number> = [
        options.maxLen ?? 0,
        options.markerTtlMs,
        options.streamTtlMs ?? 0,
      ]
      for (const index of indexes) {
        const entry = entries[index]!
        const fields = Object.entries(entry.fields).flat()
        keys.push(entry.stream, entry.marker)
        args.push(entry.channel, JSON.stringify(entry.message ?? {}), fields.length, ...fields)
      }
      const replies = await runScript<Array<[string, number]>>(redis, 'streamAppendOnce', keys, args)
      replies.forEach(([id, appended], i) => {
        results[indexes[i]!] = { id: String(id), appended: appended === 1 }
      })
    }),
  )
  return results
}

export interface AppendJsonEntriesOptions {
  stream: string
  /** Approximate cap of the stream (MAXLEN ~). Default none. */
  maxLen?: number
  /**
   * The entries as one JSON array, each entry an array of field/value strings
   * (`[["eventId","7","data","{...}"], ...]`), for instance built by the database query that
   * produced them. Every field and value must be a JSON string.
   */
  entries: string
}

const APPEND_JSON_OPTIONS = optionKeys<AppendJsonEntriesOptions>({
  stream: true,
  maxLen: true,
  entries: true,
})

/**
 * Appends a batch of entries, given as one JSON array, to one stream in order, in one script call:
 * the caller's process neither parses nor rebuilds an entry. Resolves with the new ids, in order.
 * Nothing is deduplicated: a caller that may run twice for the same entries absorbs duplicates
 * downstream (or uses `appendEachOnce`). A script that fails midway (a wrong key type, out of
 * memory) leaves the entries before the failure appended.
 */
export async function appendJsonEntries(
  redis: RedisClient,
  options: AppendJsonEntriesOptions,
): Promise<string[]> {
  const check = optionChecker('appendJsonEntries')
  checkedOptions(check, options, APPEND_JSON_OPTIONS)
  if (typeof options.stream !== 'string' || options.stream === '')
    check.fail(`\`stream\` must be a non-empty string, got ${shown(options.stream)}`)
  checkMaxLen(check, options.maxLen)
  if (typeof options.entries !== 'string')
    check.fail(`\`entries\` must be a JSON array as a string, got ${shown(options.entries)}`)
  const ids = await runScript<string[] | null>(
    redis,
    'streamAppendJson',
    [options.stream],
    [options.maxLen ?? 0, options.entries],
  )
  // An empty Lua table comes back as an empty array (or nil from older servers).
  return (ids ?? []).map(String)
}

/** `appendEachOnce` for one entry. */
export async function appendOnce(
  redis: RedisClient,
  options: AppendOnceOptions,
): Promise<{ id: string; appended: boolean }> {
  const { marker, fields, message, ...stream } = options
  // The options of one entry and of the call together: checked by appendEachOnce (the call's under
  // their own names, the entry's in `entries[]`).
  const [result] = await appendEachOnce(redis, { ...stream, entries: [{ marker, fields, message }] })
  return result!
}
