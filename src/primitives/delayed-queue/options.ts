import { randomBytes } from 'node:crypto'
import { type OptionChecker, optionChecker, optionKeys } from '../../plugins/common/options.ts'
import { checkedOptions, shown } from '../checks.ts'

// The delayed queue's options and its consumers' options: their shapes, their checks (before
// anything connects) and their defaults, resolved once.

export interface DelayedQueueOptions {
  /** The queue's name; every instance of one queue uses the same name (and keyPrefix). */
  name: string
  /**
   * This instance's id (default: random). A stable id (a pod or host name) lets a restarted instance
   * carry on with its own delayed set; two live processes must never share one.
   */
  instanceId?: string
  /** Prefix of every key (default `dq:`). */
  keyPrefix?: string
  /** A taken id not acknowledged within this many ms goes back to ready (default 30 000). */
  visibilityTimeoutMs?: number
  /** Heartbeat key TTL (default 15 000); the heartbeat is refreshed every third of it. */
  heartbeatTtlMs?: number
  /** How often `start()` moves due ids to ready (default 1000). */
  moveIntervalMs?: number
  /** How often `start()` runs the watchdog (default half the visibility timeout, at most 5000). */
  watchdogIntervalMs?: number
  /** How often `start()` looks for orphaned instances (default `heartbeatTtlMs`). */
  adoptIntervalMs?: number
  /** Ids per script call (mover, watchdog, adoption), 1 to 1000 (default 100). */
  batch?: number
  /** Called with the errors of background work (timers and consumers), which never throws. */
  onError?: (error: unknown, task: DelayedQueueTask) => void
}

export type DelayedQueueTask =
  | 'move'
  | 'heartbeat'
  | 'watchdog'
  | 'adopt'
  | 'take'
  | 'ack'
  | 'nack'
  | 'retryDelay'

export interface ConsumeOptions {
  /** Items handled at once by this consumer (default 1). */
  concurrency?: number
  /** Pause when nothing is ready, or after a failed take, in ms (default 100). */
  pollMs?: number
  /**
   * Delay before a failed item is due again, by its failed attempt number in this process (1, 2, ...):
   * default 1 s doubling up to 60 s.
   */
  retryDelayMs?: (attempt: number, id: string, error: unknown) => number
}

const QUEUE_OPTIONS = optionKeys<DelayedQueueOptions>({
  name: true,
  instanceId: true,
  keyPrefix: true,
  visibilityTimeoutMs: true,
  heartbeatTtlMs: true,
  moveIntervalMs: true,
  watchdogIntervalMs: true,
  adoptIntervalMs: true,
  batch: true,
  onError: true,
})
const CONSUME_OPTIONS = optionKeys<ConsumeOptions>({ concurrency: true, pollMs: true, retryDelayMs: true })

function positiveInt(
  check: OptionChecker,
  value: unknown,
  option: string,
  min = 1,
  max = Number.MAX_SAFE_INTEGER,
) {
  if (!Number.isInteger(value) || (value as number) < min || (value as number) > max)
    check.fail(`\`${option}\` must be an integer from ${min} to ${max}, got ${shown(value)}`)
  return value as number
}

function nonEmpty(check: OptionChecker, value: unknown, option: string): string {
  if (typeof value !== 'string' || value.length === 0)
    check.fail(`\`${option}\` must be a non-empty string, got ${shown(value)}`)
  return value
}

function functionOrUndefined<T>(check: OptionChecker, value: T | undefined, option: string, of: string) {
  if (value !== undefined && typeof value !== 'function')
    check.fail(`\`${option}\` must be a function of ${of}, got ${shown(value)}`)
  return value
}

const defaultRetryDelay = (attempt: number) => Math.min(60_000, 1000 * 2 ** Math.min(attempt - 1, 16))

/** A queue's options, checked, with every default filled in. */
export type QueueSettings = Required<Omit<DelayedQueueOptions, 'onError'>> & {
  /** Reports an error of background work; never throws. */
  onError: (error: unknown, task: DelayedQueueTask) => void
}

export function resolveQueueOptions(options: DelayedQueueOptions): QueueSettings {
  const check = optionChecker('delayed queue')
  checkedOptions(check, options, QUEUE_OPTIONS)
  const name = nonEmpty(check, options.name, 'name')
  const instanceId = nonEmpty(check, options.instanceId ?? randomBytes(8).toString('hex'), 'instanceId')
  const keyPrefix = options.keyPrefix ?? 'dq:'
  if (typeof keyPrefix !== 'string') check.fail(`\`keyPrefix\` must be a string, got ${shown(keyPrefix)}`)
  const visibilityTimeoutMs = positiveInt(check, options.visibilityTimeoutMs ?? 30_000, 'visibilityTimeoutMs')
  const heartbeatTtlMs = positiveInt(check, options.heartbeatTtlMs ?? 15_000, 'heartbeatTtlMs', 3)
  const moveIntervalMs = positiveInt(check, options.moveIntervalMs ?? 1000, 'moveIntervalMs')
  const watchdogIntervalMs = positiveInt(
    check,
    options.watchdogIntervalMs ?? Math.max(1, Math.min(5000, Math.floor(visibilityTimeoutMs / 2))),
    'watchdogIntervalMs',
  )
  const adoptIntervalMs = positiveInt(check, options.adoptIntervalMs ?? heartbeatTtlMs, 'adoptIntervalMs')
  const batch = positiveInt(check, options.batch ?? 100, 'batch', 1, 1000)
  const report =
    functionOrUndefined(check, options.onError, 'onError', 'the error and the task') ?? (() => {})
  // A throwing onError must not break the timers or the consumers.
  const onError = (error: unknown, task: DelayedQueueTask) => {
    try {
      report(error, task)
    } catch {}
  }
  return {
    name,
    instanceId,
    keyPrefix,
    visibilityTimeoutMs,
    heartbeatTtlMs,
    moveIntervalMs,
    watchdogIntervalMs,
    adoptIntervalMs,
    batch,
    onError,
  }
}

/** A consumer's options, checked, with every default filled in. */
export function resolveConsumeOptions(options: ConsumeOptions): Required<ConsumeOptions> {
  const check = optionChecker('delayed queue consume')
  checkedOptions(check, options, CONSUME_OPTIONS)
  const concurrency = positiveInt(check, options.concurrency ?? 1, 'concurrency')
  const pollMs = positiveInt(check, options.pollMs ?? 100, 'pollMs')
  const retryDelayMs =
    functionOrUndefined(check, options.retryDelayMs, 'retryDelayMs', 'the attempt, the id and the error') ??
    defaultRetryDelay
  return { concurrency, pollMs, retryDelayMs }
}
