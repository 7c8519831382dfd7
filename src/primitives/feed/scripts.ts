import { codes, defineModes, defineScript, ignored, integer } from '../../redis/scripts.ts'

// The feed's scripts (src/lua/feed-*.lua), with their replies by name. A reader's scripts take its
// four keys (feed, following, pulled, meta), a producer's the keys of that producer.

const READER_KEYS = ['feed', 'following', 'pulled', 'meta'] as const

/** The mode arguments of the producer scripts (see include/feed-mode.lua). */
const MODE_ARGS = ['pushMaxFollowers', 'graceMs', 'stickyMs'] as const

/**
 * A producer's mode as the producer scripts answer it (2 * fanout + byPull, plus 4 when the script
 * created its meta; -1 when Redis knows nothing of it).
 */
export interface ProducerMode {
  /** Redis holds the producer's meta (else nothing was done but an unfollow's ZREM). */
  known: boolean
  /** Its publishes are fanned out now (pushed, or pulled for less than the grace). */
  fansOut: boolean
  /** Its readers read its timeline (pulled). */
  byPull: boolean
  /** The script created its meta (a producer the feed knew before lost its keys). */
  created: boolean
}

export const UNKNOWN_MODE: ProducerMode = { known: false, fansOut: false, byPull: false, created: false }

function producerMode(raw: unknown): ProducerMode {
  const mode = Number(raw)
  if (mode < 0) return UNKNOWN_MODE
  return { known: true, fansOut: (mode & 2) === 2, byPull: (mode & 1) === 1, created: (mode & 4) === 4 }
}

const PUBLISH_OUTCOME = codes({ countDue: -1, buildTimeline: -2, fanOut: 1, noFanout: 0 })

export const FEED_PUBLISH = defineScript({
  name: 'feedPublish',
  keys: ['timeline', 'meta', 'followers'],
  args: ['id', 'at', 'timelineMaxItems', 'timelineTtlMs', 'now', ...MODE_ARGS, 'count', 'countRefreshMs'],
  /** What to do, and whether the meta was created here (the script adds 4 then). */
  reply: (raw) => {
    const reply = Number(raw)
    const created = reply >= 2
    return { outcome: PUBLISH_OUTCOME(created ? reply - 4 : reply), created }
  },
})

export const FEED_REMOVE = defineScript({
  name: 'feedRemove',
  keys: ['timeline', 'deleted'],
  args: ['id', 'at', 'keep', 'ttlMs'],
  reply: codes({ removed: 1, notInTimeline: 0 }),
})

export const FEED_FANOUT_START = defineScript({
  name: 'feedFanoutStart',
  keys: ['followers', 'snapshot'],
  args: ['oldestActiveMark', 'snapshotTtlMs'],
  /** How many followers the snapshot holds. */
  reply: integer,
})

export const FEED_FANOUT = defineScript({
  name: 'feedFanout',
  keys: ['...feeds'],
  args: ['feedMaxItems', 'at', 'member'],
  reply: (raw) => {
    const [added, missing] = raw as [number, number]
    return { added: Number(added), missing: Number(missing) }
  },
})

export const FEED_PRODUCERS = defineScript({
  name: 'feedProducers',
  /** Per producer its meta, then its followers. */
  keys: ['...metasAndFollowers'],
  /** producers: per producer its delta and its follower count from the application ('' none). */
  args: ['reader', 'mark', 'now', ...MODE_ARGS, '...producers'],
  reply: (raw) => (raw as unknown[]).map(producerMode),
})

export const FEED_MARKED = defineScript({
  name: 'feedMarked',
  keys: READER_KEYS,
  /** rest: n producer, byPull pairs, then score, member pairs of items to add. */
  args: ['mark', 'expireAt', 'feedMaxItems', 'producerCount', '...rest'],
  reply: codes({ marked: 1, notBuilt: 0 }),
})

const FOLLOW_STATE = codes({ notBuilt: -1, limitReached: -2, added: 1, followedAlready: 0 })

export const FEED_FOLLOW = defineModes({
  name: 'feedFollow',
  keys: READER_KEYS,
  modes: {
    follow: {
      args: ['producer', 'maxFollowing'],
      /** With the reader's activity mark once followed. */
      reply: (raw) => {
        const [state, mark] = raw as [number, string?]
        return { state: FOLLOW_STATE(state), mark: String(mark) }
      },
    },
    /** items: score, member pairs of the producer's recent items. */
    followed: { args: ['producer', 'byPull', 'feedMaxItems', '...items'], reply: integer },
    unfollow: { args: ['producer'], reply: codes({ notBuilt: -1, removed: 1, notFollowed: 0 }) },
  },
})

export const FEED_BUILD = defineModes({
  name: 'feedBuild',
  keys: READER_KEYS,
  modes: {
    start: { args: ['expireAt', 'token'], reply: ignored },
    finish: {
      /** rest: n, n producers followed, m, m producers read by pull, then score, member pairs of items. */
      args: ['expireAt', 'mark', 'feedMaxItems', 'token', 'lossToken', '...rest'],
      reply: codes({ buildAgain: 0, built: 1, builtByAnother: 2 }),
    },
  },
})

const READ_STATE = codes({ build: 0, mark: 1, page: 2 })

export const FEED_READ = defineScript({
  name: 'feedRead',
  keys: READER_KEYS,
  args: ['now', 'markEveryMs', 'afterAt', 'afterId', 'limit', 'withPulled', 'lossToken'],
  /** A page: the pulled producers still followed and the items, flat (member, score, ...). */
  reply: (raw) => {
    const [state, exhausted, pulled, flat] = raw as [number, number?, string[]?, string[]?]
    return { state: READ_STATE(state), exhausted: exhausted === 1, pulled: pulled ?? [], flat: flat ?? [] }
  },
})

export const FEED_REMOVED = defineScript({
  name: 'feedRemoved',
  /** Per producer its deleted set, then its meta. */
  keys: ['...deletedAndMetas'],
  /** ids: per producer n, then n item ids. */
  args: ['...ids'],
  reply: (raw) => {
    const [removed, missing] = raw as [string[], number]
    return { removed: removed.map(String), producersLost: Number(missing) > 0 }
  },
})

const TIMELINE_STATE = codes({ build: 0, page: 1 })

export const FEED_TIMELINE = defineModes({
  name: 'feedTimeline',
  keys: ['...timelines'],
  modes: {
    /** Per timeline, its page (flat: id, at, ...), or null when it must be built. */
    range: {
      args: ['afterAt', 'afterId', 'limit'],
      reply: (raw) =>
        (raw as Array<[number, number?, string[]?]>).map(([state, exhausted, flat]) =>
          TIMELINE_STATE(state) === 'page' ? { exhausted: exhausted === 1, flat: flat ?? [] } : null,
        ),
    },
    start: { args: ['ttlMs'], reply: ignored },
    /** items: at, id pairs. */
    finish: { args: ['ttlMs', 'timelineMaxItems', '...items'], reply: codes({ vanished: 0, built: 1 }) },
  },
})
