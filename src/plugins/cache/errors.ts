import { describeValue } from '../../redis/client.ts'
import { GatewayError, GatewayTypeError } from '../common/errors.ts'

// Key, tag and value errors are mistakes in the calling code, thrown at the call: they extend
// TypeError (as they always did) and carry a stable code like every error of the library.

const NAMESPACE_RULE = "the namespace 1 to 32 characters of a-z, 0-9 and '-', starting with a letter"
const ID_RULE = "the id 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-'"

/** What was passed, for a message: a string quoted (cut at 80 characters) with its length. */
function describeArgument(value: unknown): string {
  if (typeof value !== 'string') return describeValue(value)
  const shown = value.length > 80 ? `${value.slice(0, 80)}…` : value
  return `'${shown}' (${value.length} characters)`
}

/** A key does not match CACHE_KEY (or `invalidate` was not given an array of keys). */
export class CacheKeyInvalidError extends GatewayTypeError {
  readonly code = 'FRG_CACHE_KEY_INVALID'

  constructor(key: unknown, expected?: string) {
    super(
      expected ??
        `cache: invalid key ${describeArgument(key)}: a key is <namespace>:<id>, ${NAMESPACE_RULE}, ${ID_RULE} (no braces, no spaces)`,
    )
    this.name = 'CacheKeyInvalidError'
  }
}

/** A tag does not match CACHE_TAG, or `tags` is not an array of at most MAX_TAGS of them. */
export class CacheTagInvalidError extends GatewayTypeError {
  readonly code = 'FRG_CACHE_TAG_INVALID'

  constructor(tag: unknown, expected?: string) {
    super(
      expected ??
        `cache: invalid tag ${describeArgument(tag)}: a tag is <namespace> or <namespace>:<id>, ${NAMESPACE_RULE}, ${ID_RULE} (no braces, no spaces)`,
    )
    this.name = 'CacheTagInvalidError'
  }
}

export const tagListError = (tags: unknown, max: number) =>
  new CacheTagInvalidError(
    tags,
    `cache: \`tags\` must be an array of at most ${max} tags, got ${Array.isArray(tags) ? `${tags.length} tags` : describeValue(tags)}`,
  )

/**
 * A value (a loader's result, or `set`'s) cannot be serialized for Redis: nothing is stored and the
 * caller gets this instead of a value that would never be cached. `cause`: what serialize threw.
 */
export class CacheValueNotJsonError extends GatewayTypeError {
  readonly code = 'FRG_CACHE_VALUE_NOT_JSON'

  constructor(
    readonly key: string,
    what: string,
    options?: ErrorOptions,
  ) {
    super(`cache: the value for '${key}' cannot be stored: ${what}`, options)
    this.name = 'CacheValueNotJsonError'
  }
}

/**
 * The cache Redis is not connected. Reads go to the loader and failed invalidations are retried,
 * so this is only logged (with its code), never thrown to a caller.
 */
export class CacheUnavailableError extends GatewayError {
  constructor(status: string) {
    super('FRG_CACHE_UNAVAILABLE', `cache Redis is not connected (status: ${status})`)
  }
}

/** A read waited `hardTimeoutMs` for a load; the load goes on in the background and still fills. */
export class CacheLoadTimeoutError extends GatewayError {
  constructor(
    readonly key: string,
    readonly timeoutMs: number,
  ) {
    super(
      'FRG_CACHE_LOAD_TIMEOUT',
      `cache: no value for '${key}' within hardTimeoutMs (${timeoutMs} ms); its load goes on`,
    )
  }
}

/**
 * Why JSON.stringify cannot hold `value`, found only once it failed (or returned undefined): the
 * path of the first BigInt or circular reference, or what the top-level value is.
 */
export function whyNotJson(value: unknown, err: unknown): string {
  if (value === undefined) return 'it is undefined (return or set null to cache "not found")'
  if (typeof value === 'function' || typeof value === 'symbol') return `it is ${describeValue(value)}`
  const ancestors: object[] = []
  const find = (node: unknown, path: string): string | undefined => {
    if (typeof node === 'bigint')
      return `a bigint at ${path || 'the top'} (convert it to a string or a number)`
    if (typeof node !== 'object' || node === null) return undefined
    if (ancestors.includes(node)) return `a circular reference at ${path}`
    if (typeof (node as { toJSON?: unknown }).toJSON === 'function') return undefined
    ancestors.push(node)
    for (const [name, child] of Object.entries(node)) {
      const found = find(child, Array.isArray(node) ? `${path}[${name}]` : `${path}.${name}`)
      if (found) return found
    }
    ancestors.pop()
    return undefined
  }
  return find(value, '') ?? `JSON.stringify threw: ${(err as Error)?.message ?? String(err)}`
}
