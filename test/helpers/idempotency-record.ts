// Reads an idempotency record as Redis holds it, whichever its layout: the processing Hash, the
// packed String of a completed record (see src/lua/idempotency-complete.lua), or a completed Hash.
import type { RedisClient } from '../../src/redis/client.ts'

export interface IdempotencyRecordView {
  state: 'processing' | 'done'
  /** The fingerprint; its first 22 characters once packed. */
  fp: string
  /** Processing only. */
  token?: string
  /** Done only. */
  status?: number
  /** Done only: the stored header JSON as written. */
  headers?: string
  body?: Buffer
  kept?: boolean
}

export async function readIdempotencyRecord(
  redis: RedisClient,
  key: string,
): Promise<IdempotencyRecordView | null> {
  const type = await redis.type(key)
  if (type === 'none') return null
  if (type === 'string') {
    const packed = (await redis.getBuffer(key))!
    const newline = packed.indexOf(0x0a, 26)
    return {
      state: 'done',
      fp: packed.subarray(0, 22).toString(),
      status: Number(packed.subarray(22, 25).toString()),
      kept: packed[25] === 0x31,
      headers: packed.subarray(26, newline).toString(),
      body: packed.subarray(newline + 1),
    }
  }
  const hash = await redis.hgetallBuffer(key)
  const field = (name: string) => hash[name]?.toString()
  if (field('state') === 'processing') return { state: 'processing', fp: field('fp')!, token: field('token') }
  return {
    state: 'done',
    fp: field('fp')!,
    status: Number(field('status')),
    kept: field('kept') === '1',
    headers: field('headers'),
    body: hash.body,
  }
}
