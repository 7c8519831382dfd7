import { describeValue } from '../../redis/client.ts'
import { optionChecker, optionKeys, shown } from '../common/options.ts'
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

const callCheck = optionChecker('cache', CACHE_OPTION_HINTS)
const GET_OR_LOAD_OPTIONS = optionKeys<GetOrLoadOptions>({
  ttlMs: true,
  tags: true,
  softTimeoutMs: true,
  hardTimeoutMs: true,
  onLoadError: true,
  admit: true,
})
const SET_OPTIONS = optionKeys<CacheSetOptions>({ ttlMs: true, tags: true })

/** The options of a call that passed none: nothing to check. */
export const NO_OPTIONS: GetOrLoadOptions = Object.freeze({})

function checkInt(name: string, value: number | undefined, min: number): void {
  if (value !== undefined && !(Number.isSafeInteger(value) && value >= min))
    callCheck.fail(`\`${name}\` must be an integer of at least ${min}, got ${shown(value)}`)
}

/** Per-call options, checked only when given. */
function checkCallOptions(options: GetOrLoadOptions, known: readonly string[], method: string): void {
  if (typeof options !== 'object' || options === null || Array.isArray(options))
    callCheck.fail(`${method} options must be an object, got ${describeValue(options)}`)
  callCheck.known(options, known, `${method} options`)
  checkInt('ttlMs', options.ttlMs, 1)
  checkInt('softTimeoutMs', options.softTimeoutMs, 0)
  checkInt('hardTimeoutMs', options.hardTimeoutMs, 0)
  const { onLoadError } = options
  if (onLoadError !== undefined && onLoadError !== 'serve-stale' && onLoadError !== 'fail')
    callCheck.fail(`\`onLoadError\` must be 'serve-stale' or 'fail', got ${describeValue(onLoadError)}`)
  if (options.admit !== undefined && typeof options.admit !== 'function')
    callCheck.fail(`\`admit\` must be a function, got ${describeValue(options.admit)}`)
}

/**
 * A `getOrLoad`'s key and options, checked (the disabled cache checks them too, so a mistake shows
 * with the cache off as with it on); its tags, validated and sorted.
 */
export function checkRead(key: string, options: GetOrLoadOptions = NO_OPTIONS): string[] | undefined {
  checkKey(key)
  if (options === NO_OPTIONS) return undefined
  checkCallOptions(options, GET_OR_LOAD_OPTIONS, 'getOrLoad')
  return options.tags === undefined ? undefined : checkTags(options.tags)
}

/** A `set`'s key and options, checked; its tags, validated and sorted. */
export function checkSet(key: string, options: CacheSetOptions = NO_OPTIONS): string[] | undefined {
  checkKey(key)
  if (options !== NO_OPTIONS) checkCallOptions(options, SET_OPTIONS, 'set')
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
