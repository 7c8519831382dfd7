import { GatewayError, GatewayTypeError } from '../common/errors.ts'

// What a function wrapped with makeIdempotent throws instead of running (or of returning a result).
// Each has its own class and `code`, so a job runner can tell "retry later" from "never retry".

export type IdempotencyErrorCode =
  | 'FRG_IDEMPOTENCY_KEY_INVALID'
  | 'FRG_IDEMPOTENCY_KEY_MISMATCH'
  | 'FRG_IDEMPOTENCY_IN_FLIGHT'
  | 'FRG_IDEMPOTENCY_RESULT_NOT_KEPT'
  | 'FRG_IDEMPOTENCY_STORE_UNAVAILABLE'

/** The base class: `key` is the key the call was made with (null when it had none). */
export class IdempotencyError extends GatewayError {
  declare readonly code: IdempotencyErrorCode
  readonly key: string | null

  constructor(code: IdempotencyErrorCode, key: string | null, message: string, options?: ErrorOptions) {
    super(code, message, options)
    this.key = key
  }
}

/** `keyOf` returned no key (and `required` is true), or something that is not a key. Never retry as is. */
export class IdempotencyKeyInvalidError extends IdempotencyError {
  constructor(message: string) {
    super('FRG_IDEMPOTENCY_KEY_INVALID', null, message)
  }
}

/** The key was already used with other arguments (another fingerprint). Never retry: use a new key. */
export class IdempotencyKeyMismatchError extends IdempotencyError {
  constructor(key: string) {
    super(
      'FRG_IDEMPOTENCY_KEY_MISMATCH',
      key,
      'This idempotency key was already used with different arguments',
    )
  }
}

/** Another call with the key still runs after `waitMs`; retry after `retryAfterMs` (the rest of its lease). */
export class IdempotencyInFlightError extends IdempotencyError {
  readonly retryAfterMs: number

  constructor(key: string, retryAfterMs: number) {
    super('FRG_IDEMPOTENCY_IN_FLIGHT', key, 'A call with this idempotency key is still running')
    this.retryAfterMs = retryAfterMs
  }
}

/** The call with this key ran, but its result was over `maxResultBytes` or not JSON: it is not run again. */
export class IdempotencyResultNotKeptError extends IdempotencyError {
  constructor(key: string) {
    super(
      'FRG_IDEMPOTENCY_RESULT_NOT_KEPT',
      key,
      'The call with this idempotency key ran, but its result was not kept for replays',
    )
  }
}

/** Redis could not be asked and `onRedisError` is 'closed': the function did not run. `cause` is Redis's error. */
export class IdempotencyStoreUnavailableError extends IdempotencyError {
  constructor(key: string, cause: unknown) {
    super('FRG_IDEMPOTENCY_STORE_UNAVAILABLE', key, 'Idempotency keys cannot be checked now', { cause })
  }
}

/**
 * What a call's fingerprint is made of (`fingerprintOf`'s value, or all the arguments) is over
 * 1 MiB of JSON, or cyclic: `fn` did not run. A TypeError, as a wrong argument is; never retry as is.
 */
export class IdempotencyFingerprintTooLargeError extends GatewayTypeError {
  readonly code = 'FRG_IDEMPOTENCY_FINGERPRINT_TOO_LARGE'

  constructor(message: string) {
    super(message)
    this.name = new.target.name
  }
}
