import { describeValue } from '../../redis/client.ts'
import type { EntryOptions } from './entry-options.ts'
import { CacheValueNotJsonError, whyNotJson } from './errors.ts'
import type { CacheSettings } from './types.ts'

/** What cache-get.lua tells a read to do (its header describes each state). */
export type GetState = 'fresh' | 'early' | 'refresh' | 'stale' | 'load' | 'wait'
/** cache-get.lua's reply; the 4th element, once checked, is what a fill records for the entry's tags. */
export type GetReply = [GetState, string, string, string?]
/** A peek: empty when there is nothing fresh to serve, else the payload (and a tagged entry's tags). */
export type PeekReply = [payload?: string, recorded?: string]

const NOTHING_FRESH: PeekReply = []

/**
 * A peek's decision on an entry as stored (the format of cache-get.lua), with a plain GET and no
 * script: Redis would run a script's commands through Lua, about 1 µs each, on every cached read.
 * So freshness is judged on this process's clock, not Redis's. An entry judged stale falls back to
 * cache-get.lua, which decides on the Redis clock; one judged fresh is at most the clocks' skew past
 * its soft TTL, and still within its hard TTL. `beta` > 0 applies XFetch's early refresh with `draw`,
 * as cache-get.lua does, so the read that follows chooses the same.
 */
export function peekEntry(raw: string | null, beta: number, draw: number): PeekReply {
  if (raw === null) return NOTHING_FRESH
  let start = 0
  let recorded: string | undefined
  if (raw.charCodeAt(0) === 35 /* # */) {
    const end = raw.indexOf('|', 1)
    recorded = raw.slice(1, end)
    start = end + 1
  }
  const a = raw.indexOf('|', start)
  const b = raw.indexOf('|', a + 1)
  const softAt = a < 0 || b < 0 ? Number.NaN : Number(raw.slice(start, a))
  const now = Date.now()
  // Written so that an unreadable entry (NaN) counts as stale too.
  if (!(now < softAt)) return NOTHING_FRESH
  if (beta > 0 && now - Number(raw.slice(a + 1, b)) * beta * Math.log(draw) >= softAt) return NOTHING_FRESH
  const payload = raw.slice(b + 1)
  return recorded === undefined ? [payload] : [payload, recorded]
}

/** Soft and hard TTL of a new entry: jittered, and with the stale window unless it is a "not found". */
export function lifetimes(
  settings: CacheSettings,
  entry: EntryOptions,
  notFound: boolean,
): [softMs: number, hardMs: number] {
  const base = notFound ? entry.notFoundTtlMs : entry.ttlMs
  // Jitter spreads expiries of keys filled together, so they do not all miss at the same moment.
  const soft = Math.round(base * (1 + settings.jitter * Math.random()))
  return [soft, notFound ? soft : soft + settings.staleWhileRevalidateMs]
}

/**
 * The payload stored for `value`. A value the serializer cannot hold (a BigInt, a cycle,
 * undefined) is refused here, before any fill, rather than logged as a Redis failure and
 * returned uncached: the caller learns at once that this key never caches.
 */
export function encodeValue(settings: CacheSettings, key: string, value: unknown): string {
  let payload: unknown
  try {
    payload = settings.serialize(value)
  } catch (err) {
    const custom = settings.serialize !== JSON.stringify
    throw new CacheValueNotJsonError(
      key,
      custom ? `serialize threw: ${(err as Error)?.message ?? String(err)}` : whyNotJson(value, err),
      { cause: err },
    )
  }
  if (typeof payload === 'string') return payload
  throw new CacheValueNotJsonError(
    key,
    settings.serialize === JSON.stringify
      ? whyNotJson(value, undefined)
      : `serialize returned ${describeValue(payload)}, expected a string`,
  )
}
