import { type OptionChecker, optionChecker, optionKeys } from '../../plugins/common/options.ts'
import { checkedOptions, shown } from '../checks.ts'

// A stream consumer's options: their shape and their checks, made before anything connects.

/** One stream entry as a handler gets it. */
export interface StreamEntry {
  /** The entry's stream id (`<ms>-<seq>`). */
  id: string
  fields: Record<string, string>
  /** How many times the group delivered it, this delivery included (1 on the first read). */
  deliveries: number
}

export interface StreamConsumerOptions {
  /** The stream key. */
  stream: string
  /** The consumer group: every group sees every entry; within a group each entry goes to one consumer. */
  group: string
  /** This consumer's name within the group, unique per process (e.g. host and pid). */
  consumer: string
  /**
   * Processes one entry. Resolving acknowledges it (XACK); throwing leaves it pending, so it is
   * delivered again once idle longer than `visibilityTimeoutMs`. Make it idempotent: delivery is
   * at-least-once. Give this or `handleBatch`.
   */
  handler?: (entry: StreamEntry) => Promise<void>
  /**
   * Processes the entries of one read together (one Redis round trip for all, say); resolving
   * acknowledges them all in one XACK. If it throws, each entry is tried again alone through it, so
   * one failing entry neither holds back nor re-runs the others' acknowledgement. Idempotent, as `handler`.
   */
  handleBatch?: (entries: StreamEntry[]) => Promise<void>
  /** An entry pending this long (its consumer died or failed it) is claimed again (XAUTOCLAIM). Default 30 s. */
  visibilityTimeoutMs?: number
  /** After this many deliveries an entry goes to the dead-letter stream and is acknowledged. Default 5. */
  maxDeliveries?: number
  /** Where given-up entries go (their fields plus `_id`, `_group`, `_deliveries`, `_error`). Default `<stream>:dead`. */
  deadLetterStream?: string
  /** Approximate cap of the dead-letter stream (MAXLEN ~): the oldest dead letters go first. Default 10 000. */
  deadLetterMaxLen?: number
  /** Entries read per XREADGROUP / XAUTOCLAIM call. Default 10. */
  batch?: number
  /** How long one XREADGROUP blocks waiting for entries. Default 2000 ms. */
  blockMs?: number
  /**
   * After a read that got some entries but fewer than `batch`, wait this long before reading again,
   * so the next read takes what arrived meanwhile in one go: under a steady flow, fewer and fuller
   * reads (one XREADGROUP, one handleBatch and one XACK for many entries) for this much more delay.
   * Default 0 (read again at once).
   */
  batchWaitMs?: number
  /** Where a group created now starts: '0' the whole retained stream (default), '$' only new entries. */
  startId?: string
  /** How often pending entries are looked for. Default half the visibility timeout (at most 5 s). */
  claimIntervalMs?: number
  /** Called with errors of the loop (Redis unreachable, a handler's failure); the loop goes on. */
  onError?: (err: unknown, entry?: StreamEntry) => void
}

const CONSUMER_OPTIONS = optionKeys<StreamConsumerOptions>({
  stream: true,
  group: true,
  consumer: true,
  handler: true,
  handleBatch: true,
  visibilityTimeoutMs: true,
  maxDeliveries: true,
  deadLetterStream: true,
  deadLetterMaxLen: true,
  batch: true,
  blockMs: true,
  batchWaitMs: true,
  startId: true,
  claimIntervalMs: true,
  onError: true,
})

function checkString(check: OptionChecker, value: unknown, option: string): void {
  if (typeof value !== 'string' || value.length === 0)
    check.fail(`\`${option}\` must be a non-empty string, got ${shown(value)}`)
}

function checkInteger(check: OptionChecker, value: unknown, option: string, min: number): void {
  if (!Number.isSafeInteger(value) || (value as number) < min)
    check.fail(`\`${option}\` must be an integer of ${min} or more, got ${shown(value)}`)
}

/** The consumer's options, checked (unknown keys too) before anything connects. */
export function checkConsumerOptions(options: StreamConsumerOptions): void {
  const check = optionChecker('createStreamConsumer')
  checkedOptions(check, options, CONSUMER_OPTIONS)
  for (const option of ['stream', 'group', 'consumer'] as const) checkString(check, options[option], option)
  if (!options.handler === !options.handleBatch)
    check.fail('give `handler` (one entry at a time) or `handleBatch` (a read at a time), not both')
  for (const option of ['handler', 'handleBatch', 'onError'] as const)
    if (options[option] !== undefined && typeof options[option] !== 'function')
      check.fail(`\`${option}\` must be a function, got ${shown(options[option])}`)
  for (const option of ['deadLetterStream', 'startId'] as const)
    if (options[option] !== undefined) checkString(check, options[option], option)
  const minimum = {
    visibilityTimeoutMs: 1,
    maxDeliveries: 1,
    deadLetterMaxLen: 1,
    batch: 1,
    blockMs: 1,
    batchWaitMs: 0,
    claimIntervalMs: 1,
  }
  for (const [option, min] of Object.entries(minimum) as Array<[keyof typeof minimum, number]>)
    if (options[option] !== undefined) checkInteger(check, options[option], option, min)
}
