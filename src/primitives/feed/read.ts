import { randomBytes } from 'node:crypto'
import { callScript } from '../../redis/scripts.ts'
import { type FeedContext, KEYS_PER_CALL, singleFlight } from './context.ts'
import { FeedRebuildError } from './errors.ts'
import type { FollowGraph } from './follow-graph.ts'
import {
  type Cursor,
  decodeCursor,
  encodeCursor,
  feedMember,
  isNewer,
  newestFirst,
  parseFeedMember,
  type SourcePage,
  toItems,
} from './items.ts'
import { checkId, resolveReadOptions } from './options.ts'
import { FEED_BUILD, FEED_READ, FEED_REMOVED } from './scripts.ts'
import type { Timelines } from './timelines.ts'
import type { FeedItem, FeedPage, FeedReadOptions } from './types.ts'

// A reader's read: its feed (rebuilt by pull when missing), its own timeline and those of the
// pulled producers it follows, merged newest first without the removed items, paged by keyset.

/** The own timeline of a reader when `ownItems` is false. */
const NOTHING: SourcePage = { items: [], exhausted: true, last: undefined }

/** A producer's keys were found lost during a read: the read starts again (on a rebuilt feed). */
class ProducerLost extends Error {}

/** The reader's feed as a source: a page of its pushed items and the pulled producers it names. */
interface FeedSourcePage extends SourcePage {
  pulled: string[]
}

