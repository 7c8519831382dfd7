import { optionChecker, optionKeys } from '../plugins/common/options.ts'
import { type AnyRedisClient, checkRedisClient } from '../redis/client.ts'
import { callScript, defineScript, integer } from '../redis/scripts.ts'
import { checkedOptions, InvalidArgumentError, shown } from './checks.ts'

// Leaderboards on Redis sorted sets, fed by at-least-once events: each event's amount is added to
// its member's score at most once (its id is remembered in a set next to the board, in the same
// script), scores stay exact integers, and equal scores rank by member so every rank is stable.

export interface LeaderboardOptions {
  /** Prefix of every key (default `lb:`). A board `name` is `<prefix>{<name>}`, its counted ids `<prefix>{<name>}:ids`. */
  keyPrefix?: string
}

/** One amount for one member, counted once per `id` on a board. */
export interface LeaderboardItem {
  /** The source event's id: the same id on the same board is counted once, however often it is added. */
  id: string
  member: string
  /** A positive integer (e.g. minor currency units). */
  amount: number
}

export interface LeaderboardEntry {
  /** 1 for the highest score; equal scores rank by member, ascending (byte order). */
  rank: number
  member: string
  /** The sum of the member's amounts: an exact integer, at most 2^53 - 1 (it saturates there). */
  score: number
}

export interface LeaderboardAddOptions {
  /** When the board and its ids expire (epoch ms), e.g. the end of its period plus a grace. Default never. */
  expireAtMs?: number
}

export interface Leaderboard {
  /**
   * Adds each item's amount to its member's score, except items whose id this board counted
   * before: one script call, atomic. Resolves with how many items were counted now.
   */
  add(name: string, items: readonly LeaderboardItem[], options?: LeaderboardAddOptions): Promise<number>
  /** The first `limit` entries (highest scores first). */
  top(name: string, limit: number): Promise<LeaderboardEntry[]>
  /** One member's rank and score, or null when the member has none on this board. */
  entry(name: string, member: string): Promise<LeaderboardEntry | null>
  /** The board's keys (for TTL checks, inspection). */
  keys(name: string): { board: string; ids: string }
}

const LEADERBOARD_OPTIONS = optionKeys<LeaderboardOptions>({ keyPrefix: true })
const ADD_OPTIONS = optionKeys<LeaderboardAddOptions>({ expireAtMs: true })
const ITEM_KEYS = optionKeys<LeaderboardItem>({ id: true, member: true, amount: true })

function checkName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name.length === 0)
    throw new InvalidArgumentError(`leaderboard: \`name\` must be a non-empty string, got ${shown(name)}`)
}

/** Scores are stored negated (src/lua/leaderboard-add.lua); `-0` never occurs, amounts are positive. */
const scoreOf = (stored: string) => -Number(stored)

const BOARD_ADD = defineScript({
  name: 'leaderboardAdd',
  keys: ['board', 'ids'],
  /** items: per item its id, member, amount. */
  args: ['expireAtMs', '...items'],
  /** How many items were counted now. */
  reply: integer,
})

export function createLeaderboard(client: AnyRedisClient, options: LeaderboardOptions = {}): Leaderboard {
  const redis = checkRedisClient('leaderboard', client)
  const check = optionChecker('leaderboard')
  const { keyPrefix = 'lb:' } = checkedOptions(check, options, LEADERBOARD_OPTIONS)
  if (typeof keyPrefix !== 'string') check.fail(`\`keyPrefix\` must be a string, got ${shown(keyPrefix)}`)
  // One hash tag for both keys of a board, so the script runs on one Cluster slot.
  const keys = (name: string) => ({ board: `${keyPrefix}{${name}}`, ids: `${keyPrefix}{${name}}:ids` })

  async function add(
    name: string,
    items: readonly LeaderboardItem[],
    addOptions: LeaderboardAddOptions = {},
  ): Promise<number> {
    checkName(name)
    const { expireAtMs = 0 } = checkedOptions(check, addOptions, ADD_OPTIONS, 'add')
    // 0: never (the script's "no expiry"); a past time would delete the board at once.
    if (!Number.isSafeInteger(expireAtMs) || expireAtMs < 0)
      check.fail(`add: \`expireAtMs\` must be epoch ms (an integer), got ${shown(expireAtMs)}`)
    if (!Array.isArray(items))
      throw new InvalidArgumentError(`leaderboard: \`items\` must be an array, got ${shown(items)}`)
    if (items.length === 0) return 0
    const args: Array<string | number> = []
    for (const item of items) {
      checkedOptions(check, item, ITEM_KEYS, 'add: item')
      const { id, member, amount } = item
      if (typeof id !== 'string' || id === '' || typeof member !== 'string' || member === '')
        throw new InvalidArgumentError('leaderboard: every item needs a non-empty `id` and `member`')
      if (!Number.isSafeInteger(amount) || amount < 1)
        throw new InvalidArgumentError(
          `leaderboard: the amount of '${id}' must be a positive safe integer, got ${shown(amount)}`,
        )
      args.push(id, member, amount)
    }
    const { board, ids } = keys(name)
    return callScript(redis, BOARD_ADD, { board, ids }, { expireAtMs, items: args })
  }

  async function top(name: string, limit: number): Promise<LeaderboardEntry[]> {
    checkName(name)
    if (!Number.isInteger(limit) || limit < 1)
      throw new InvalidArgumentError(
        `leaderboard: \`limit\` must be an integer of 1 or more, got ${shown(limit)}`,
      )
    const flat = await redis.zrange(keys(name).board, '0', String(limit - 1), 'WITHSCORES')
    const entries: LeaderboardEntry[] = []
    for (let i = 0; i + 1 < flat.length; i += 2)
      entries.push({ rank: i / 2 + 1, member: flat[i]!, score: scoreOf(flat[i + 1]!) })
    return entries
  }

  async function entry(name: string, member: string): Promise<LeaderboardEntry | null> {
    checkName(name)
    if (typeof member !== 'string')
      throw new InvalidArgumentError(`leaderboard: \`member\` must be a string, got ${shown(member)}`)
    const { board } = keys(name)
    // MULTI: the rank and the score of one moment (one key, so one Cluster slot).
    const replies = (await redis.multi().zrank(board, member).zscore(board, member).exec()) ?? []
    const failed = replies.find(([err]) => err)
    if (failed) throw failed[0]
    const [[, rank], [, score]] = replies as [[null, number | null], [null, string | null]]
    if (rank === null || score === null) return null
    return { rank: rank + 1, member, score: scoreOf(score) }
  }

  return { add, top, entry, keys }
}
