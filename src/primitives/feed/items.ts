import { InvalidArgumentError } from '../checks.ts'
import { isId } from './options.ts'
import type { FeedItem } from './types.ts'

// Items as a feed orders, pages and stores them: newest first by (at, id), a keyset cursor, and
// the members of the sorted sets that hold them.

/** Newest first by (at, id); ids compare by code unit, which for their ASCII is byte order, as in Redis. */
export const newestFirst = (left: FeedItem, right: FeedItem) =>
  right.at - left.at || (left.id < right.id ? 1 : left.id > right.id ? -1 : 0)
/** `left` comes strictly before (is newer than) `right`. */
export const isNewer = (left: FeedItem, right: FeedItem) => newestFirst(left, right) < 0

/** Where a page ends: the (at, id) of its last item. */
export type Cursor = { at: number; id: string }

export function encodeCursor(item: FeedItem): string {
  return Buffer.from(JSON.stringify([item.at, item.id])).toString('base64url')
}

export function decodeCursor(cursor: unknown): Cursor {
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
export interface SourcePage {
  items: FeedItem[]
  exhausted: boolean
  /** The last item the source looked at (before any filtering here): the page is complete down to it. */
  last: FeedItem | undefined
}

/** `{member, score, ...}` as items; `parse` reads a member. */
export function toItems(
  flat: string[],
  parse: (member: string) => { id: string; producer: string },
): FeedItem[] {
  const items: FeedItem[] = []
  for (let i = 0; i + 1 < flat.length; i += 2) items.push({ ...parse(flat[i]!), at: Number(flat[i + 1]) })
  return items
}

/** An item as a member of a reader's feed: its id and producer (a timeline's members are ids alone). */
export const feedMember = (item: FeedItem) => `${item.id} ${item.producer}`

export function parseFeedMember(member: string) {
  const space = member.indexOf(' ')
  return { id: member.slice(0, space), producer: member.slice(space + 1) }
}
