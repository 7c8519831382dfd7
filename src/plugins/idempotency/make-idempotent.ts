import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import { Counter, type Registry } from 'prom-client'
import type { AnyRedisClient, RedisClient } from '../../redis/client.ts'
import { checkRedisServer, connectRedis } from '../../redis/server.ts'
import { withTimeout } from '../../redis/timeout.ts'
import { adoptMetric } from '../common/metrics.ts'
import { type AnyOption, declareOptions, option, shown } from '../common/options.ts'
import {
  IdempotencyFingerprintTooLargeError,
  IdempotencyInFlightError,
  IdempotencyKeyInvalidError,
  IdempotencyKeyMismatchError,
  IdempotencyResultNotKeptError,
  IdempotencyStoreUnavailableError,
} from './errors.ts'
import { FingerprintTooLargeError, valueFingerprint } from './key.ts'
import {
  byteCap,
  checkRetention,
  IDEMPOTENCY_HINTS,
  type IdempotencyFailureMode,
  STORE_OPTIONS,
} from './options.ts'
import { type IdempotencyLogger, IdempotencyStore, ownerToken, type StoredResponse } from './store.ts'

export interface MakeIdempotentOptions<A extends unknown[]> {
  /**
   * Any ioredis or iovalkey Redis or Cluster. Never closed here. A Redis that may evict (any maxmemory-policy but noeviction)
   * is refused at the first call unless `allowEviction`.
   */
  redis: AnyRedisClient
  /**
   * Run on a Redis whose maxmemory-policy may evict (anything but noeviction): an evicted record lets a retry run `fn`
   * again, so only for functions with a guard of their own. Default false.
   */
  allowEviction?: boolean
  /**
   * The key of a call (a message id, a job id, `invoice:${id}`): a string of 1 to 1024 characters,
   * hashed into the record's name. null or undefined: the call has no key (see `required`).
   */
  keyOf: (...args: A) => string | null | undefined
  /**
   * What the key is bound to; default: all the arguments. Hashed as canonical JSON (object keys
   * sorted). Return less when the arguments carry per-attempt data (a delivery count, a timestamp).
   */
  fingerprintOf?: (...args: A) => unknown
  /**
   * Names the function: functions with different names never share records, even with equal keys
   * and arguments. Default '' (every unnamed function on one Redis and key prefix shares keys).
   * Also the `name` label of the metrics.
   */
  name?: string
  /** True (default): a call without a key throws IdempotencyKeyInvalidError; false: it runs unguarded. */
  required?: boolean
  /**
   * How long a call waits for another one running with its key (polling with backoff) before it
   * throws IdempotencyInFlightError; 0 throws at once. Default twice `leaseMs`, so a waiting call
   * outlives the lease of a crashed owner and takes the call over.
   */
  waitMs?: number
  /** Results whose JSON is larger are returned but not kept (a later call throws IdempotencyResultNotKeptError). Default 64 KiB. */
  maxResultBytes?: number
  /** Exclusive claim, renewed every third of it while the function runs. Default 10 s (100 to 60 000). */
  leaseMs?: number
  /** How long a result is kept for replays; larger than `leaseMs`. Default 24 h. */
  retentionMs?: number
  /**
   * When Redis fails: 'closed' (default) throws IdempotencyStoreUnavailableError and does not run;
   * 'open' runs the function, for functions with their own guard (a unique constraint).
   */
  onRedisError?: IdempotencyFailureMode
  /** Prepended to every record key. Default `idem:` (the plugin's; the records never meet). */
  keyPrefix?: string
  /** Where failures that are not thrown are reported (a lost lease, a result not stored). Default: nowhere. */
  logger?: IdempotencyLogger
  /** A prom-client registry to count in (`app.metrics.registry` of the metrics plugin). Default: nowhere. */
  registry?: Registry
}

/** The wrapped function: the same arguments, the result (or a replay of it) as a promise. */
export type IdempotentFunction<A extends unknown[], T> = (...args: A) => Promise<T>

const EVICTION_FIX =
  '; or, for a function with a guard of its own that can take an evicted record, pass `allowEviction: true` to makeIdempotent'

