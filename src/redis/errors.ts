// Every error the library throws carries a stable `code` (as fastify's own errors do) and a class a
// caller can test with `instanceof`; every problem a plugin sends carries the same kind of code in
// its body. docs/errors.md lists them all (a test keeps the two in step).
//
// Every library error is a GatewayError, whatever built-in it extends:
//   class MyError extends GatewayError { constructor(m: string) { super(<code>, m) } }
//   class MyTypeError extends GatewayTypeError { readonly code = <code> }   // still a TypeError
// `err instanceof GatewayError` holds for both (a brand on the prototype, checked by
// GatewayError[Symbol.hasInstance]); `err instanceof TypeError` holds for the second.

/** Set on the prototype of every library error class; what `instanceof GatewayError` checks. */
const GATEWAY_ERROR = Symbol.for('fastify-redis-gateway.error')

/** The base class of the library's own errors; `instanceof` it holds for every one of them. */
export class GatewayError extends Error {
  readonly code: string

  constructor(code: string, message: string, options?: ErrorOptions) {
    super(message, options)
    this.name = new.target.name
    this.code = code
  }

  /** True for every library error, including those over TypeError or RangeError (`gatewayErrorOver`). */
  static override [Symbol.hasInstance](value: unknown): boolean {
    // `this` is the class on the right of `instanceof`: a subclass keeps the usual prototype check.
    // biome-ignore lint/complexity/noThisInStatic: inherited by every subclass, so `this` is not GatewayError there.
    if (this !== GatewayError) return Function.prototype[Symbol.hasInstance].call(this, value)
    return typeof value === 'object' && value !== null && GATEWAY_ERROR in value
  }
}
Object.defineProperty(GatewayError.prototype, GATEWAY_ERROR, { value: true })

// biome-ignore lint/suspicious/noExplicitAny: a mixin's base takes any constructor arguments.
type ErrorClass = new (...args: any[]) => Error

/**
 * A base class over a built-in error (`TypeError`, `RangeError`, `Error`) whose instances are
 * GatewayErrors too. Subclasses set their `code` (`readonly code = 'FRG_...'`); `name` stays the
 * built-in's unless the subclass sets it.
 */
export function gatewayErrorOver<B extends ErrorClass>(Base: B) {
  class Coded extends Base {}
  Object.defineProperty(Coded.prototype, GATEWAY_ERROR, { value: true })
  return Coded
}

/** A TypeError (a wrong argument in the calling code) that is a GatewayError with a code. */
export const GatewayTypeError = gatewayErrorOver(TypeError)
/** A RangeError (a value out of its bounds) that is a GatewayError with a code. */
export const GatewayRangeError = gatewayErrorOver(RangeError)

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
