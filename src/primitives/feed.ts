import { channels, type FeedChannelContext, traced } from '../plugins/common/diagnostics.ts'
import { bridgeOpenTelemetry } from '../plugins/common/otel.ts'
import { type AnyRedisClient, checkRedisClient } from '../redis/client.ts'
import { createFeedContext } from './feed/context.ts'
import { createFanoutWorker, fanoutLag } from './feed/fanout.ts'
import { createFollowGraph } from './feed/follow-graph.ts'
import { resolveFeedOptions } from './feed/options.ts'
import { createPublisher } from './feed/publish.ts'
import { createFeedReader } from './feed/read.ts'
import { createTimelines } from './feed/timelines.ts'
import type { Feed, FeedOptions } from './feed/types.ts'

export { FeedFollowLimitError, FeedRebuildError, FeedSourceError } from './feed/errors.ts'
export type {
  FanoutLag,
  FanoutStats,
  FanoutWorker,
  FanoutWorkerOptions,
  Feed,
  FeedItem,
  FeedOptions,
  FeedPage,
  FeedReadOptions,
  FeedSource,
  ProducerKeys,
  ReaderKeys,
} from './feed/types.ts'

// A news feed with hybrid fan-out. A publish appends the item to its producer's timeline; for a
// producer with few followers ("pushed") a fan-out worker then writes it into the feed of each of
// its recently active followers; a producer with more followers than `pushMaxFollowers` ("pulled")
// is read from its timeline by each reader instead, so that no single publish costs millions of
// writes. A read merges the reader's feed with the timelines of the pulled producers it follows
// and its own, filters what it no longer follows and what was removed, and pages by keyset.
// Redis holds ids only, as derived data: a reader's feed that is missing (inactive, expired, lost)
// is rebuilt by pull from the application's `source` on the next read.
//
// Its parts, under feed/: the follow graph (follow-graph.ts), publishing (publish.ts), the fan-out
// worker (fanout.ts), producers' timelines (timelines.ts), a reader's read and rebuild (read.ts),
// over what they share (context.ts: keys, script grouping, the source's answers checked) and the
// options (options.ts).

export function createFeed(client: AnyRedisClient, options: FeedOptions): Feed {
  void bridgeOpenTelemetry()
  const redis = checkRedisClient('feed', client)
  const context = createFeedContext(redis, resolveFeedOptions(options))
  const timelines = createTimelines(context)
  const graph = createFollowGraph(context, timelines)
  const { publish, remove } = createPublisher(context, timelines)
  // Publications and reads traced on the feed channel (src/plugins/common/diagnostics.ts).
  const begin = (operation: 'publish' | 'read', id: string) => (): FeedChannelContext => ({
    operation,
    id,
    mode: null,
    count: 0,
  })
  const read = createFeedReader(context, graph, timelines)
  return {
    follow: graph.follow,
    unfollow: graph.unfollow,
    publish: (item) =>
      traced(
        channels.feed,
        begin('publish', item?.producer),
        () => publish(item),
        (c, { fanout }) => {
          c.mode = fanout ? 'push' : 'pull'
        },
      ),
    remove,
    read: (reader, readOptions) =>
      traced(
        channels.feed,
        begin('read', reader),
        () => read(reader, readOptions),
        (c, page) => {
          c.count = page.items.length
        },
      ),
    createFanoutWorker: (workerOptions) => createFanoutWorker(context, workerOptions),
    fanoutLag: () => fanoutLag(context),
    keys: { reader: context.readerKeys, producer: context.producerKeys, fanout: context.fanoutStream },
  }
}
