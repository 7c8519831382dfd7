import { type OptionChecker, optionChecker, optionKeys } from '../../plugins/common/options.ts'
import { checkedOptions, InvalidArgumentError, shown } from '../checks.ts'
import type { FanoutWorkerOptions, FeedItem, FeedOptions, FeedReadOptions } from './types.ts'

// What a feed checks of what it is handed (its options, a fan-out worker's, a read's, an item, an
// id), with the defaults filled in once.

const DAY = 86_400_000
const MAX_LIMIT = 100
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
  ownItems: true,
  now: true,
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
  onJobDone: true,
})

const feedCheck = optionChecker('feed')

export const isId = (value: unknown): value is string => typeof value === 'string' && ID.test(value)

export function checkId(what: string, value: unknown): asserts value is string {
  if (!isId(value))
    throw new InvalidArgumentError(
      `feed: \`${what}\` must be 1 to 64 printable ASCII characters without spaces or braces, got ${shown(value)}`,
    )
}

function checkInteger(check: OptionChecker, name: string, value: unknown, min: number, max: number) {
  if (!Number.isSafeInteger(value) || (value as number) < min || (value as number) > max)
    check.fail(`\`${name}\` must be an integer from ${min} to ${max}, got ${shown(value)}`)
}

/** `call` names the method in the message (`publish: item`). */
export function checkItem(call: string, item: FeedItem): void {
  checkedOptions(feedCheck, item, ITEM_KEYS, `${call}: item`)
  checkId('id', item.id)
  checkId('producer', item.producer)
  if (!Number.isSafeInteger(item.at) || item.at < 0)
    throw new InvalidArgumentError(
      `feed: \`at\` must be epoch ms (a safe integer, 0 or more), got ${shown(item.at)}`,
    )
}

/** A feed's options, checked, with every default filled in. */
export type FeedSettings = Required<FeedOptions>

export function resolveFeedOptions(options: FeedOptions): FeedSettings {
  const check = feedCheck
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
    ownItems = true,
    now = Date.now,
  } = checkedOptions(check, options, FEED_OPTIONS)
  const feedTtlMs = options.feedTtlMs ?? activeWindowMs
  const timelineTtlMs = options.timelineTtlMs ?? activeWindowMs
  if (typeof source !== 'object' || source === null)
    check.fail(
      `\`source\` must be an object with followingOf, followerCountsOf and itemsOf, got ${shown(source)}`,
    )
  for (const method of ['followingOf', 'followerCountsOf', 'itemsOf'] as const)
    if (typeof source[method] !== 'function')
      check.fail(`\`source.${method}\` must be a function, got ${shown(source[method])}`)
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
  if (typeof ownItems !== 'boolean') check.fail(`\`ownItems\` must be a boolean, got ${shown(ownItems)}`)
  if (typeof now !== 'function') check.fail(`\`now\` must be a function, got ${shown(now)}`)
  return {
    source,
    keyPrefix,
    pushMaxFollowers,
    activeWindowMs,
    markActiveEveryMs,
    feedMaxItems,
    feedTtlMs,
    timelineMaxItems,
    timelineTtlMs,
    maxFollowing,
    fanoutMaxLen,
    ownItems,
    now,
  }
}

/** A read's options, checked (the cursor is decoded by the reader). */
export function resolveReadOptions(readOptions: FeedReadOptions): FeedReadOptions & { limit: number } {
  const { limit = 20, cursor = null } = checkedOptions(feedCheck, readOptions, READ_OPTIONS, 'read')
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT)
    throw new InvalidArgumentError(
      `feed: \`limit\` must be an integer from 1 to ${MAX_LIMIT}, got ${shown(limit)}`,
    )
  return { limit, cursor }
}

/** A fan-out worker's options, checked, with every default filled in. */
export type WorkerSettings = Required<Omit<FanoutWorkerOptions, 'onError' | 'onJobDone'>> &
  Pick<FanoutWorkerOptions, 'onError' | 'onJobDone'>

export function resolveWorkerOptions(workerOptions: FanoutWorkerOptions): WorkerSettings {
  const check = optionChecker('feed.createFanoutWorker')
  const {
    consumer,
    batch = 10,
    pageSize = 1000,
    visibilityTimeoutMs = 60_000,
    blockMs = 2000,
    onError,
    onJobDone,
  } = checkedOptions(check, workerOptions, WORKER_OPTIONS)
  if (typeof consumer !== 'string' || consumer === '')
    check.fail(`\`consumer\` must be a non-empty string, got ${shown(consumer)}`)
  checkInteger(check, 'batch', batch, 1, 1000)
  checkInteger(check, 'pageSize', pageSize, 1, 10_000)
  if (onError !== undefined && typeof onError !== 'function')
    check.fail(`\`onError\` must be a function, got ${shown(onError)}`)
  if (onJobDone !== undefined && typeof onJobDone !== 'function')
    check.fail(`\`onJobDone\` must be a function, got ${shown(onJobDone)}`)
  return { consumer, batch, pageSize, visibilityTimeoutMs, blockMs, onError, onJobDone }
}
