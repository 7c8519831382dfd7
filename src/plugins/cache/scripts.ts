import { codes, defineScript, ignored, integer } from '../../redis/scripts.ts'
import type { GetReply, GetState } from './entry.ts'

// The cache's scripts (src/lua/cache-*.lua). An entry's scripts take its three keys: the value, its
// generation (the fence) and its fill lease.

const ENTRY_KEYS = ['value', 'generation', 'lease'] as const

const GET_STATE = codes({
  fresh: 'fresh',
  early: 'early',
  refresh: 'refresh',
  stale: 'stale',
  load: 'load',
  wait: 'wait',
} satisfies Record<GetState, GetState>)

export const CACHE_GET = defineScript({
  name: 'cacheGet',
  keys: ENTRY_KEYS,
  /** currentTags: none, or the current "tag=generation,..." of the read's tags. */
  args: ['owner', 'leaseTtlMs', 'beta', 'draw', 'generationTtlMs', 'newGeneration', '...currentTags'],
  reply: (raw): GetReply => {
    const [state, ...rest] = raw as GetReply
    return [GET_STATE(state), ...rest]
  },
})

export const CACHE_FILL = defineScript({
  name: 'cacheFill',
  keys: ENTRY_KEYS,
  /** recorded: none, or the "tag=generation,..." of a tagged entry's tags. */
  args: ['generation', 'owner', 'softMs', 'hardMs', 'loadMs', 'payload', 'generationTtlMs', '...recorded'],
  reply: codes({ stored: 1, fenced: 0 }),
})

export const CACHE_RELEASE = defineScript({
  name: 'cacheRelease',
  keys: ['lease'],
  args: ['owner'],
  reply: codes({ released: 1, notOwner: 0 }),
})

export const CACHE_SET = defineScript({
  name: 'cacheSet',
  keys: ENTRY_KEYS,
  args: ['generation', 'generationTtlMs', 'softMs', 'hardMs', 'payload', 'recorded'],
  reply: ignored,
})

export const CACHE_INVALIDATE = defineScript({
  name: 'cacheInvalidate',
  /** Per entry its value, generation and lease. */
  keys: ['...entries'],
  args: ['generation', 'generationTtlMs'],
  /** The number of entries. */
  reply: integer,
})

export const CACHE_TAGS = defineScript({
  name: 'cacheTags',
  keys: ['tag'],
  args: ['newGeneration', 'ttlMs', 'extend'],
  /** The tag's generation. */
  reply: (raw) => String(raw),
})
