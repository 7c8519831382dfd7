// The feed's public shapes: an item, the application's source, the options, a page, the fan-out
// worker and the feed itself.

import type { Lifecycle } from '../../plugins/common/lifecycle.ts'

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
  /**
   * A reader's reads show its own items (those published with `producer` equal to the reader id)
   * without following itself. Default true; false when readers and producers are different kinds
   * of things whose ids may coincide (customers and accounts).
   */
  ownItems?: boolean
  /** The clock (epoch ms) of marks, modes and activity windows. Default `Date.now`. */
  now?: () => number
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
  /**
   * Called when a job is done (its item written to every active follower's feed), before it is
   * acknowledged: metrics. A job redelivered after a failure calls it again; one that throws goes
   * to `onError` and never fails the job.
   */
  onJobDone?: (job: { item: FeedItem; writes: number; skipped: number }) => void
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

/**
 * A fan-out worker's lifecycle (`Lifecycle`): `start()` creates the group if needed and starts
 * reading jobs; `stop({ deadlineMs })` finishes the jobs in hand and hands back the rest;
 * `health()` gives its state, latest error and lag (see createStreamConsumer).
 */
export interface FanoutWorker extends Lifecycle {
  /** True from `start()` until `stop()` is called. */
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
