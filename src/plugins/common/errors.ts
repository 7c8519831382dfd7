import { GatewayError } from '../../redis/errors.ts'

export {
  GatewayError,
  GatewayRangeError,
  GatewayTypeError,
  gatewayErrorOver,
  RedisClientError,
  RedisConnectionError,
  RedisServerError,
} from '../../redis/errors.ts'

/** An option, a policy or a route config has a value the library cannot use. Fix the code; never retry. */
export class InvalidOptionError extends GatewayError {
  constructor(message: string, code = 'FRG_INVALID_OPTION') {
    super(code, message)
  }
}

/** An options object holds a key the library does not know (a typo, or another library's name). */
export class UnknownOptionError extends InvalidOptionError {
  readonly option: string
  readonly validOptions: readonly string[]

  constructor(message: string, option: string, validOptions: readonly string[]) {
    super(message, 'FRG_UNKNOWN_OPTION')
    this.option = option
    this.validOptions = validOptions
  }
}

/** A route asks for a plugin's protection (its config) that no registered plugin gives it. */
export class RouteNotProtectedError extends GatewayError {
  readonly method: string
  readonly url: string

  constructor(message: string, method: string, url: string) {
    super('FRG_ROUTE_NOT_PROTECTED', message)
    this.method = method
    this.url = url
  }
}

/**
 * The code in the body of each problem a plugin sends, by the problem's slug (its `type` is
 * `/problems/<slug>`). An app's own problems have none.
 */
export const PROBLEM_CODES: Readonly<Record<string, string>> = {
  'rate-limited': 'FRG_RATE_LIMITED',
  'rate-limit-banned': 'FRG_RATE_LIMIT_BANNED',
  'rate-limit-unavailable': 'FRG_RATE_LIMIT_UNAVAILABLE',
  'rate-limit-error': 'FRG_RATE_LIMIT_NOT_CHECKED',
  'idempotency-key-missing': 'FRG_IDEMPOTENCY_KEY_MISSING',
  'idempotency-key-invalid': 'FRG_IDEMPOTENCY_KEY_INVALID',
  'idempotency-key-in-flight': 'FRG_IDEMPOTENCY_IN_FLIGHT',
  'idempotency-key-mismatch': 'FRG_IDEMPOTENCY_KEY_MISMATCH',
  'idempotency-principal-required': 'FRG_IDEMPOTENCY_PRINCIPAL_REQUIRED',
  'idempotency-response-not-kept': 'FRG_IDEMPOTENCY_RESULT_NOT_KEPT',
  'idempotency-store-unavailable': 'FRG_IDEMPOTENCY_STORE_UNAVAILABLE',
  'session-store-unavailable': 'FRG_SESSION_STORE_UNAVAILABLE',
  unauthenticated: 'FRG_SESSION_REQUIRED',
}
