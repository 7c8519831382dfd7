// Memory figures for the results: the resident memory of a server under test, and what the
// idempotency records it leaves in Redis cost to retain.
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { Redis } from 'ioredis'
import { median } from './runner.ts'

/** Transfers retained for a day at 100 transfers/s. */
export const RECORDS_PER_DAY_AT_100_PER_S = 100 * 86_400

export interface ProcessMemory {
  /** VmRSS: resident now. */
  rssBytes: number
  /** VmHWM: the highest resident size the process reached. */
  peakRssBytes: number
}

/** VmRSS and VmHWM of /proc/<pid>/status; undefined off Linux or once the process is gone. */
export function processMemory(pid: number): ProcessMemory | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8')
    const kib = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1]) * 1024
    const memory = { rssBytes: kib('VmRSS'), peakRssBytes: kib('VmHWM') }
    return Number.isFinite(memory.rssBytes) ? memory : undefined
  } catch {
    return undefined
  }
}

export const mib = (bytes: number | undefined) =>
  bytes === undefined ? 'n/a' : `${(bytes / 2 ** 20).toFixed(1)} MiB`
export const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(2)} GiB`

export interface RecordMemory {
  /** Completed records measured (a sample of those under the prefix). */
  records: number
  /** MEMORY USAGE of one completed record (key, value and their allocations). */
  bytes: { median: number; min: number; max: number }
  /**
   * used_memory growth per record over `copies` copies of a measured record, each with a TTL, in
   * an empty database: MEMORY USAGE plus the main and expires dictionaries' entries and buckets.
   */
  keyspaceBytes: number
  copies: number
  /** A day of retention at 100 transfers/s, by MEMORY USAGE and by used_memory growth. */
  day: { bytes: number; keyspaceBytes: number }
}

/**
 * Measures the completed idempotency records (String values; processing ones are Hashes) under
 * `prefix` in a private Redis: MEMORY USAGE of up to `sample` of them, then copies of the median
 * one written with a TTL into database 15 (empty, its own dictionaries) to see what Redis spends
 * beyond MEMORY USAGE; the copies are flushed afterwards.
 */
export async function idempotencyRecordMemory(
  redisUrl: string,
  { prefix = 'idem:', sample = 200, copies = 100_000 } = {},
): Promise<RecordMemory> {
  const redis = new Redis(redisUrl)
  const scratch = new Redis(redisUrl, { db: 15 })
  try {
    const sized: Array<{ key: string; bytes: number }> = []
    let cursor = '0'
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000, 'TYPE', 'string')
      cursor = next
      for (const key of keys) {
        if (sized.length >= sample) break
        sized.push({ key, bytes: Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0')) })
      }
    } while (cursor !== '0' && sized.length < sample)
    if (sized.length === 0) throw new Error(`no completed idempotency record under ${prefix}`)
    const sizes = sized.map((s) => s.bytes)
    const typical = sized.find((s) => s.bytes === median(sizes)) ?? sized[0]!
    const value = (await redis.getBuffer(typical.key))!

    if ((await scratch.dbsize()) !== 0) throw new Error('database 15 of the bench Redis is not empty')
    const used = async () => Number(/^used_memory:(\d+)/m.exec(await scratch.info('memory'))![1])
    const before = await used()
    for (let written = 0; written < copies; written += 1000) {
      const batch = scratch.pipeline()
      for (let i = written; i < Math.min(copies, written + 1000); i++)
        batch.set(`${prefix}{${randomBytes(32).toString('base64url')}}`, value, 'PX', 86_400_000)
      await batch.exec()
    }
    const keyspaceBytes = ((await used()) - before) / copies
    await scratch.flushdb()

    const bytes = { median: median(sizes), min: Math.min(...sizes), max: Math.max(...sizes) }
    return {
      records: sized.length,
      bytes,
      keyspaceBytes,
      copies,
      day: {
        bytes: bytes.median * RECORDS_PER_DAY_AT_100_PER_S,
        keyspaceBytes: keyspaceBytes * RECORDS_PER_DAY_AT_100_PER_S,
      },
    }
  } finally {
    redis.disconnect()
    scratch.disconnect()
  }
}
