import { runScript } from '../lua/index.ts'
import { GatewayError } from '../plugins/common/errors.ts'
import { type OptionChecker, optionChecker, optionKeys } from '../plugins/common/options.ts'
import { type AnyRedisClient, checkRedisClient, isCluster } from '../plugins/common/redis.ts'
import { checkedOptions, InvalidArgumentError, shown } from './checks.ts'
import { hashSlot } from './slots.ts'
import { createStreamConsumer, type StreamEntry } from './stream-consumer.ts'

// A news feed with hybrid fan-out. A publish appends the item to its producer's timeline; for a
// producer with few followers ("pushed") a fan-out worker then writes it into the feed of each of
// its recently active followers; a producer with more followers than `pushMaxFollowers` ("pulled")
// is read from its timeline by each reader instead, so that no single publish costs millions of
// writes. A read merges the reader's feed with the timelines of the pulled producers it follows
// and its own, filters what it no longer follows and what was removed, and pages by keyset.
// Redis holds ids only, as derived data: a reader's feed that is missing (inactive, expired, lost)
// is rebuilt by pull from the application's `source` on the next read.

/** An item of a feed: ids only; the application hydrates them (by batch) from its own store. */
export interface FeedItem {
  /** Unique among all items; 1 to 64 printable ASCII characters, no space or brace. */
  id: string
  /** Who published it (the same rules as `id`). */
  producer: string
  /** When it was published, epoch ms (a safe integer, 0 or more). Never changes for an item. */
  at: number
}

/**
 * What the feed asks the application when Redis lacks something (a reader's feed, a producer's
 * timeline or follower count): the application's own store, which is the truth. Call `follow`,
 * `unfollow`, `publish` and `remove` after the change is in that store.
 */
export interface FeedSource {
  /** Every producer `reader` follows (any order; at most `maxFollowing`). */
  followingOf(reader: string): Promise<readonly string[]>
  /** The follower counts of `producers`, in the same order. */
  followerCountsOf(producers: readonly string[]): Promise<readonly number[]>
  /**
   * The newest items of `producers` taken together, at most `limit`, newest first by (at, id),
   * never a removed one. For a feed's rebuild (many producers) and a timeline's (one).
   */
  itemsOf(producers: readonly string[], options: { limit: number }): Promise<readonly FeedItem[]>
}

export interface FeedOptions {
  /** The application's store, for rebuilds. */
  source: FeedSource
  /** Prefix of every key (default `feed:`); no braces (the keys carry their own hash tags). */
  keyPrefix?: string
  /**
   * A producer with more followers than this is pulled: not fanned out, read from its timeline by
   * each of its followers. Default 10,000. 0 pulls every producer that has a follower;
   * `Number.MAX_SAFE_INTEGER` pushes them all.
   */
  pushMaxFollowers?: number
  /** Fan-out writes only to followers whose last activity mark is this recent. Default 30 days. */
  activeWindowMs?: number
  /** How often a reading reader's activity is marked (at most). Default 1 hour; below `feedTtlMs`. */
  markActiveEveryMs?: number
  /** Items kept per reader feed (the newest). Default 800. */
  feedMaxItems?: number
  /**
   * A reader's keys expire this long after its last activity mark. Default `activeWindowMs`, at most
   * that: a feed must never outlive the window in which fan-out still writes to it.
   */
  feedTtlMs?: number
  /** Items kept per producer timeline (the newest). Default 800. */
  timelineMaxItems?: number
  /** A timeline expires this long after its producer's last publish. Default `activeWindowMs`. */
  timelineTtlMs?: number
  /** A reader may follow at most this many producers. Default 5,000. */
  maxFollowing?: number
  /** Approximate cap of the fan-out stream (`XADD MAXLEN ~`). Default 1,000,000 entries. */
  fanoutMaxLen?: number
}

export interface FeedReadOptions {
  /** Items per page, 1 to 100. Default 20. */
  limit?: number
  /** The `cursor` of the previous page; none (or null) for the first page. */
  cursor?: string | null
}

export interface FeedPage {
  /** Newest first by (at, id). */
  items: FeedItem[]
  /** For the next page (opaque), or null when nothing older is left. */
  cursor: string | null
}

export interface FanoutWorkerOptions {
  /** This worker's consumer name in the fan-out group, unique per process (e.g. host and pid). */
  consumer: string
  /** Fan-out jobs (publishes) read at a time. Default 10. */
  batch?: number
  /** Followers per page of one job; a page's feeds are written with one script per hash slot. Default 1000. */
  pageSize?: number
  /** A job pending this long (its worker died) is taken over. Default 60 s. */
  visibilityTimeoutMs?: number
  /** How long one blocking read of the stream waits. Default 2000 ms. */
  blockMs?: number
  /** Errors of the loop and of jobs (a job that fails is retried, then dead-lettered). */
  onError?: (err: unknown) => void
}

