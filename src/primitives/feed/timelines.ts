import { callScript } from '../../redis/scripts.ts'
import { type FeedContext, singleFlight } from './context.ts'
import { FeedRebuildError } from './errors.ts'
import { type Cursor, type SourcePage, toItems } from './items.ts'
import { FEED_TIMELINE } from './scripts.ts'

// Producers' timelines: read a page of many at once, and rebuilt from the application's source
// when missing.

/** Timelines one script call reads a page of each (on one Redis; on a Cluster, those of one slot). */
const TIMELINES_PER_CALL = 100

export interface Timelines {
  /** Rebuilds `producer`'s timeline from the source (one rebuild at a time per producer). */
  build(producer: string): Promise<void>
  /**
   * Up to `limit` items of each producer's timeline after the cursor, in the order of `producers`:
   * one script call per hash slot (one for all on a single Redis), all in flight together; a
   * missing timeline is built from the source and read again.
   */
  pages(producers: readonly string[], after: Cursor | null, limit: number): Promise<SourcePage[]>
}

export function createTimelines(context: FeedContext): Timelines {
  const { redis, settings, producerKeys, producerTag, scriptGroups, source } = context
  const { timelineTtlMs, timelineMaxItems } = settings

  const build = singleFlight(async (producer: string) => {
    const timelines = [producerKeys(producer).timeline]
    await callScript(redis, FEED_TIMELINE.start, { timelines }, { ttlMs: timelineTtlMs })
    const items = (await source.items([producer], timelineMaxItems)).flatMap((item) => [item.at, item.id])
    // A timeline that vanished since 'start' is built again at the next read.
    await callScript(
      redis,
      FEED_TIMELINE.finish,
      { timelines },
      { ttlMs: timelineTtlMs, timelineMaxItems, items },
    )
  })

  async function pages(
    producers: readonly string[],
    after: Cursor | null,
    limit: number,
  ): Promise<SourcePage[]> {
    const found = new Array<SourcePage | undefined>(producers.length)
    let wanted = producers.map((_, i) => i)
    for (let attempt = 0; wanted.length > 0; attempt++) {
      if (attempt === 3) throw new FeedRebuildError(`the timeline of '${producers[wanted[0]!]}'`)
      await Promise.all(
        scriptGroups(wanted, (i) => producerTag(producers[i]!), TIMELINES_PER_CALL).map(async (group) => {
          const replies = await callScript(
            redis,
            FEED_TIMELINE.range,
            { timelines: group.map((i) => producerKeys(producers[i]!).timeline) },
            { afterAt: after?.at ?? '', afterId: after?.id ?? '', limit },
          )
          group.forEach((i, position) => {
            const page = replies[position]
            if (!page) return
            const producer = producers[i]!
            const items = toItems(page.flat, (id) => ({ id, producer }))
            found[i] = { items, exhausted: page.exhausted, last: items.at(-1) }
          })
        }),
      )
      wanted = wanted.filter((i) => !found[i])
      await Promise.all(wanted.map((i) => build(producers[i]!)))
    }
    return found as SourcePage[]
  }

  return { build, pages }
}
