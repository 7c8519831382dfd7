// Every error the library throws carries a stable `code` (as fastify's own errors do) and a class a
// caller can test with `instanceof`; every problem a plugin sends carries the same kind of code in
// its body. docs/errors.md lists them all (a test keeps the two in step).

/** The base class of the library's own errors. */
export class GatewayError extends Error {
  readonly code: string

  constructor(code: string, message: string, options?: ErrorOptions) {
    super(message, options)
    this.name = new.target.name
    this.code = code
  }
}

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

/** The `redis` value is not an ioredis client (or none was given and no redis plugin is registered). */
export class RedisClientError extends GatewayError {
  constructor(message: string) {
    super('FRG_REDIS_CLIENT_INVALID', message)
  }
}

/** The redis plugin could not connect; `cause` is the connection's last error. */
export class RedisConnectionError extends GatewayError {
  readonly address: string

  constructor(message: string, address: string, options?: ErrorOptions) {
    super('FRG_REDIS_UNREACHABLE', message, options)
    this.address = address
  }
}

/** The Redis server cannot keep a plugin's guarantee: too old for its scripts, or set to evict any key. */
export class RedisServerError extends GatewayError {
  constructor(code: 'FRG_REDIS_VERSION' | 'FRG_REDIS_EVICTION_POLICY', message: string) {
    super(code, message)
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