export interface FanoutStats {
  /** Fan-out jobs done by this worker (a job redelivered after a failure counts again). */
  jobs: number
  /** Feeds an item was added to. */
  writes: number
  /** Active followers whose feed was missing (not written: rebuilt by pull when they return). */
  skipped: number
  /** The most feeds one job wrote to. */
  largestFanout: number
}

export interface FanoutWorker {
  /** Creates the group if needed and starts reading jobs. */
  start(): Promise<void>
  /** Finishes the jobs in hand and hands back the rest (see createStreamConsumer). */
  stop(): Promise<void>
  readonly running: boolean
  /** This worker's counters since it was created. */
  stats(): FanoutStats
}

export interface FanoutLag {
  /** Fan-out jobs not done yet: not delivered to a worker, or delivered and not acknowledged. */
  entries: number
  /** Of those, delivered and not acknowledged. */
  pending: number
  /** Age of the oldest of them (ms), 0 when there is none. */
  oldestAgeMs: number
}

export interface ReaderKeys {
  feed: string
  following: string
  pulled: string
  meta: string
}

export interface ProducerKeys {
  timeline: string
  followers: string
  meta: string
  deleted: string
}

export interface Feed {
  /** `reader` now follows `producer` (after the application stored it). Idempotent. */
  follow(reader: string, producer: string): Promise<void>
  /** `reader` no longer follows `producer`: its items drop out of the reader's reads. Idempotent. */
  unfollow(reader: string, producer: string): Promise<void>
  /**
   * Appends the item to its producer's timeline (visible at once to the producer's own reads and to
   * followers reading it by pull) and, for a pushed producer, enqueues its fan-out. Resolves with
   * whether a fan-out job was enqueued. Retrying after a failure is safe.
   */
  publish(item: FeedItem): Promise<{ fanout: boolean }>
  /** Hides the item from every read and drops it from its producer's timeline. */
  remove(item: FeedItem): Promise<void>
  /** One page of `reader`'s feed, newest first; rebuilds the feed by pull first if it is missing. */
  read(reader: string, options?: FeedReadOptions): Promise<FeedPage>
  /** A worker that fans out published items (run one per process, as many processes as needed). */
  createFanoutWorker(options: FanoutWorkerOptions): FanoutWorker
  /** The fan-out backlog: jobs not done and the age of the oldest. */
  fanoutLag(): Promise<FanoutLag>
  readonly keys: {
    reader(reader: string): ReaderKeys
    producer(producer: string): ProducerKeys
    /** The fan-out stream (its consumer group is `fanout`). */
    fanout: string
  }
}

/** The application's `source` answered something the feed cannot use. */
export class FeedSourceError extends GatewayError {
  constructor(message: string) {
    super('FRG_FEED_SOURCE_INVALID', `feed: ${message}`)
  }
}

/** `follow` would take the reader past `maxFollowing` producers. */
export class FeedFollowLimitError extends GatewayError {
  readonly reader: string
  readonly maxFollowing: number
  constructor(reader: string, maxFollowing: number) {
    super(
      'FRG_FEED_FOLLOW_LIMIT',
      `feed: '${reader}' follows ${maxFollowing} producers already (maxFollowing)`,
    )
    this.reader = reader
    this.maxFollowing = maxFollowing
  }
}

/** A feed or timeline vanished again and again while being rebuilt (Redis evicting or flushing it). */
export class FeedRebuildError extends GatewayError {
  constructor(what: string) {
    super('FRG_FEED_REBUILD_FAILED', `feed: ${what} vanished three times while being rebuilt`)
  }
}

const DAY = 86_400_000
/** How long a follower count from the application is trusted before the next publish asks again. */
const COUNT_REFRESH_MS = DAY
/** A fan-out job's snapshot of followers outlives a worker that died holding it this long. */
const SNAPSHOT_TTL_MS = 600_000
/** Keys per script call on one Redis: Redis serves nobody else while a script runs. */
const KEYS_PER_CALL = 500
/** Timelines one script call reads a page of each (on one Redis; on a Cluster, those of one slot). */
const TIMELINES_PER_CALL = 100
const MAX_LIMIT = 100
const FANOUT_GROUP = 'fanout'
/** 1 to 64 characters from '!' to '~' except '{' and '}': no space (the feed's separator), no hash tag. */
const ID = /^[!-z|~]{1,64}$/

