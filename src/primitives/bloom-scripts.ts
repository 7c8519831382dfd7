import { codes, defineScript, integer } from '../redis/scripts.ts'

// The Bloom filter's scripts (src/lua/bloom-*.lua), with their replies by name.

/** Per item of a call, true when the script answered '1' for it; null when the shard cannot answer. */
const perItem = (raw: unknown): boolean[] | null =>
  raw === null ? null : Array.from(String(raw), (answer) => answer === '1')

/** Why a rebuild's call was refused: a later rebuild started since, or Redis lost its state or bits. */
export type RebuildFailure = 'superseded' | 'lost'
const REBUILD_FAILURE = codes({ superseded: -1, lost: -2 })
const FINISH_CODE = codes({ superseded: -1, lost: -2, aborted: 1 })

/** Per item: its bits are all set (maybe present). */
export const BLOOM_CHECK = defineScript({
  name: 'bloomCheck',
  keys: ['bits'],
  args: ['shapeId', 'hashes', 'positions'],
  reply: perItem,
})

/** Per item: one of its bits was clear (it was not in the filter). */
export const BLOOM_ADD = defineScript({
  name: 'bloomAdd',
  keys: ['bits', 'building', 'rebuild'],
  /** generation '' and rebuild 0 for an application's add. */
  args: ['generation', 'shapeId', 'hashes', 'rebuild', 'positions'],
  reply: (raw): { failure: RebuildFailure } | { items: boolean[] | null } =>
    typeof raw === 'number' ? { failure: REBUILD_FAILURE(raw) } : { items: perItem(raw) },
})

/** The rebuild's number on this shard. */
export const BLOOM_BEGIN = defineScript({
  name: 'bloomBegin',
  keys: ['building', 'rebuild'],
  args: ['generation', 'shapeId', 'bits', 'shape'],
  reply: integer,
})

/** A switch answers the shape the live bits had before ('' when none); an abort answers nothing. */
export const BLOOM_FINISH = defineScript({
  name: 'bloomFinish',
  keys: ['bits', 'building', 'rebuild'],
  args: ['generation', 'action', 'calls', 'bytes', 'rebuild'],
  reply: (raw): { failure?: RebuildFailure; previousShape: string } => {
    if (typeof raw !== 'number') return { previousShape: String(raw) }
    const code = FINISH_CODE(raw)
    return code === 'aborted' ? { previousShape: '' } : { failure: code, previousShape: '' }
  },
})