const MAX_KEY_LENGTH = 1024
const MAX_NAME_LENGTH = 200
const MAX_WAIT_MS = 3_600_000
/** Canonical JSON of the fingerprinted value, at most (and the bound a cyclic value runs into). */
const MAX_FINGERPRINT_CHARS = 1024 * 1024
const FIRST_POLL_MS = 10
const MAX_POLL_MS = 1000
/** The results of a wrapped function are kept as this status; routes never see these records. */
const RESULT_STATUS = 200
const nowhere: IdempotencyLogger = { warn() {}, error() {} }
/** How long calls wait for a client that is still connecting (a lazy one is connected) before Redis is asked. */
const CONNECT_WAIT_MS = 5000

type AnyFunction = (...args: unknown[]) => unknown
const OF_THE_ARGUMENTS = 'a function of the arguments'
/** A shared option with the words of a function's docs. */
const worded = <O extends AnyOption>(shared: O, doc: string): O => ({ ...shared, doc })

/** makeIdempotent's options, read once per wrapped function (`MakeIdempotentOptions` types them per function). */
export const MAKE_IDEMPOTENT_OPTIONS = declareOptions(
  'makeIdempotent',
  {
    redis: option.required(
      option.redisClient({
        doc: 'an ioredis `Redis` or `Cluster`; never closed; one that may evict any key is refused at the first call',
      }),
    ),
    allowEviction: worded(
      STORE_OPTIONS.allowEviction,
      'run on a Redis whose `maxmemory-policy` may evict (anything but `noeviction`); only for functions with a guard of their own',
    ),
    keyOf: option.required(
      option.function<AnyFunction>({
        type: OF_THE_ARGUMENTS,
        doc: "`(...args) => string, null or undefined`: the call's key",
      }),
    ),
    fingerprintOf: option.function<AnyFunction>({
      type: OF_THE_ARGUMENTS,
      defaultText: 'all the arguments',
      doc: '`(...args) => value`: what the key is bound to',
    }),
    name: option.custom({
      type: `string of at most ${MAX_NAME_LENGTH} characters`,
      default: '',
      defaultText: "`''`",
      read: (value, fail, name) => {
        if (typeof value !== 'string' || value.length > MAX_NAME_LENGTH)
          fail(`\`${name}\` must be a string of at most ${MAX_NAME_LENGTH} characters, got ${shown(value)}`)
        return value as string
      },
      doc: 'names the function: its records and its metrics label',
    }),
    required: option.boolean({
      default: true,
      doc: 'a call without a key throws; `false` runs it unguarded',
    }),
    waitMs: option.integer({
      min: 0,
      max: MAX_WAIT_MS,
      defaultText: '2 × `leaseMs`',
      doc: 'how long a call waits for a running one (0: throw at once)',
    }),
    maxResultBytes: byteCap('larger results are returned, not kept'),
    leaseMs: worded(STORE_OPTIONS.leaseMs, 'exclusive claim, renewed every `leaseMs / 3` while `fn` runs'),
    retentionMs: worded(STORE_OPTIONS.retentionMs, 'how long a result is kept; larger than `leaseMs`'),
    onRedisError: worded(
      STORE_OPTIONS.onRedisError,
      "`'closed'` throws `IdempotencyStoreUnavailableError`; `'open'` runs `fn`",
    ),
    keyPrefix: STORE_OPTIONS.keyPrefix,
    logger: option.custom<IdempotencyLogger>({
      type: 'logger',
      read: (value, fail, name) => {
        const logger = value as Partial<IdempotencyLogger> | null
        if (typeof logger?.warn !== 'function' || typeof logger.error !== 'function')
          fail(`\`${name}\` must have \`warn\` and \`error\` methods, got ${shown(value)}`)
        return value as IdempotencyLogger
      },
      doc: '`{ warn(details, message), error(details, message) }` (`app.log`, pino, `console`): a lost lease, a result not stored or not kept',
    }),
    registry: option.custom<Registry>({
      type: 'prom-client Registry',
      read: (value, fail, name) => {
        const registry = value as Partial<Registry> | null
        if (typeof registry?.getSingleMetric !== 'function' || typeof registry.registerMetric !== 'function')
          fail(`\`${name}\` must be a prom-client Registry, got ${shown(value)}`)
        return value as Registry
      },
      doc: 'a prom-client `Registry` to count in (`app.metrics.registry`)',
    }),
  },
  { hints: IDEMPOTENCY_HINTS, check: checkRetention },
)