const FEED_OPTIONS = optionKeys<FeedOptions>({
  source: true,
  keyPrefix: true,
  pushMaxFollowers: true,
  activeWindowMs: true,
  markActiveEveryMs: true,
  feedMaxItems: true,
  feedTtlMs: true,
  timelineMaxItems: true,
  timelineTtlMs: true,
  maxFollowing: true,
  fanoutMaxLen: true,
})
const READ_OPTIONS = optionKeys<FeedReadOptions>({ limit: true, cursor: true })
const ITEM_KEYS = optionKeys<FeedItem>({ id: true, producer: true, at: true })
const WORKER_OPTIONS = optionKeys<FanoutWorkerOptions>({
  consumer: true,
  batch: true,
  pageSize: true,
  visibilityTimeoutMs: true,
  blockMs: true,
  onError: true,
})

const isId = (value: unknown): value is string => typeof value === 'string' && ID.test(value)

function checkId(what: string, value: unknown): asserts value is string {
  if (!isId(value))
    throw new InvalidArgumentError(
      `feed: \`${what}\` must be 1 to 64 printable ASCII characters without spaces or braces, got ${shown(value)}`,
    )
}

function checkInteger(check: OptionChecker, name: string, value: unknown, min: number, max: number) {
  if (!Number.isSafeInteger(value) || (value as number) < min || (value as number) > max)
    check.fail(`\`${name}\` must be an integer from ${min} to ${max}, got ${shown(value)}`)
}

function checkItem(check: OptionChecker, call: string, item: FeedItem): void {
  checkedOptions(check, item, ITEM_KEYS, `${call}: item`)
  checkId('id', item.id)
  checkId('producer', item.producer)
  if (!Number.isSafeInteger(item.at) || item.at < 0)
    throw new InvalidArgumentError(
      `feed: \`at\` must be epoch ms (a safe integer, 0 or more), got ${shown(item.at)}`,
    )
}

/** Newest first by (at, id); ids compare by code unit, which for their ASCII is byte order, as in Redis. */
const newestFirst = (a: FeedItem, b: FeedItem) => b.at - a.at || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0)
/** a comes strictly before (is newer than) b. */
const isNewer = (a: FeedItem, b: FeedItem) => newestFirst(a, b) < 0

type Cursor = { at: number; id: string }

function encodeCursor(item: FeedItem): string {
  return Buffer.from(JSON.stringify([item.at, item.id])).toString('base64url')
}

function decodeCursor(cursor: unknown): Cursor {
  const invalid = () => new InvalidArgumentError(`feed: \`cursor\` is not a cursor this feed returned`)
  if (typeof cursor !== 'string' || cursor.length > 200 || !/^[A-Za-z0-9_-]+$/.test(cursor)) throw invalid()
  let value: unknown
  try {
    value = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'))
  } catch {
    throw invalid()
  }
  if (!Array.isArray(value) || value.length !== 2) throw invalid()
  const [at, id] = value as [unknown, unknown]
  if (!Number.isSafeInteger(at) || (at as number) < 0 || !isId(id)) throw invalid()
  return { at: at as number, id }
}

/** A page of one source (the feed, a timeline): newest first, and whether anything is left after `last`. */
interface Part {
  items: FeedItem[]
  exhausted: boolean
  /** The last item the source looked at (before any filtering here): the page is complete down to it. */
  last: FeedItem | undefined
}

/** `{member, score, ...}` as items; `parse` reads a member. */
function toItems(flat: string[], parse: (member: string) => { id: string; producer: string }): FeedItem[] {
  const items: FeedItem[] = []
  for (let i = 0; i + 1 < flat.length; i += 2) items.push({ ...parse(flat[i]!), at: Number(flat[i + 1]) })
  return items
}

const feedMember = (item: FeedItem) => `${item.id} ${item.producer}`
function parseFeedMember(member: string) {
  const space = member.indexOf(' ')
  return { id: member.slice(0, space), producer: member.slice(space + 1) }
}

/** Runs `fn` once per key at a time: callers asking while it runs share its promise. */
function singleFlight<T>(fn: (key: string) => Promise<T>): (key: string) => Promise<T> {
  const running = new Map<string, Promise<T>>()
  return (key) => {
    let promise = running.get(key)
    if (!promise) {
      promise = fn(key).finally(() => running.delete(key))
      running.set(key, promise)
    }
    return promise
  }
}

