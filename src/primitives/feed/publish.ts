import { callScript } from '../../redis/scripts.ts'
import type { FeedContext } from './context.ts'
import { FeedRebuildError } from './errors.ts'
import { checkItem } from './options.ts'
import { FEED_PUBLISH, FEED_REMOVE } from './scripts.ts'
import type { Timelines } from './timelines.ts'
import type { FeedItem } from './types.ts'

// Publishing and removing an item: its producer's timeline, and the fan-out job of a pushed producer.

/** How long a follower count from the application is trusted before the next publish asks again. */
const COUNT_REFRESH_MS = 86_400_000

export interface Publisher {
  publish(item: FeedItem): Promise<{ fanout: boolean }>
  remove(item: FeedItem): Promise<void>
}

export function createPublisher(context: FeedContext, timelines: Timelines): Publisher {
  const { redis, settings, producerKeys, fanoutStream, source } = context
  const { timelineMaxItems, timelineTtlMs, fanoutMaxLen, feedMaxItems, feedTtlMs } = settings

  async function publish(item: FeedItem): Promise<{ fanout: boolean }> {
    checkItem('publish', item)
    const keys = producerKeys(item.producer)
    let count = ''
    for (let attempt = 0; attempt < 4; attempt++) {
      const { outcome, created } = await callScript(redis, FEED_PUBLISH, keys, {
        id: item.id,
        at: item.at,
        timelineMaxItems,
        timelineTtlMs,
        now: settings.now(),
        ...context.modeArgs,
        count,
        countRefreshMs: COUNT_REFRESH_MS,
      })
      if (outcome === 'countDue') {
        count = String((await source.counts([item.producer]))[0])
        continue
      }
      if (created) await context.noteCreated([item.producer])
      const fanout = outcome === 'fanOut'
      if (outcome === 'buildTimeline') await timelines.build(item.producer)
      else {
        if (fanout) {
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
        return { fanout }
      }
    }
    throw new FeedRebuildError(`the timeline of '${item.producer}'`)
  }

  async function remove(item: FeedItem): Promise<void> {
    checkItem('remove', item)
    const keys = producerKeys(item.producer)
    await callScript(redis, FEED_REMOVE, keys, {
      id: item.id,
      at: item.at,
      keep: feedMaxItems,
      ttlMs: feedTtlMs,
    })
  }

  return { publish, remove }
}
