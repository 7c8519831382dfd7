import { runScript } from '../../lua/index.ts'
import { type FeedContext, KEYS_PER_CALL, singleFlight } from './context.ts'
import { FeedFollowLimitError } from './errors.ts'
import { feedMember } from './items.ts'
import { checkId } from './options.ts'
import type { Timelines } from './timelines.ts'

// The follow graph as Redis holds it: who a reader follows, each producer's followers scored by
// their last activity, its follower count and whether it is pushed or pulled.

/** A producer's mode as the producer scripts answer it: 2 * fanout + byPull, -1 when Redis knows nothing of it. */
export const byPull = (mode: number) => mode >= 0 && (mode & 1) === 1

export interface FollowGraph {
  follow(reader: string, producer: string): Promise<void>
  unfollow(reader: string, producer: string): Promise<void>
  /**
   * Runs feed-producers for one reader on `producers`: counts, modes and the reader in their
   * followers sets, `delta` added to each count (1 a new follow, -1 an unfollow, 0 none), `mark` the
   * reader's activity mark. A producer with no meta gets its count from the application (a follow
   * or a mark; an unfollow has nothing to take off). Resolves with each producer's mode.
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
    const now = Date.now()
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
    if (missing.length > 0 && delta >= 0) {
      const counts = await source.counts(missing.map((i) => producers[i]!))
      await run(missing, new Map(missing.map((i, position) => [i, counts[position]!])))
    }
    return modes
  }

  const markActive = singleFlight(async (reader: string) => {
    const { following } = readerKeys(reader)
    const producers = await redis.smembers(following)
    const now = Date.now()
    const modes = await producerModes(reader, producers, 0, String(now))
    const args: Array<string | number> = [now, now + feedTtlMs]
    producers.forEach((producer, i) => {
      args.push(producer, byPull(modes[i]!) ? 1 : 0)
    })
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
    const built = state >= 0
    // A reader without a built feed: only the producer's count moves; its next read builds the feed.
    const [mode] = await producerModes(reader, [producer], state === 0 ? 0 : 1, built ? String(mark) : '')
    if (!built) return
    const pull = byPull(mode!)
    // A pushed producer's recent items join the feed now, as a pulled one's show through its timeline.
    const recent = pull
      ? []
      : (await timelines.pages([producer], null, Math.min(feedMaxItems, timelineMaxItems)))[0]!.items
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
    await producerModes(reader, [producer], -1, '')
  }

  return { follow, unfollow, producerModes, markActive }
}
