import { createHash } from 'node:crypto'
import { CacheKeyInvalidError, CacheTagInvalidError, tagListError } from './errors.ts'

/**
 * Logical keys are `<namespace>:<id>` with a short, fixed alphabet: they are built by the code
 * from ids it has parsed and bounded, never copied from a request, and they cannot carry a
 * hash-tag brace.
 */
export const CACHE_KEY = /^[a-z][a-z0-9-]{0,31}:[A-Za-z0-9_.-]{1,64}$/

/** Tags: a namespace (`products`) or a key-like `<namespace>:<id>` (`user:42`); same alphabet, no braces. */
export const CACHE_TAG = /^[a-z][a-z0-9-]{0,31}(:[A-Za-z0-9_.-]{1,64})?$/

const MAX_TAGS = 16

export function checkKey(key: string): void {
  if (typeof key !== 'string' || !CACHE_KEY.test(key)) throw new CacheKeyInvalidError(key)
}

/** Validated, deduplicated and sorted (a canonical order for the recorded generations); none: undefined. */
export function checkTags(tags: readonly string[]): string[] | undefined {
  if (!Array.isArray(tags) || tags.length > MAX_TAGS) throw tagListError(tags, MAX_TAGS)
  for (const tag of tags)
    if (typeof tag !== 'string' || !CACHE_TAG.test(tag)) throw new CacheTagInvalidError(tag)
  return tags.length ? [...new Set(tags)].sort() : undefined
}

/** A key's (or a tag's) namespace, `account` for `account:42`: the label of its metrics. */
export function namespaceOf(key: string): string {
  const colon = key.indexOf(':')
  return colon < 0 ? key : key.slice(0, colon)
}

/** One part of a key built by `cacheKey`: a string, or a number or bigint (written as `String()` does). */
export type CacheKeyPart = string | number | bigint

const NAMESPACE = /^[a-z][a-z0-9-]{0,31}$/
/** A part kept as it is in a readable id: no `.` (the separator), nothing outside the id alphabet. */
const READABLE_PART = /^[A-Za-z0-9_-]+$/
const UNSAFE_RUN = /[^A-Za-z0-9_-]+/g
/** With the u flag a pair is one code point: only a lone surrogate matches (it has no UTF-8 form). */
const LONE_SURROGATE = /\p{Cs}/u
const MAX_ID = 64
/** Characters of the digest kept in a hashed id: 32 base64url characters, 192 bits of SHA-256. */
const DIGEST_CHARS = 32
/** Between the readable prefix and the digest; a readable id never holds two dots in a row. */
const MARKER = '..'
const MAX_PREFIX = MAX_ID - MARKER.length - DIGEST_CHARS

function partText(part: unknown, index: number): string {
  if (typeof part === 'string') {
    if (LONE_SURROGATE.test(part))
      throw new CacheKeyInvalidError(part, `cache: cacheKey part ${index} holds a lone UTF-16 surrogate`)
    return part
  }
  if (typeof part === 'bigint') return String(part)
  if (typeof part === 'number' && Number.isFinite(part)) return String(part)
  throw new CacheKeyInvalidError(
    part,
    `cache: cacheKey part ${index} must be a string, a finite number or a bigint, got ${typeof part === 'number' ? String(part) : part === null ? 'null' : `a ${typeof part}`}`,
  )
}

/**
 * A valid cache key `<namespace>:<id>` from a namespace and any parts, the same for the same parts
 * in every process and every version of this library:
 *
 * - parts that are all non-empty runs of `A-Z a-z 0-9 _ -`, joined with `.` in at most 64
 *   characters, are the id as they are: `cacheKey('user', 42, 'profile')` is `user:42.profile`;
 * - anything else is hashed: the id is a readable prefix (each part with every run of other
 *   characters replaced by `-`, joined with `.`, cut at 30 characters), `..`, and the first 32
 *   characters of the base64url SHA-256 of the parts, each written as its UTF-8 byte length, `:`
 *   and its UTF-8 bytes (so `('a:b', 'c')` and `('a', 'b:c')` differ).
 *
 * Numbers and bigints are written as `String()` writes them (`42` and `'42'` give the same key).
 * Throws CacheKeyInvalidError for an invalid namespace, no parts, or a part of another type.
 */
export function cacheKey(namespace: string, ...parts: CacheKeyPart[]): string {
  if (typeof namespace !== 'string' || !NAMESPACE.test(namespace))
    throw new CacheKeyInvalidError(
      namespace,
      `cache: cacheKey namespace must be 1 to 32 characters of a-z, 0-9 and '-', starting with a letter, got ${typeof namespace === 'string' ? `'${namespace.slice(0, 40)}'` : typeof namespace}`,
    )
  if (parts.length === 0)
    throw new CacheKeyInvalidError(undefined, 'cache: cacheKey needs at least one part after the namespace')
  const texts = parts.map(partText)
  const joined = texts.join('.')
  if (joined.length <= MAX_ID && texts.every((text) => READABLE_PART.test(text)))
    return `${namespace}:${joined}`
  const hash = createHash('sha256')
  for (const text of texts) {
    const bytes = Buffer.from(text, 'utf8')
    hash.update(`${bytes.length}:`)
    hash.update(bytes)
  }
  const digest = hash.digest('base64url').slice(0, DIGEST_CHARS)
  const prefix = texts
    .map((text) => text.replace(UNSAFE_RUN, '-'))
    .join('.')
    .slice(0, MAX_PREFIX)
  const key = `${namespace}:${prefix}${MARKER}${digest}`
  if (!CACHE_KEY.test(key)) throw new Error(`cache: cacheKey built an invalid key '${key}'`)
  return key
}