export function createFeedReader(
  context: FeedContext,
  graph: FollowGraph,
  timelines: Timelines,
): (reader: string, readOptions?: FeedReadOptions) => Promise<FeedPage> {
  const { redis, settings, producerKeys, producerTag, readerKeys, scriptGroups, source } = context
  const { feedTtlMs, feedMaxItems, markActiveEveryMs, ownItems } = settings

  const rebuild = singleFlight(async (reader: string) => {
    const keys = readerKeys(reader)
    for (let attempt = 0; attempt < 5; attempt++) {
      const now = settings.now()
      const expireAt = now + feedTtlMs
      // Read before 'start': a loss noted from now on is newer than this build, which builds again.
      const losses = await context.lossToken()
      const token = randomBytes(8).toString('hex')
      await callScript(redis, FEED_BUILD.start, keys, { expireAt, token })
      const following = await source.following(reader)
      // Before the items are asked for: a fan-out that misses the reader from now on can only be of
      // an item stored before, which the application's answer holds.
      const modes = await graph.producerModes(reader, following, 0, String(now))
      const pulled = following.filter((_, i) => modes[i]!.byPull)
      // Every producer still fanned out, pulled ones in their grace and pushed-again ones still read
      // by pull among them: when that ends, the feed must hold what they published before.
      const copied = following.filter((_, i) => modes[i]!.fansOut)
      const items = copied.length > 0 ? await source.items(copied, feedMaxItems) : []
      const rest: Array<string | number> = [following.length, ...following, pulled.length, ...pulled]
      for (const item of items) rest.push(item.at, feedMember(item))
      const reply = await callScript(redis, FEED_BUILD.finish, keys, {
        expireAt,
        mark: now,
        feedMaxItems,
        token,
        lossToken: losses,
        rest,
      })
      if (reply !== 'buildAgain') return
    }
    throw new FeedRebuildError(`the feed of '${reader}'`)
  })

  /** Up to `limit` pushed items of `reader`'s feed after the cursor; builds or marks first when due. */
  async function feedPage(
    reader: string,
    after: Cursor | null,
    limit: number,
    withPulled: boolean,
  ): Promise<FeedSourcePage> {
    const keys = readerKeys(reader)
    for (let attempt = 0; attempt < 4; attempt++) {
      const reply = await callScript(redis, FEED_READ, keys, {
        now: settings.now(),
        markEveryMs: markActiveEveryMs,
        afterAt: after?.at ?? '',
        afterId: after?.id ?? '',
        limit,
        withPulled: withPulled ? 1 : 0,
        lossToken: await context.lossToken(),
      })
      if (reply.state === 'page') {
        const items = toItems(reply.flat, parseFeedMember)
        return { items, exhausted: reply.exhausted, last: items.at(-1), pulled: reply.pulled }
      }
      if (reply.state === 'mark') await graph.markActive(reader)
      else await rebuild(reader)
    }
    throw new FeedRebuildError(`the feed of '${reader}'`)
  }

  /**
   * The ids among `items` their producers removed: one script call per hash slot, all in flight
   * together. A producer found with its keys lost (its deleted set with them) is noted, and the
   * read starts again on a rebuilt feed.
   */
  async function removedAmong(items: FeedItem[]): Promise<Set<string>> {
    const byProducer = new Map<string, string[]>()
    for (const item of items) {
      const ids = byProducer.get(item.producer)
      if (ids) ids.push(item.id)
      else byProducer.set(item.producer, [item.id])
    }
    const removed = new Set<string>()
    let lost = false
    await Promise.all(
      scriptGroups([...byProducer], ([producer]) => producerTag(producer), KEYS_PER_CALL).map(
        async (group) => {
          const reply = await callScript(
            redis,
            FEED_REMOVED,
            {
              deletedAndMetas: group.flatMap(([producer]) => [
                producerKeys(producer).deleted,
                producerKeys(producer).meta,
              ]),
            },
            { ids: group.flatMap(([, ids]) => [ids.length, ...ids]) },
          )
          for (const id of reply.removed) removed.add(id)
          if (reply.producersLost) lost = true
        },
      ),
    )
    if (lost) {
      await context.noteLost()
      throw new ProducerLost()
    }
    return removed
  }

  return async function read(reader: string, readOptions: FeedReadOptions = {}): Promise<FeedPage> {
    checkId('reader', reader)
    const { limit, cursor } = resolveReadOptions(readOptions)
    for (let attempt = 0; ; attempt++) {
      try {
        return await readPage(reader, limit, cursor)
      } catch (err) {
        if (!(err instanceof ProducerLost)) throw err
        if (attempt === 2) throw new FeedRebuildError(`the feed of '${reader}'`)
      }
    }
  }

  async function readPage(
    reader: string,
    limit: number,
    cursor: string | null | undefined,
  ): Promise<FeedPage> {
    let after = cursor === null || cursor === undefined ? null : decodeCursor(cursor)
    const page: FeedItem[] = []
    const seen = new Set<string>()
    let pulled: string[] | null = null
    for (;;) {
      const need = limit - page.length
      let feed: FeedSourcePage
      let own: SourcePage
      let pulledPages: SourcePage[]
      let removed: Set<string>
      if (pulled === null) {
        // First round: the feed (which names the pulled producers) and the reader's own timeline
        // together, then the pulled timelines and the removal checks together.
        let ownPages: SourcePage[]
        ;[feed, ownPages] = await Promise.all([
          feedPage(reader, after, need, true),
          ownItems ? timelines.pages([reader], after, need) : [NOTHING],
        ])
        own = ownPages[0]!
        pulled = ownItems ? feed.pulled.filter((producer) => producer !== reader) : feed.pulled
        ;[pulledPages, removed] = await Promise.all([
          pulled.length > 0 ? timelines.pages(pulled, after, need) : [],
          removedAmong(feed.items),
        ])
      } else {
        let timelinePages: SourcePage[]
        ;[feed, timelinePages] = await Promise.all([
          feedPage(reader, after, need, false),
          ownItems ? timelines.pages([reader, ...pulled], after, need) : timelines.pages(pulled, after, need),
        ])
        if (!ownItems) timelinePages.unshift(NOTHING)
        ;[own, ...pulledPages] = timelinePages as [SourcePage, ...SourcePage[]]
        removed = await removedAmong(feed.items)
      }
      if (removed.size > 0) {
        // Found once, gone from this feed: the next reads need not check it again.
        const gone = feed.items.filter((item) => removed.has(item.id)).map(feedMember)
        await redis.zrem(readerKeys(reader).feed, ...gone)
      }
      const sources: SourcePage[] = [
        { ...feed, items: feed.items.filter((item) => !removed.has(item.id)) },
        own,
        ...pulledPages,
      ]
      // Every source is complete down to its last item, or all of it: the merge is exact down to
      // the newest of those last items (the cut).
      let cut: FeedItem | undefined
      for (const sourcePage of sources)
        if (!sourcePage.exhausted && sourcePage.last && (!cut || isNewer(sourcePage.last, cut)))
          cut = sourcePage.last
      const merged = sources
        .flatMap((sourcePage) => sourcePage.items)
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
}
