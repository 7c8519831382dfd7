import { type OptionChecker, optionChecker, optionKeys } from '../../plugins/common/options.ts'
import { isCluster, type RedisClient } from '../../redis/client.ts'
import { callScript, codes, defineScript } from '../../redis/scripts.ts'
import { checkedOptions, shown } from '../checks.ts'

// The producing side of a stream: appends in one script call, each entry once per marker
// (appendEachOnce, appendOnce) or a batch given as JSON (appendJsonEntries).

export interface AppendOnceEntry {
  /** Names the source event (e.g. `<prefix>seen:{tag}:<eventId>`); must share its stream's hash tag. */
  marker: string
  fields: Record<string, string>
  /** The published JSON object (when there is a channel), sent with `"id"` (the entry's id) put first. Default `{}`. */
  message?: Record<string, unknown>
  /** This entry's stream, when it is not the call's `stream`: one call appends to several streams. */
  stream?: string
  /** This entry's channel, when it is not the call's `channel`. */
  channel?: string
}

export interface AppendEachOnceOptions {
  /** The stream of every entry that does not name its own. */
  stream?: string
  /** How long each marker is remembered: longer than any redelivery of the source event. */
  markerTtlMs: number
  /** Approximate cap of the streams (MAXLEN ~). Default none. */
  maxLen?: number
  /**
   * How long a stream lives after its latest append, in ms: each stream appended to gets this TTL
   * (PEXPIRE, refreshed by every append) and loses its entries older than this by the Redis clock
   * (XTRIM MINID ~, whole nodes at a time). Default none: the streams never expire.
   */
  streamTtlMs?: number
  /** Published (PUBLISH) with each entry appended now, for entries that do not name their own. */
  channel?: string
  entries: readonly AppendOnceEntry[]
}

export type AppendOnceOptions = Omit<AppendEachOnceOptions, 'entries' | 'stream'> &
  AppendOnceEntry & { stream: string }

const APPEND_EACH_ONCE_OPTIONS = optionKeys<AppendEachOnceOptions>({
  stream: true,
  markerTtlMs: true,
  maxLen: true,
  streamTtlMs: true,
  channel: true,
  entries: true,
})
const APPEND_ONCE_ENTRY_KEYS = optionKeys<AppendOnceEntry>({
  marker: true,
  fields: true,
  message: true,
  stream: true,
  channel: true,
})

/** MAXLEN ~ takes a whole number; 0 (the scripts' "no cap") is the default. */
function checkMaxLen(check: OptionChecker, maxLen: unknown): void {
  if (maxLen !== undefined && (!Number.isSafeInteger(maxLen) || (maxLen as number) < 0))
    check.fail(`\`maxLen\` must be a whole number, 0 or more, got ${shown(maxLen)}`)
}

/**
 * Entries per script call. Redis serves nobody else while a script runs (about 10 µs an entry), so a
 * large batch goes as several calls, sent together.
 */
const APPEND_ENTRIES_PER_CALL = 100

/**
 * Appends entries, each once per marker, in one script call (one round trip; several of at most
 * `APPEND_ENTRIES_PER_CALL` entries, sent together, for a larger batch): for each entry the marker
 * (SET PX) with its id, the XADD and the PUBLISH happen together or not at all; with `streamTtlMs`,
 * the same call then sets the TTL of each stream it appended to and trims their expired entries. A handler running
 * again for the same source events gets the first ids back and `appended: false`. On a Cluster,
 * entries of different streams may live on different nodes: one call per stream, all in flight
 * together.
 */
const APPENDED = codes({ appended: 1, existed: 0 })
const APPEND_ONCE = defineScript({
  name: 'streamAppendOnce',
  /** Per entry its stream, then its marker. */
  keys: ['...streamsAndMarkers'],
  /** entries: per entry its channel, message, n, and n field/value arguments. */
  args: ['maxLen', 'markerTtlMs', 'streamTtlMs', '...entries'],
  reply: (raw) =>
    (raw as Array<[string, number]>).map(([id, appended]) => ({
      id: String(id),
      appended: APPENDED(appended) === 'appended',
    })),
})
const APPEND_JSON = defineScript({
  name: 'streamAppendJson',
  keys: ['stream'],
  args: ['maxLen', 'entries'],
  // An empty Lua table comes back as an empty array (or nil from older servers).
  reply: (raw) => ((raw as string[] | null) ?? []).map(String),
})

