import type { OptionChecker } from '../plugins/common/options.ts'
import { describeValue } from '../redis/client.ts'
import { GatewayTypeError } from '../redis/errors.ts'

// What every primitive checks of what it is handed: each options object (an unknown key is
// refused, never ignored) and the positional arguments of its calls. The client is checked by
// `checkRedisClient` of src/redis/client.ts, as the plugins check theirs.

/**
 * A call's positional argument (a name, a TTL, an id, an item) the primitive cannot use. A
 * TypeError, as these always were, with a code.
 */
export class InvalidArgumentError extends GatewayTypeError {
  readonly code = 'FRG_INVALID_ARGUMENT'
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

/** A wrong value as a message shows it (one helper for the library's messages). */
export { shown } from '../plugins/common/options.ts'
