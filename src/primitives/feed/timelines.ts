import { runScript } from '../../redis/scripts.ts'
import { type FeedContext, singleFlight } from './context.ts'
import { FeedRebuildError } from './errors.ts'
import { type Cursor, type SourcePage, toItems } from './items.ts'

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
    const key = producerKeys(producer).timeline
    await runScript(redis, 'feedTimeline', [key], ['start', timelineTtlMs])
    const items = await source.items([producer], timelineMaxItems)
    const args: Array<string | number> = ['finish', timelineTtlMs, timelineMaxItems]
    for (const item of items) args.push(item.at, item.id)
    await runScript(redis, 'feedTimeline', [key], args)
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
          const replies = await runScript<Array<[number, number, string[]]>>(
            redis,
            'feedTimeline',
            group.map((i) => producerKeys(producers[i]!).timeline),
            ['range', after?.at ?? '', after?.id ?? '', limit],
          )
          group.forEach((i, position) => {
            const [state, exhausted, flat] = replies[position]!
            if (state !== 1) return
            const producer = producers[i]!
            const items = toItems(flat, (id) => ({ id, producer }))
            found[i] = { items, exhausted: exhausted === 1, last: items.at(-1) }
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
