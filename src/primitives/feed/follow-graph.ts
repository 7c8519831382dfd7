import { runScript } from '../../redis/scripts.ts'
import { type FeedContext, KEYS_PER_CALL, singleFlight } from './context.ts'
import { FeedFollowLimitError } from './errors.ts'
import { feedMember } from './items.ts'
import { checkId } from './options.ts'
import type { Timelines } from './timelines.ts'

// The follow graph as Redis holds it: who a reader follows, each producer's followers scored by
// their last activity, its follower count and whether it is pushed or pulled.

/**
 * A producer's mode as the producer scripts answer it: 2 * fanout + byPull (+ 4 when the script
 * created its meta), -1 when Redis knows nothing of it.
 */
export const byPull = (mode: number) => mode >= 0 && (mode & 1) === 1
/** Its publishes are fanned out now (pushed, or pulled for less than the grace). */
export const fansOut = (mode: number) => mode >= 0 && (mode & 2) === 2

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
  producerModes(reader: string, producers: readonly string[], delta: number, mark: string): Promise<number[]>
  /** Marks `reader` active: its score in the followers sets of the producers it follows, then its mark. */
  markActive(reader: string): Promise<void>
}

export function createFollowGraph(context: FeedContext, timelines: Timelines): FollowGraph {
  const { redis, settings, producerKeys, producerTag, readerKeys, readerKeyList, scriptGroups, source } =
    context
  const { feedTtlMs, feedMaxItems, timelineMaxItems, maxFollowing } = settings

  async function producerModes(
    reader: string,
    producers: readonly string[],
    delta: number,
    mark: string,
  ): Promise<number[]> {
    const modes = new Array<number>(producers.length).fill(-1)
    const now = settings.now()
    const run = (indexes: number[], counts?: Map<number, number>) =>
      Promise.all(
        scriptGroups(indexes, (i) => producerTag(producers[i]!), KEYS_PER_CALL / 2).map(async (group) => {
          const keys: string[] = []
          const args: Array<string | number> = [reader, mark, now, ...context.modeArgs]
          for (const i of group) {
            const producer = producerKeys(producers[i]!)
            keys.push(producer.meta, producer.followers)
            args.push(delta, counts?.get(i) ?? '')
          }
          const reply = await runScript<number[]>(redis, 'feedProducers', keys, args)
          group.forEach((i, position) => {
            modes[i] = Number(reply[position])
          })
        }),
      )
    await run(producers.map((_, i) => i))
    const missing = modes.flatMap((mode, i) => (mode === -1 ? [i] : []))
    if (missing.length > 0 && delta >= 0 && mark !== COUNT_DUE) {
      const counts = await source.counts(missing.map((i) => producers[i]!))
      await run(missing, new Map(missing.map((i, position) => [i, counts[position]!])))
      await context.noteCreated(missing.filter((i) => modes[i]! >= 4).map((i) => producers[i]!))
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
    const leaving = producers.filter((producer, i) => wasPulled.has(producer) && !byPull(modes[i]!))
    const recent =
      leaving.length > 0
        ? (await timelines.pages(leaving, null, Math.min(feedMaxItems, timelineMaxItems))).flatMap(
            (page) => page.items,
          )
        : []
    const args: Array<string | number> = [now, now + feedTtlMs, feedMaxItems, producers.length]
    producers.forEach((producer, i) => {
      args.push(producer, byPull(modes[i]!) ? 1 : 0)
    })
    for (const item of recent) args.push(item.at, feedMember(item))
    await runScript(redis, 'feedMarked', readerKeyList(reader), args)
  })

  async function follow(reader: string, producer: string): Promise<void> {
    checkId('reader', reader)
    checkId('producer', producer)
    const keys = readerKeyList(reader)
    const [state, mark] = await runScript<[number, string?]>(redis, 'feedFollow', keys, [
      'follow',
      producer,
      maxFollowing,
    ])
    if (state === -2) throw new FeedFollowLimitError(reader, maxFollowing)
    if (state === -1) {
      // No built feed: its next read builds it from the application, which holds this follow.
      // Redis cannot tell a retry from a new follow here: the count is refreshed at the next publish.
      await producerModes(reader, [producer], 0, COUNT_DUE)
      return
    }
    const [mode] = await producerModes(reader, [producer], state, String(mark))
    const pull = byPull(mode!)
    // A producer still fanned out has its recent items join the feed now: fan-out brings its next
    // ones, and once it is read by pull no longer (pushed again after a while), the feed holds
    // what it published before. A pulled one's show through its timeline.
    const recent = fansOut(mode!)
      ? (await timelines.pages([producer], null, Math.min(feedMaxItems, timelineMaxItems)))[0]!.items
      : []
    const args: Array<string | number> = ['followed', producer, pull ? 1 : 0, feedMaxItems]
    for (const item of recent) args.push(item.at, feedMember(item))
    await runScript(redis, 'feedFollow', keys, args)
  }

  async function unfollow(reader: string, producer: string): Promise<void> {
    checkId('reader', reader)
    checkId('producer', producer)
    const removed = await runScript<number>(redis, 'feedFollow', readerKeyList(reader), [
      'unfollow',
      producer,
    ])
    if (removed === 0) return
    // -1: no built feed, so Redis cannot tell a retry; the count is refreshed at the next publish.
    await producerModes(reader, [producer], -1, removed === -1 ? COUNT_DUE : '')
  }

  return { follow, unfollow, producerModes, markActive }
}
