import { GatewayError, GatewayTypeError, InvalidOptionError } from '../common/errors.ts'

/**
 * A policy could not be applied to one request: one of its functions threw or returned what
 * cannot be counted. The route's bug, answered 500 for that request only; never taken for a
 * Redis outage.
 */
export class RateLimitError extends GatewayError {
  readonly policies: string[]

  constructor(policies: string[], message: string, cause?: unknown) {
    super('FRG_RATE_LIMIT_NOT_CHECKED', `rate limit: policy '${policies.join("', '")}': ${message}`, {
      cause,
    })
    this.policies = policies
  }
}

/** A route, `peek`, `consume`, `reset` or `block` names a policy the plugin does not have. */
export class RateLimitUnknownPolicyError extends InvalidOptionError {
  readonly policy: string

  constructor(message: string, policy: string) {
    super(message, 'FRG_RATE_LIMIT_UNKNOWN_POLICY')
    this.policy = policy
  }
}

/** One policy name with two sets of settings: one name is one counter, so it cannot have two. */
export class RateLimitPolicyConflictError extends InvalidOptionError {
  readonly policy: string

  constructor(message: string, policy: string) {
    super(message, 'FRG_RATE_LIMIT_POLICY_CONFLICT')
    this.policy = policy
  }
}

/** The plugin is registered but limits nothing: no policy anywhere, once the app is ready. */
export class RateLimitNoPolicyError extends InvalidOptionError {
  constructor(message: string) {
    super(message, 'FRG_RATE_LIMIT_NO_POLICY')
  }
}

/**
 * A wrong argument to `app.rateLimiter.consume`, `reset` or `block` (an empty key, a fractional
 * cost, a missing request, a block on a policy without `blockMs`). A TypeError, as these calls
 * always threw, with the code every option error has.
 */
export class RateLimitArgumentError extends GatewayTypeError {
  readonly code = 'FRG_INVALID_OPTION'

  constructor(message: string) {
    super(message)
    this.name = 'RateLimitArgumentError'
  }
}