export function createFeed(client: AnyRedisClient, options: FeedOptions): Feed {
  const redis = checkRedisClient('feed', client)
  const check = optionChecker('feed')
  const {
    source,
    keyPrefix = 'feed:',
    pushMaxFollowers = 10_000,
    activeWindowMs = 30 * DAY,
    markActiveEveryMs = 3_600_000,
    feedMaxItems = 800,
    timelineMaxItems = 800,
    maxFollowing = 5000,
    fanoutMaxLen = 1_000_000,
  } = checkedOptions(check, options, FEED_OPTIONS)
  const feedTtlMs = options.feedTtlMs ?? activeWindowMs
  const timelineTtlMs = options.timelineTtlMs ?? activeWindowMs
  if (typeof source !== 'object' || source === null)
    check.fail(
      `\`source\` must be an object with followingOf, followerCountsOf and itemsOf, got ${shown(source)}`,
    )
  for (const fn of ['followingOf', 'followerCountsOf', 'itemsOf'] as const)
    if (typeof source[fn] !== 'function')
      check.fail(`\`source.${fn}\` must be a function, got ${shown(source[fn])}`)
  if (typeof keyPrefix !== 'string' || /[{}]/.test(keyPrefix))
    check.fail(`\`keyPrefix\` must be a string without braces, got ${shown(keyPrefix)}`)
  checkInteger(check, 'pushMaxFollowers', pushMaxFollowers, 0, Number.MAX_SAFE_INTEGER)
  checkInteger(check, 'activeWindowMs', activeWindowMs, 1000, Number.MAX_SAFE_INTEGER)
  checkInteger(check, 'feedTtlMs', feedTtlMs, 1000, activeWindowMs)
  checkInteger(check, 'markActiveEveryMs', markActiveEveryMs, 1, feedTtlMs - 1)
  checkInteger(check, 'feedMaxItems', feedMaxItems, 1, 10_000)
  checkInteger(check, 'timelineMaxItems', timelineMaxItems, 1, 10_000)
  checkInteger(check, 'timelineTtlMs', timelineTtlMs, 1000, Number.MAX_SAFE_INTEGER)
  checkInteger(check, 'maxFollowing', maxFollowing, 1, 100_000)
  checkInteger(check, 'fanoutMaxLen', fanoutMaxLen, 1000, Number.MAX_SAFE_INTEGER)

  const cluster = isCluster(redis)
  const readerTag = (reader: string) => `r:${reader}`
  const producerTag = (producer: string) => `p:${producer}`
  const readerKeys = (reader: string): ReaderKeys => {
    const base = `${keyPrefix}{${readerTag(reader)}}`
    return {
      feed: `${base}:feed`,
      following: `${base}:following`,
      pulled: `${base}:pulled`,
      meta: `${base}:meta`,
    }
  }
  const producerKeys = (producer: string): ProducerKeys => {
    const base = `${keyPrefix}{${producerTag(producer)}}`
    return {
      timeline: `${base}:timeline`,
      followers: `${base}:followers`,
      meta: `${base}:meta`,
      deleted: `${base}:deleted`,
    }
  }
  const readerKeyList = (reader: string) => {
    const k = readerKeys(reader)
    return [k.feed, k.following, k.pulled, k.meta]
  }
  const fanoutStream = `${keyPrefix}{fanout}`
  /** Mode arguments of the producer scripts: the threshold, the grace after going pulled, the stickiness after going pushed. */
  const modeArgs = [pushMaxFollowers, markActiveEveryMs, activeWindowMs]

  /**
   * `values` in the groups one script call may take: one per hash slot on a Cluster (a script's keys
   * share a slot), at most `perCall` each on one Redis.
   */
  function scriptGroups<T>(values: readonly T[], tagOf: (value: T) => string, perCall: number): T[][] {
    const bySlot = new Map<number, T[]>()
    for (const value of values) {
      const slot = cluster ? hashSlot(tagOf(value)) : 0
      const group = bySlot.get(slot)
      if (group) group.push(value)
      else bySlot.set(slot, [value])
    }
    const groups: T[][] = []
    for (const group of bySlot.values())
      for (let i = 0; i < group.length; i += perCall) groups.push(group.slice(i, i + perCall))
    return groups
  }

  // The application's answers, checked: a wrong one fails loudly instead of corrupting a feed.

  async function sourceFollowing(reader: string): Promise<string[]> {
    const list = await source.followingOf(reader)
    if (!Array.isArray(list)) throw new FeedSourceError(`followingOf('${reader}') must resolve with an array`)
    const unique = [...new Set<unknown>(list)]
    const bad = unique.find((p) => !isId(p))
    if (bad !== undefined)
      throw new FeedSourceError(`followingOf('${reader}') answered a bad id: ${shown(bad)}`)
    if (unique.length > maxFollowing)
      throw new FeedSourceError(
        `followingOf('${reader}') answered ${unique.length} producers, above maxFollowing`,
      )
    return unique as string[]
  }

  async function sourceCounts(producers: readonly string[]): Promise<number[]> {
    const counts = await source.followerCountsOf(producers)
    if (!Array.isArray(counts) || counts.length !== producers.length)
      throw new FeedSourceError(
        `followerCountsOf must resolve with one count per producer (${producers.length})`,
      )
    for (const n of counts)
      if (!Number.isSafeInteger(n) || n < 0)
        throw new FeedSourceError(`followerCountsOf answered a count that is not a whole number: ${shown(n)}`)
    return counts as number[]
  }

  async function sourceItems(producers: readonly string[], limit: number): Promise<FeedItem[]> {
    const items = await source.itemsOf(producers, { limit })
    if (!Array.isArray(items)) throw new FeedSourceError('itemsOf must resolve with an array of items')
    const asked = new Set(producers)
    for (const item of items as unknown[]) {
      const { id, producer, at } = (item ?? {}) as Partial<FeedItem>
      if (!isId(id) || !isId(producer) || !Number.isSafeInteger(at) || (at as number) < 0)
        throw new FeedSourceError(`itemsOf answered an item that is not { id, producer, at }: ${shown(item)}`)
      if (!asked.has(producer))
        throw new FeedSourceError(`itemsOf answered an item of '${producer}', not asked for`)
    }
    // The newest `limit`, whatever order came.
    return [...(items as FeedItem[])].sort(newestFirst).slice(0, limit)
  }

  /**
   * Runs feed-producers for one reader on `producers`: counts, modes and the reader in their
   * followers sets. A producer with no meta gets its count from the application (a follow or a
   * mark; an unfollow has nothing to take off). Resolves with each producer's mode
   * (2 * fanout + byPull; -1 for an unfollow of a producer Redis knows nothing of).
   */
  async function producerModes(
    reader: string,
    producers: readonly string[],
    delta: number,
    mark: string,
  ): Promise<number[]> {
    const modes = new Array<number>(producers.length).fill(-1)
    const now = Date.now()
    const run = (indexes: number[], counts?: Map<number, number>) =>
      Promise.all(
        scriptGroups(indexes, (i) => producerTag(producers[i]!), KEYS_PER_CALL / 2).map(async (group) => {
          const keys: string[] = []
          const args: Array<string | number> = [reader, mark, now, ...modeArgs]
          for (const i of group) {
            const k = producerKeys(producers[i]!)
            keys.push(k.meta, k.followers)
            args.push(delta, counts?.get(i) ?? '')
          }
          const reply = await runScript<number[]>(redis, 'feedProducers', keys, args)
          group.forEach((i, j) => {
            modes[i] = Number(reply[j])
          })
        }),
      )
    await run(producers.map((_, i) => i))
    const missing = modes.flatMap((mode, i) => (mode === -1 ? [i] : []))
    if (missing.length > 0 && delta >= 0) {
      const counts = await sourceCounts(missing.map((i) => producers[i]!))
      await run(missing, new Map(missing.map((i, j) => [i, counts[j]!])))
    }
    return modes
  }
  const byPull = (mode: number) => mode >= 0 && (mode & 1) === 1

  // Timelines.

  const buildTimeline = singleFlight(async (producer: string) => {
    const key = producerKeys(producer).timeline
    await runScript(redis, 'feedTimeline', [key], ['start', timelineTtlMs])
    const items = await sourceItems([producer], timelineMaxItems)
    const args: Array<string | number> = ['finish', timelineTtlMs, timelineMaxItems]
    for (const item of items) args.push(item.at, item.id)
    await runScript(redis, 'feedTimeline', [key], args)
  })

  /**
   * Up to `k` items of each producer's timeline after the cursor, in the order of `producers`:
   * one script call per hash slot (one for all on a single Redis), all in flight together; a
   * missing timeline is built from the source and read again.
   */
  async function timelineParts(
    producers: readonly string[],
    after: Cursor | null,
    k: number,
  ): Promise<Part[]> {
    const parts = new Array<Part | undefined>(producers.length)
    let wanted = producers.map((_, i) => i)
    for (let attempt = 0; wanted.length > 0; attempt++) {
      if (attempt === 3) throw new FeedRebuildError(`the timeline of '${producers[wanted[0]!]}'`)
      await Promise.all(
        scriptGroups(wanted, (i) => producerTag(producers[i]!), TIMELINES_PER_CALL).map(async (group) => {
          const replies = await runScript<Array<[number, number, string[]]>>(
            redis,
            'feedTimeline',
            group.map((i) => producerKeys(producers[i]!).timeline),
            ['range', after?.at ?? '', after?.id ?? '', k],
          )
          group.forEach((i, j) => {
            const [state, exhausted, flat] = replies[j]!
            if (state !== 1) return
            const producer = producers[i]!
            const items = toItems(flat, (id) => ({ id, producer }))
            parts[i] = { items, exhausted: exhausted === 1, last: items.at(-1) }
          })
        }),
      )
      wanted = wanted.filter((i) => !parts[i])
      await Promise.all(wanted.map((i) => buildTimeline(producers[i]!)))
    }
    return parts as Part[]
  }

  // A reader's feed.

  const rebuild = singleFlight(async (reader: string) => {
    const keys = readerKeyList(reader)
    for (let attempt = 0; attempt < 3; attempt++) {
      const now = Date.now()
      const expireAt = now + feedTtlMs
      await runScript(redis, 'feedBuild', keys, ['start', expireAt])
      const following = await sourceFollowing(reader)
      // Before the items are asked for: a fan-out that misses the reader from now on can only be of
      // an item stored before, which the application's answer holds.
      const modes = await producerModes(reader, following, 0, String(now))
      const pulled = following.filter((_, i) => byPull(modes[i]!))
      const pushed = following.filter((_, i) => !byPull(modes[i]!))
      const items = pushed.length > 0 ? await sourceItems(pushed, feedMaxItems) : []
      const args: Array<string | number> = [
        'finish',
        expireAt,
        now,
        feedMaxItems,
        following.length,
        ...following,
      ]
      args.push(pulled.length, ...pulled)
      for (const item of items) args.push(item.at, feedMember(item))
      if ((await runScript<number>(redis, 'feedBuild', keys, args)) === 1) return
    }
    throw new FeedRebuildError(`the feed of '${reader}'`)
  })

  /** Marks `reader` active: its score in the followers sets of the producers it follows, then its mark. */
  const markActive = singleFlight(async (reader: string) => {
    const { following } = readerKeys(reader)
    const producers = await redis.smembers(following)
    const now = Date.now()
    const modes = await producerModes(reader, producers, 0, String(now))
    const args: Array<string | number> = [now, now + feedTtlMs]
    producers.forEach((producer, i) => {
      args.push(producer, byPull(modes[i]!) ? 1 : 0)
    })
    await runScript(redis, 'feedMarked', readerKeyList(reader), args)
  })

  interface FeedPart extends Part {
    pulled: string[]
  }

  /** Up to `k` pushed items of `reader`'s feed after the cursor; builds or marks first when due. */
  async function feedPart(
    reader: string,
    after: Cursor | null,
    k: number,
    withPulled: boolean,
  ): Promise<FeedPart> {
    const keys = readerKeyList(reader)
    for (let attempt = 0; attempt < 4; attempt++) {
      const reply = await runScript<[number, ...unknown[]]>(redis, 'feedRead', keys, [
        Date.now(),
        markActiveEveryMs,
        after?.at ?? '',
        after?.id ?? '',
        k,
        withPulled ? 1 : 0,
      ])
      if (reply[0] === 2) {
        const [, exhausted, pulled, flat] = reply as [number, number, string[], string[]]
        const items = toItems(flat, parseFeedMember)
        return { items, exhausted: exhausted === 1, last: items.at(-1), pulled }
      }
      if (reply[0] === 1) await markActive(reader)
      else await rebuild(reader)
    }
    throw new FeedRebuildError(`the feed of '${reader}'`)
  }

  /** The ids among `items` their producers removed: one script call per hash slot, all in flight together. */
  async function removedAmong(items: FeedItem[]): Promise<Set<string>> {
    const byProducer = new Map<string, string[]>()
    for (const item of items) {
      const ids = byProducer.get(item.producer)
      if (ids) ids.push(item.id)
      else byProducer.set(item.producer, [item.id])
    }
    const removed = new Set<string>()
    await Promise.all(
      scriptGroups([...byProducer], ([producer]) => producerTag(producer), KEYS_PER_CALL).map(
        async (group) => {
          const args: Array<string | number> = []
          for (const [, ids] of group) args.push(ids.length, ...ids)
          const found = await runScript<string[]>(
            redis,
            'feedRemoved',
            group.map(([producer]) => producerKeys(producer).deleted),
            args,
          )
          for (const id of found) removed.add(String(id))
        },
      ),
    )
    return removed
  }

  async function read(reader: string, readOptions: FeedReadOptions = {}): Promise<FeedPage> {
    checkId('reader', reader)
    const { limit = 20, cursor = null } = checkedOptions(check, readOptions, READ_OPTIONS, 'read')
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT)
      throw new InvalidArgumentError(
        `feed: \`limit\` must be an integer from 1 to ${MAX_LIMIT}, got ${shown(limit)}`,
      )
    let after = cursor === null || cursor === undefined ? null : decodeCursor(cursor)
    const page: FeedItem[] = []
    const seen = new Set<string>()
    let pulled: string[] | null = null
    for (;;) {
      const need = limit - page.length
      let feed: FeedPart
      let own: Part
      let timelines: Part[]
      let removed: Set<string>
      if (pulled === null) {
        // First round: the feed (which names the pulled producers) and the reader's own timeline
        // together, then the pulled timelines and the removal checks together.
        let ownParts: Part[]
        ;[feed, ownParts] = await Promise.all([
          feedPart(reader, after, need, true),
          timelineParts([reader], after, need),
        ])
        own = ownParts[0]!
        pulled = feed.pulled.filter((producer) => producer !== reader)
        ;[timelines, removed] = await Promise.all([
          pulled.length > 0 ? timelineParts(pulled, after, need) : [],
          removedAmong(feed.items),
        ])
      } else {
        let all: Part[]
        ;[feed, all] = await Promise.all([
          feedPart(reader, after, need, false),
          timelineParts([reader, ...pulled], after, need),
        ])
        ;[own, ...timelines] = all as [Part, ...Part[]]
        removed = await removedAmong(feed.items)
      }
      if (removed.size > 0) {
        // Found once, gone from this feed: the next reads need not check it again.
        const gone = feed.items.filter((item) => removed.has(item.id)).map(feedMember)
        await redis.zrem(readerKeys(reader).feed, ...gone)
      }
      const parts: Part[] = [
        { ...feed, items: feed.items.filter((item) => !removed.has(item.id)) },
        own,
        ...timelines,
      ]
      // Every source is complete down to its last item, or all of it: the merge is exact down to
      // the newest of those last items (the cut).
      let cut: FeedItem | undefined
      for (const part of parts)
        if (!part.exhausted && part.last && (!cut || isNewer(part.last, cut))) cut = part.last
      const merged = parts
        .flatMap((part) => part.items)
        .filter((item) => !cut || !isNewer(cut, item))
        .sort(newestFirst)
      let rest = false
      for (const item of merged) {
        if (seen.has(item.id)) continue
        if (page.length === limit) {
          rest = true
          break
        }
        seen.add(item.id)
        page.push(item)
      }
      if (page.length === limit) {
        const more = rest || cut !== undefined
        return { items: page, cursor: more ? encodeCursor(page.at(-1)!) : null }
      }
      if (!cut) return { items: page, cursor: null }
      after = { at: cut.at, id: cut.id }
    }
  }

  // Follow graph.

  async function follow(reader: string, producer: string): Promise<void> {
    checkId('reader', reader)
    checkId('producer', producer)
    const keys = readerKeyList(reader)
    const [state, mark] = await runScript<[number, string?]>(redis, 'feedFollow', keys, [
      'follow',
      producer,
      maxFollowing,
    ])
    if (state === -2) throw new FeedFollowLimitError(reader, maxFollowing)
    const built = state >= 0
    // A reader without a built feed: only the producer's count moves; its next read builds the feed.
    const [mode] = await producerModes(reader, [producer], state === 0 ? 0 : 1, built ? String(mark) : '')
    if (!built) return
    const pull = byPull(mode!)
    // A pushed producer's recent items join the feed now, as a pulled one's show through its timeline.
    const recent = pull
      ? []
      : (await timelineParts([producer], null, Math.min(feedMaxItems, timelineMaxItems)))[0]!.items
    const args: Array<string | number> = ['followed', producer, pull ? 1 : 0, feedMaxItems]
    for (const item of recent) args.push(item.at, feedMember(item))
    await runScript(redis, 'feedFollow', keys, args)
  }

  async function unfollow(reader: string, producer: string): Promise<void> {
    checkId('reader', reader)
    checkId('producer', producer)
    const removed = await runScript<number>(redis, 'feedFollow', readerKeyList(reader), [
      'unfollow',
      producer,
    ])
    if (removed === 0) return
    await producerModes(reader, [producer], -1, '')
  }

  // Items.

  async function publish(item: FeedItem): Promise<{ fanout: boolean }> {
    checkItem(check, 'publish', item)
    const k = producerKeys(item.producer)
    let count = ''
    for (let attempt = 0; attempt < 4; attempt++) {
      const reply = await runScript<number>(
        redis,
        'feedPublish',
        [k.timeline, k.meta, k.followers],
        [item.id, item.at, timelineMaxItems, timelineTtlMs, Date.now(), ...modeArgs, count, COUNT_REFRESH_MS],
      )
      if (reply === -1) count = String((await sourceCounts([item.producer]))[0])
      else if (reply === -2) await buildTimeline(item.producer)
      else {
        if (reply === 1) {
          await redis.xadd(
            fanoutStream,
            'MAXLEN',
            '~',
            fanoutMaxLen,
            '*',
            'id',
            item.id,
            'producer',
            item.producer,
            'at',
            String(item.at),
          )
        }
        return { fanout: reply === 1 }
      }
    }
    throw new FeedRebuildError(`the timeline of '${item.producer}'`)
  }

  async function remove(item: FeedItem): Promise<void> {
    checkItem(check, 'remove', item)
    const k = producerKeys(item.producer)
    await runScript(redis, 'feedRemove', [k.timeline, k.deleted], [item.id, item.at, feedMaxItems, feedTtlMs])
  }

  // Fan-out.

  function createFanoutWorker(workerOptions: FanoutWorkerOptions): FanoutWorker {
    const workerCheck = optionChecker('feed.createFanoutWorker')
    const {
      consumer,
      batch = 10,
      pageSize = 1000,
      visibilityTimeoutMs = 60_000,
      blockMs = 2000,
      onError,
    } = checkedOptions(workerCheck, workerOptions, WORKER_OPTIONS)
    if (typeof consumer !== 'string' || consumer === '')
      workerCheck.fail(`\`consumer\` must be a non-empty string, got ${shown(consumer)}`)
    checkInteger(workerCheck, 'batch', batch, 1, 1000)
    checkInteger(workerCheck, 'pageSize', pageSize, 1, 10_000)
    if (onError !== undefined && typeof onError !== 'function')
      workerCheck.fail(`\`onError\` must be a function, got ${shown(onError)}`)
    const stats: FanoutStats = { jobs: 0, writes: 0, skipped: 0, largestFanout: 0 }

    async function fanOut(entry: StreamEntry): Promise<void> {
      const { id, producer, at } = entry.fields
      const item = { id, producer, at: Number(at) } as FeedItem
      if (!isId(item.id) || !isId(item.producer) || !Number.isSafeInteger(item.at))
        throw new InvalidArgumentError(`feed: fan-out entry ${entry.id} is not an item`)
      const k = producerKeys(item.producer)
      const snapshot = `${keyPrefix}{${producerTag(item.producer)}}:fanout:${entry.id}`
      const followers = await runScript<number>(
        redis,
        'feedFanoutStart',
        [k.followers, snapshot],
        [Date.now() - activeWindowMs, SNAPSHOT_TTL_MS],
      )
      let writes = 0
      let skipped = 0
      for (let offset = 0; offset < followers; offset += pageSize) {
        const readers = await redis.zrange(snapshot, String(offset), String(offset + pageSize - 1))
        const replies = await Promise.all(
          scriptGroups(readers, readerTag, KEYS_PER_CALL).map((group) =>
            runScript<[number, number]>(
              redis,
              'feedFanout',
              group.map((reader) => readerKeys(reader).feed),
              [feedMaxItems, item.at, feedMember(item)],
            ),
          ),
        )
        for (const [added, missing] of replies) {
          writes += Number(added)
          skipped += Number(missing)
        }
      }
      if (followers > 0) await redis.del(snapshot)
      stats.jobs++
      stats.writes += writes
      stats.skipped += skipped
      stats.largestFanout = Math.max(stats.largestFanout, writes)
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
      stop: () => streamConsumer.stop(),
      get running() {
        return streamConsumer.running
      },
      stats: () => ({ ...stats }),
    }
  }

  const ageOf = (entryId: string | undefined, now: number) =>
    entryId ? Math.max(0, now - Number(entryId.split('-')[0])) : 0

  async function fanoutLag(): Promise<FanoutLag> {
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
      const after = (await redis.xrange(
        fanoutStream,
        `(${lastDelivered}`,
        '+',
        'COUNT',
        100_000,
      )) as unknown[]
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

  return {
    follow,
    unfollow,
    publish,
    remove,
    read,
    createFanoutWorker,
    fanoutLag,
    keys: { reader: readerKeys, producer: producerKeys, fanout: fanoutStream },
  }
}
