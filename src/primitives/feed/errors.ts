import { GatewayError } from '../../plugins/common/errors.ts'

// What a feed throws besides a wrong argument (InvalidArgumentError) or option.

/** The application's `source` answered something the feed cannot use. */
export class FeedSourceError extends GatewayError {
  constructor(message: string) {
    super('FRG_FEED_SOURCE_INVALID', `feed: ${message}`)
  }
}

/** `follow` would take the reader past `maxFollowing` producers. */
export class FeedFollowLimitError extends GatewayError {
  readonly reader: string
  readonly maxFollowing: number
  constructor(reader: string, maxFollowing: number) {
    super(
      'FRG_FEED_FOLLOW_LIMIT',
      `feed: '${reader}' follows ${maxFollowing} producers already (maxFollowing)`,
    )
    this.reader = reader
    this.maxFollowing = maxFollowing
  }
}

/** A feed or timeline vanished again and again while being rebuilt (Redis evicting or flushing it). */
export class FeedRebuildError extends GatewayError {
  constructor(what: string) {
    super('FRG_FEED_REBUILD_FAILED', `feed: ${what} vanished three times while being rebuilt`)
  }
}
