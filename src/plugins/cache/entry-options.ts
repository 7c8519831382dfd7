import { declareOptions, option } from '../common/options.ts'
import { checkKey, checkTags } from './key.ts'
import type { CacheLoadErrorMode, CacheSetOptions, CacheSettings, GetOrLoadOptions } from './types.ts'

/**
 * Other cache libraries' names for our options (bentocache's mostly), each with ours: a `ttl:`
 * passed here would otherwise leave every entry on the default lifetime without a word.
 */
export const CACHE_OPTION_HINTS = {
  ttl: "bentocache's `ttl` is `ttlMs` here (milliseconds)",
  timeout: "bentocache's `timeout` is `softTimeoutMs` here (milliseconds)",
  hardTimeout: "bentocache's `hardTimeout` is `hardTimeoutMs` here (milliseconds)",
  grace: "bentocache's `grace` is the plugin option `staleWhileRevalidateMs` here (milliseconds)",
  lockTimeout: "bentocache's `lockTimeout` is the plugin option `leaseWaitMs` here (milliseconds)",
  prefix: "bentocache's `prefix` is the plugin option `keyPrefix` here",
}

// A call's options, declared as the plugin's are; `tags` is checked (and sorted) by checkTags.
const ttlMs = option.integer({ min: 1, doc: "fresh lifetime for this call (default: the plugin's `ttlMs`)" })
const tags = option.custom<readonly string[]>({
  type: 'array of tags',
  doc: 'tags of the entry: `invalidateTags` with any of them drops it',
  read: (value) => value as readonly string[],
})
const GET_OR_LOAD_OPTIONS = declareOptions(
  'cache',
  {
    ttlMs,
    tags,
    softTimeoutMs: option.integer({ min: 0, doc: 'how long a refresh of a stale copy is waited for' }),
    hardTimeoutMs: option.integer({ min: 0, doc: 'how long a read with no stale copy waits for a load' }),
    onLoadError: option.oneOf(['serve-stale', 'fail'] as const, { doc: 'a refresh waited for throws' }),
    admit: option.function<() => Promise<boolean>>({
      doc: 'whether the key can exist, asked before a miss writes',
    }),
  },
  { hints: CACHE_OPTION_HINTS },
)
const SET_OPTIONS = declareOptions('cache', { ttlMs, tags }, { hints: CACHE_OPTION_HINTS })

/** The options of a call that passed none: nothing to check. */
export const NO_OPTIONS: GetOrLoadOptions = Object.freeze({})

/**
 * A `getOrLoad`'s key and options, checked (the disabled cache checks them too, so a mistake shows
 * with the cache off as with it on); its tags, validated and sorted.
 */
export function checkRead(key: string, options: GetOrLoadOptions = NO_OPTIONS): string[] | undefined {
  checkKey(key)
  return checkReadOptions(options)
}

/** A `getOrLoad`'s options, checked; its tags, validated and sorted. */
export function checkReadOptions(options: GetOrLoadOptions = NO_OPTIONS): string[] | undefined {
  if (options === NO_OPTIONS) return undefined
  GET_OR_LOAD_OPTIONS.check(options, 'getOrLoad options')
  return options.tags === undefined ? undefined : checkTags(options.tags)
}

/** A `set`'s key and options, checked; its tags, validated and sorted. */
export function checkSet(key: string, options: CacheSetOptions = NO_OPTIONS): string[] | undefined {
  checkKey(key)
  if (options !== NO_OPTIONS) SET_OPTIONS.check(options, 'set options')
  return options.tags === undefined ? undefined : checkTags(options.tags)
}

/** What an entry written by one call is: its lifetimes (the plugin's unless the call says) and tags. */
export interface EntryOptions {
  /** Fresh lifetime of a value, ms. */
  readonly ttlMs: number
  /** Fresh lifetime of a cached "not found" (`null`), ms. */
  readonly notFoundTtlMs: number
  /** Validated and sorted; undefined when the entry has none. */
  readonly tags: readonly string[] | undefined
}

/** A `getOrLoad`'s options over the plugin's, resolved once per call and passed down whole. */
export interface ReadOptions extends EntryOptions {
  readonly softTimeoutMs: number
  readonly hardTimeoutMs: number
  readonly onLoadError: CacheLoadErrorMode
  readonly admit: (() => Promise<boolean>) | undefined
}

/** A `getOrLoad`'s `ttlMs` is the lifetime of a value: a loader's `null` keeps `negativeTtlMs`. */
export function resolveReadOptions(
  settings: CacheSettings,
  options: GetOrLoadOptions,
  tags: readonly string[] | undefined,
): ReadOptions {
  return {
    ttlMs: options.ttlMs ?? settings.ttlMs,
    notFoundTtlMs: settings.negativeTtlMs,
    tags,
    softTimeoutMs: options.softTimeoutMs ?? settings.softTimeoutMs,
    hardTimeoutMs: options.hardTimeoutMs ?? settings.hardTimeoutMs,
    onLoadError: options.onLoadError ?? settings.onLoadError,
    admit: options.admit,
  }
}

/** A `set`'s `ttlMs` is the lifetime of what it stores, a `null` included. */
export function resolveSetOptions(
  settings: CacheSettings,
  options: CacheSetOptions,
  tags: readonly string[] | undefined,
): EntryOptions {
  return {
    ttlMs: options.ttlMs ?? settings.ttlMs,
    notFoundTtlMs: options.ttlMs ?? settings.negativeTtlMs,
    tags,
  }
}
