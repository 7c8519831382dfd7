import { runScript } from '../../redis/scripts.ts'
import type { FeedContext } from './context.ts'
import { FeedRebuildError } from './errors.ts'
import { checkItem } from './options.ts'
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
      const reply = await runScript<number>(
        redis,
        'feedPublish',
        [keys.timeline, keys.meta, keys.followers],
        [
          item.id,
          item.at,
          timelineMaxItems,
          timelineTtlMs,
          settings.now(),
          ...context.modeArgs,
          count,
          COUNT_REFRESH_MS,
        ],
      )
      if (reply === -1) {
        count = String((await source.counts([item.producer]))[0])
        continue
      }
      // 4 added: the meta was created by this call.
      if (reply >= 2) await context.noteCreated([item.producer])
      const fanout = reply === 1 || reply === 5
      if (reply === -2 || reply === 2) await timelines.build(item.producer)
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
    await runScript(
      redis,
      'feedRemove',
      [keys.timeline, keys.deleted],
      [item.id, item.at, feedMaxItems, feedTtlMs],
    )
  }

  return { publish, remove }
}
