import type { RedisClient } from '../lua/index.ts'
import { RedisClientError } from '../plugins/common/errors.ts'
import type { OptionChecker } from '../plugins/common/options.ts'
import { describeValue, isRedisClient } from '../plugins/common/redis.ts'

// What every primitive checks of what it is handed: the client, each options object (an unknown
// key is refused, never ignored) and the positional arguments of its calls.

/**
 * A call's positional argument (a name, a TTL, an id, an item) the primitive cannot use. A
 * TypeError, as these always were, with a code.
 */
export class InvalidArgumentError extends TypeError {
  readonly code = 'FRG_INVALID_ARGUMENT'
}

/** `redis`, checked to be an ioredis client or an iovalkey one (the same API), typed as ioredis's. */
export function checkRedisClient(owner: string, redis: unknown): RedisClient {
  if (!isRedisClient(redis))
    throw new RedisClientError(
      `${owner}: \`redis\` must be an ioredis client (new Redis() or new Cluster()), got ${describeValue(redis)}`,
    )
  return redis
}

/** `value`, checked to be an options object holding only `known` keys (pass `options ?? {}` where they are optional). */
export function checkedOptions<T extends object>(
  check: OptionChecker,
  value: T,
  known: readonly string[],
  where?: string,
): T {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    check.fail(`${where ? `${where} ` : ''}options must be an object, got ${describeValue(value)}`)
  check.known(value, known, where)
  return value
}

/** A wrong value as a message shows it: a number as written, anything else by its type. */
export const shown = (value: unknown) => (typeof value === 'number' ? String(value) : describeValue(value))