export async function appendEachOnce(
  redis: RedisClient,
  options: AppendEachOnceOptions,
): Promise<Array<{ id: string; appended: boolean }>> {
  const check: OptionChecker = optionChecker('appendEachOnce')
  checkedOptions(check, options, APPEND_EACH_ONCE_OPTIONS)
  // Checked here: in the script, a refused SET PX would come after its XADD, leaving an entry
  // without a marker that every retry appends again.
  if (!Number.isSafeInteger(options.markerTtlMs) || options.markerTtlMs <= 0)
    check.fail(
      `\`markerTtlMs\` must be a whole number of milliseconds above 0, got ${shown(options.markerTtlMs)}`,
    )
  if (
    options.streamTtlMs !== undefined &&
    (!Number.isSafeInteger(options.streamTtlMs) || options.streamTtlMs <= 0)
  )
    check.fail(
      `\`streamTtlMs\` must be a whole number of milliseconds above 0, got ${shown(options.streamTtlMs)}`,
    )
  checkMaxLen(check, options.maxLen)
  if (!Array.isArray(options.entries))
    check.fail(`\`entries\` must be an array, got ${shown(options.entries)}`)
  const entries = options.entries.map((entry: AppendOnceEntry) => {
    checkedOptions(check, entry, APPEND_ONCE_ENTRY_KEYS, 'entries[]')
    const stream = entry.stream ?? options.stream
    if (!stream) check.fail('an entry has no stream (give options.stream or entry.stream)')
    const marker: unknown = entry.marker
    if (typeof marker !== 'string' || marker === '')
      check.fail(`an entry's \`marker\` must be a non-empty string, got ${shown(marker)}`)
    return { ...entry, stream, channel: entry.channel ?? options.channel ?? '' }
  })
  // Entries by call, in order: calls to one node run in the order sent, so a stream's entries keep
  // theirs and a marker repeated in a later call finds the earlier one's.
  const perStream = isCluster(redis)
  const groups: number[][] = []
  const filling = new Map<string, number[]>()
  entries.forEach((entry, index) => {
    const key = perStream ? entry.stream : ''
    let group = filling.get(key)
    if (!group || group.length === APPEND_ENTRIES_PER_CALL) {
      group = []
      filling.set(key, group)
      groups.push(group)
    }
    group.push(index)
  })
  const results: Array<{ id: string; appended: boolean }> = new Array(entries.length)
  await Promise.all(
    groups.map(async (indexes) => {
      const streamsAndMarkers: string[] = []
      const args: Array<string | number> = []
      for (const index of indexes) {
        const entry = entries[index]!
        const fields = Object.entries(entry.fields).flat()
        streamsAndMarkers.push(entry.stream, entry.marker)
        args.push(entry.channel, JSON.stringify(entry.message ?? {}), fields.length, ...fields)
      }
      const replies = await callScript(
        redis,
        APPEND_ONCE,
        { streamsAndMarkers },
        {
          maxLen: options.maxLen ?? 0,
          markerTtlMs: options.markerTtlMs,
          streamTtlMs: options.streamTtlMs ?? 0,
          entries: args,
        },
      )
      replies.forEach((reply, i) => {
        results[indexes[i]!] = reply
      })
    }),
  )
  return results
}

export interface AppendJsonEntriesOptions {
  stream: string
  /** Approximate cap of the stream (MAXLEN ~). Default none. */
  maxLen?: number
  /**
   * The entries as one JSON array, each entry an array of field/value strings
   * (`[["eventId","7","data","{...}"], ...]`), for instance built by the database query that
   * produced them. Every field and value must be a JSON string.
   */
  entries: string
}

const APPEND_JSON_OPTIONS = optionKeys<AppendJsonEntriesOptions>({
  stream: true,
  maxLen: true,
  entries: true,
})

/**
 * Appends a batch of entries, given as one JSON array, to one stream in order, in one script call:
 * the caller's process neither parses nor rebuilds an entry. Resolves with the new ids, in order.
 * Nothing is deduplicated: a caller that may run twice for the same entries absorbs duplicates
 * downstream (or uses `appendEachOnce`). A script that fails midway (a wrong key type, out of
 * memory) leaves the entries before the failure appended.
 */
export async function appendJsonEntries(
  redis: RedisClient,
  options: AppendJsonEntriesOptions,
): Promise<string[]> {
  const check = optionChecker('appendJsonEntries')
  checkedOptions(check, options, APPEND_JSON_OPTIONS)
  if (typeof options.stream !== 'string' || options.stream === '')
    check.fail(`\`stream\` must be a non-empty string, got ${shown(options.stream)}`)
  checkMaxLen(check, options.maxLen)
  if (typeof options.entries !== 'string')
    check.fail(`\`entries\` must be a JSON array as a string, got ${shown(options.entries)}`)
  return callScript(
    redis,
    APPEND_JSON,
    { stream: options.stream },
    { maxLen: options.maxLen ?? 0, entries: options.entries },
  )
}

/** `appendEachOnce` for one entry. */
export async function appendOnce(
  redis: RedisClient,
  options: AppendOnceOptions,
): Promise<{ id: string; appended: boolean }> {
  const { marker, fields, message, ...stream } = options
  // The options of one entry and of the call together: checked by appendEachOnce (the call's under
  // their own names, the entry's in `entries[]`).
  const [result] = await appendEachOnce(redis, { ...stream, entries: [{ marker, fields, message }] })
  return result!
}