// Every option of the public type is declared (a compile error otherwise).
MAKE_IDEMPOTENT_OPTIONS.declarations satisfies Record<keyof MakeIdempotentOptions<unknown[]>, AnyOption>

/** Resolves once the client is ready, or after CONNECT_WAIT_MS; never rejects (the claim then fails on its own). */
async function settleConnection(redis: RedisClient): Promise<void> {
  // Not connected: the claim fails and `onRedisError` decides.
  await withTimeout(connectRedis(redis), CONNECT_WAIT_MS, () => undefined).catch(() => {})
}

/**
 * Wraps `fn` with the route plugin's claim, lease and replay: the first call with a key runs `fn`
 * and keeps its result (as JSON); a later call with the key and the same arguments gets that result
 * without running `fn`; a call while the first still runs waits for it (up to `waitMs`); other
 * arguments under the key throw IdempotencyKeyMismatchError. When `fn` throws, the claim is
 * released (a retry runs again) and the error is rethrown.
 */
export function makeIdempotent<A extends unknown[], T>(
  fn: (...args: A) => T | PromiseLike<T>,
  options: MakeIdempotentOptions<A>,
): IdempotentFunction<A, T> {
  const fail = MAKE_IDEMPOTENT_OPTIONS.checker.fail
  if (typeof fn !== 'function') fail(`\`fn\` must be a function, got ${shown(fn)}`)
  if (typeof options !== 'object' || options === null)
    fail(`\`options\` must be an object with \`redis\` and \`keyOf\`, got ${shown(options)}`)
  const settings = MAKE_IDEMPOTENT_OPTIONS.read(options)
  const { redis, name, required, maxResultBytes, allowEviction, registry } = settings
  const keyOf = settings.keyOf as (...args: A) => string | null | undefined
  const fingerprintOf = settings.fingerprintOf as ((...args: A) => unknown) | undefined
  const logger = settings.logger ?? nowhere
  const waitMs = settings.waitMs ?? 2 * settings.leaseMs

  const store = new IdempotencyStore(redis, settings)
  // Route scopes start with `principal:` or `ip:`: a function's records never meet a route's.
  const scope = `function\n${name}`
  // Counted in `registry` when one is given (a second wrapper of the same name shares its counters).
  const counter = <T extends Counter<string>>(metric: T): T =>
    registry ? adoptMetric(registry, metric) : metric
  const calls = counter(
    new Counter({
      name: 'idempotent_function_calls_total',
      help: 'Calls of functions wrapped with makeIdempotent, by outcome',
      labelNames: ['name', 'outcome'] as const,
      registers: [],
    }),
  )
  const results = counter(
    new Counter({
      name: 'idempotent_function_results_total',
      help: 'What happened to the results of calls that ran the wrapped function',
      labelNames: ['name', 'result'] as const,
      registers: [],
    }),
  )
  // A client that has not connected yet (a lazy one, or one still connecting) is waited for once,
  // by every call that comes meanwhile, as the plugin does at boot; a client that lost Redis is not.
  let connecting: Promise<void> | null = null
  const connection = (): Promise<void> | null => {
    const status = redis.status
    if (status !== 'wait' && status !== 'connecting' && status !== 'connect') return null
    connecting ??= settleConnection(redis).finally(() => {
      connecting = null
    })
    return connecting
  }
  // The server is checked as the plugin checks it at boot (its version, its eviction policy), by
  // the first call that finds the client ready; a refusal rejects that call and every later one
  // before `fn` runs. checkRedisServer needs an app only to log about a client not ready yet,
  // which is never the case here, so the logger stands in for it.
  const logAs = { log: logger } as unknown as FastifyInstance
  let serverChecked: Promise<void> | null = null
  const serverCheck = (): Promise<void> | null => {
    if (serverChecked === null && redis.status === 'ready')
      serverChecked = checkRedisServer(
        logAs,
        redis,
        'idempotency',
        allowEviction ? 'allow' : 'refuse',
        EVICTION_FIX,
      )
    return serverChecked
  }
  const count = (outcome: string) => calls.inc({ name, outcome })
  const tally = (result: string) => results.inc({ name, result })

  const replay = (key: string, response: StoredResponse): T => {
    count('replayed')
    if (!response.body) throw new IdempotencyResultNotKeptError(key)
    // An empty body is a result JSON has no text for (undefined).
    return (response.body.length === 0 ? undefined : JSON.parse(response.body.toString())) as T
  }

  /** Runs fn as the record's owner: keeps its result, or releases the claim when it throws. */
  const run = async (key: string, recordKey: string, token: string, args: A): Promise<T> => {
    const renewal = store.keepAlive(recordKey, token, logger)
    let value: T
    try {
      value = await fn(...args)
    } catch (err) {
      clearInterval(renewal)
      try {
        await store.release(recordKey, token)
        tally('released')
      } catch (releaseErr) {
        // The claim stays until its lease ends; a retry then takes it over.
        tally('release_failed')
        logger.error({ err: releaseErr, key }, 'idempotency claim not released after the function threw')
      }
      throw err
    }
    clearInterval(renewal)
    let body: Buffer | null = null
    try {
      const json = JSON.stringify(value) as string | undefined
      body = json === undefined ? Buffer.alloc(0) : Buffer.from(json)
    } catch (err) {
      logger.warn({ err, key }, 'idempotent function result is not JSON: kept as not replayable')
    }
    if (body && body.length > maxResultBytes) {
      logger.warn({ key, limit: maxResultBytes }, 'idempotent function result too large to keep for replays')
      body = null
    }
    try {
      const owned = await store.complete(recordKey, token, { status: RESULT_STATUS, headers: [], body })
      if (!owned) {
        tally('lost')
        logger.warn({ key }, 'idempotency record not stored: the claim was taken over')
      } else tally(body ? 'stored' : 'not_kept')
    } catch (err) {
      // As for routes: the claim stays until its lease ends, so no retry runs while this result is returned.
      tally('store_failed')
      logger.error({ err, key }, 'idempotency record could not be written')
    }
    return value
  }

  return async function idempotent(...args: A): Promise<T> {
    const key = keyOf(...args)
    if (key === null || key === undefined) {
      if (required) {
        count('missing')
        throw new IdempotencyKeyInvalidError('keyOf returned no key for this call')
      }
      count('unkeyed')
      return fn(...args)
    }
    if (typeof key !== 'string' || key.length === 0 || key.length > MAX_KEY_LENGTH) {
      count('invalid')
      throw new IdempotencyKeyInvalidError(`keyOf must return a string of 1 to ${MAX_KEY_LENGTH} characters`)
    }
    let fingerprint: string
    try {
      fingerprint = valueFingerprint(fingerprintOf ? fingerprintOf(...args) : args, MAX_FINGERPRINT_CHARS)
    } catch (err) {
      if (!(err instanceof FingerprintTooLargeError)) throw err
      throw new IdempotencyFingerprintTooLargeError(
        `makeIdempotent: the fingerprinted value is over ${MAX_FINGERPRINT_CHARS} characters of JSON (or cyclic); pass a \`fingerprintOf\` returning less`,
      )
    }
    const recordKey = store.recordKey(scope, key)
    const token = ownerToken()
    const pending = connection()
    if (pending) await pending
    const checking = serverCheck()
    if (checking) await checking
    const deadline = Date.now() + waitMs
    let poll = FIRST_POLL_MS
    for (;;) {
      let claim: Awaited<ReturnType<IdempotencyStore['claim']>>
      try {
        claim = await store.claim(recordKey, fingerprint, token)
      } catch (err) {
        logger.warn({ err, key }, 'idempotency store unavailable')
        count('unavailable')
        if (settings.onRedisError === 'closed') throw new IdempotencyStoreUnavailableError(key, err)
        return fn(...args)
      }
      switch (claim.kind) {
        case 'mismatch':
          count('mismatch')
          throw new IdempotencyKeyMismatchError(key)
        case 'replay':
          return replay(key, claim.response)
        case 'conflict': {
          const left = deadline - Date.now()
          if (left <= 0) {
            count('in_flight')
            throw new IdempotencyInFlightError(key, claim.retryAfterMs)
          }
          // Jittered, so the callers waiting on one key do not ask Redis in lockstep; never past
          // the end of the owner's lease (a crashed owner is taken over then) or the wait.
          const jittered = poll / 2 + Math.random() * (poll / 2)
          await sleep(Math.max(1, Math.min(jittered, claim.retryAfterMs + 1, left)))
          poll = Math.min(poll * 2, MAX_POLL_MS)
          continue
        }
        default:
          count(claim.kind)
          return run(key, recordKey, token, args)
      }
    }
  }
}
