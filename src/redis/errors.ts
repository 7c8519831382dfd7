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
