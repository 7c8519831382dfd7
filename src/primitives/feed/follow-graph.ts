import { callScript } from '../../redis/scripts.ts'
import { type FeedContext, KEYS_PER_CALL, singleFlight } from './context.ts'
import { FeedFollowLimitError } from './errors.ts'
import { feedMember } from './items.ts'
import { checkId } from './options.ts'
import { FEED_FOLLOW, FEED_MARKED, FEED_PRODUCERS, type ProducerMode, UNKNOWN_MODE } from './scripts.ts'
import type { Timelines } from './timelines.ts'

// The follow graph as Redis holds it: who a reader follows, each producer's followers scored by
// their last activity, its follower count and whether it is pushed or pulled.

/** The mark of a follow or unfollow by a reader whose feed is not built (see feed-producers). */
const COUNT_DUE = '-'

export interface FollowGraph {
  follow(reader: string, producer: string): Promise<void>
  unfollow(reader: string, producer: string): Promise<void>
  /**
   * Runs feed-producers for one reader on `producers`: counts, modes and the reader in their
   * followers sets, `delta` added to each count (1 a new follow, -1 an unfollow, 0 none), `mark` the
   * reader's activity mark (COUNT_DUE: the count is left and refreshed at the next publish). A
   * producer with no meta gets its count from the application (a follow or a mark; an unfollow has
   * nothing to take off). Resolves with each producer's mode.
   */
  producerModes(
    reader: string,
    producers: readonly string[],
    delta: number,
    mark: string,
  ): Promise<ProducerMode[]>
  /** Marks `reader` active: its score in the followers sets of the producers it follows, then its mark. */
  markActive(reader: string): Promise<void>
}

export function createFollowGraph(context: FeedContext, timelines: Timelines): FollowGraph {
  const { redis, settings, producerKeys, producerTag, readerKeys, scriptGroups, source } = context
  const { feedTtlMs, feedMaxItems, timelineMaxItems, maxFollowing } = settings

  async function producerModes(
    reader: string,
    producers: readonly string[],
    delta: number,
    mark: string,
  ): Promise<ProducerMode[]> {
    const modes = new Array<ProducerMode>(producers.length).fill(UNKNOWN_MODE)
    const now = settings.now()
    const run = (indexes: number[], counts?: Map<number, number>) =>
      Promise.all(
        scriptGroups(indexes, (i) => producerTag(producers[i]!), KEYS_PER_CALL / 2).map(async (group) => {
          const metasAndFollowers: string[] = []
          const perProducer: Array<string | number> = []
          for (const i of group) {
            const producer = producerKeys(producers[i]!)
            metasAndFollowers.push(producer.meta, producer.followers)
            perProducer.push(delta, counts?.get(i) ?? '')
          }
          const reply = await callScript(
            redis,
            FEED_PRODUCERS,
            { metasAndFollowers },
            { reader, mark, now, ...context.modeArgs, producers: perProducer },
          )
          group.forEach((i, position) => {
            modes[i] = reply[position]!
          })
        }),
      )
    await run(producers.map((_, i) => i))
    const missing = modes.flatMap((mode, i) => (mode.known ? [] : [i]))
    if (missing.length > 0 && delta >= 0 && mark !== COUNT_DUE) {
      const counts = await source.counts(missing.map((i) => producers[i]!))
      await run(missing, new Map(missing.map((i, position) => [i, counts[position]!])))
      await context.noteCreated(missing.filter((i) => modes[i]!.created).map((i) => producers[i]!))
    }
    return modes
  }

  const markActive = singleFlight(async (reader: string) => {
    const { following, pulled } = readerKeys(reader)
    const [producers, readByPull] = await Promise.all([redis.smembers(following), redis.smembers(pulled)])
    const now = settings.now()
    const modes = await producerModes(reader, producers, 0, String(now))
    // Producers this reader stops reading by pull: what they published while pulled was never
    // fanned out, so their timelines' recent items join the feed now.
    const wasPulled = new Set(readByPull)
    const leaving = producers.filter((producer, i) => wasPulled.has(producer) && !modes[i]!.byPull)
    const recent =
      leaving.length > 0
        ? (await timelines.pages(leaving, null, Math.min(feedMaxItems, timelineMaxItems))).flatMap(
            (page) => page.items,
          )
        : []
    const rest: Array<string | number> = []
    producers.forEach((producer, i) => {
      rest.push(producer, modes[i]!.byPull ? 1 : 0)
    })
    for (const item of recent) rest.push(item.at, feedMember(item))
    // A feed no longer built is left: the next read builds it.
    await callScript(redis, FEED_MARKED, readerKeys(reader), {
      mark: now,
      expireAt: now + feedTtlMs,
      feedMaxItems,
      producerCount: producers.length,
      rest,
    })
  })

  async function follow(reader: string, producer: string): Promise<void> {
    checkId('reader', reader)
    checkId('producer', producer)
    const keys = readerKeys(reader)
    const { state, mark } = await callScript(redis, FEED_FOLLOW.follow, keys, { producer, maxFollowing })
    if (state === 'limitReached') throw new FeedFollowLimitError(reader, maxFollowing)
    if (state === 'notBuilt') {
      // No built feed: its next read builds it from the application, which holds this follow.
      // Redis cannot tell a retry from a new follow here: the count is refreshed at the next publish.
      await producerModes(reader, [producer], 0, COUNT_DUE)
      return
    }
    const [mode] = await producerModes(reader, [producer], state === 'added' ? 1 : 0, mark)
    // A producer still fanned out has its recent items join the feed now: fan-out brings its next
    // ones, and once it is read by pull no longer (pushed again after a while), the feed holds
    // what it published before. A pulled one's show through its timeline.
    const recent = mode!.fansOut
      ? (await timelines.pages([producer], null, Math.min(feedMaxItems, timelineMaxItems)))[0]!.items
      : []
    await callScript(redis, FEED_FOLLOW.followed, keys, {
      producer,
      byPull: mode!.byPull ? 1 : 0,
      feedMaxItems,
      items: recent.flatMap((item) => [item.at, feedMember(item)]),
    })
  }

  async function unfollow(reader: string, producer: string): Promise<void> {
    checkId('reader', reader)
    checkId('producer', producer)
    const reply = await callScript(redis, FEED_FOLLOW.unfollow, readerKeys(reader), { producer })
    if (reply === 'notFollowed') return
    // No built feed, so Redis cannot tell a retry: the count is refreshed at the next publish.
    await producerModes(reader, [producer], -1, reply === 'notBuilt' ? COUNT_DUE : '')
  }

  return { follow, unfollow, producerModes, markActive }
}
