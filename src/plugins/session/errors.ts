import { GatewayError, GatewayRangeError, GatewayTypeError } from '../common/errors.ts'

// What the session API throws to its caller for a wrong argument. They extend TypeError and
// RangeError (through GatewayTypeError / GatewayRangeError, so they are GatewayErrors too) (a caller's `instanceof TypeError` and `err.name` still hold), and
// carry a stable `code` and a class of their own.

/** A field name that is malformed (1-64 of `A-Z a-z 0-9 _ . : -`) or reserved for the store. */
export class SessionFieldNameError extends GatewayTypeError {
  readonly code = 'FRG_SESSION_FIELD_NAME_INVALID'
}

/** A field value JSON would not give back unchanged (undefined, a Date, a Map, NaN, a bigint, ...). */
export class SessionValueError extends GatewayTypeError {
  readonly code = 'FRG_SESSION_VALUE_NOT_JSON'
}

/** A field over MAX_FIELD_BYTES, or the session's fields together over MAX_SESSION_BYTES. */
export class SessionTooLargeError extends GatewayRangeError {
  readonly code = 'FRG_SESSION_TOO_LARGE'
}

/** A login's principal that is not a string of 1-128 characters. */
export class SessionPrincipalError extends GatewayTypeError {
  readonly code = 'FRG_SESSION_PRINCIPAL_INVALID'
}

/** `requireSession` was called on a request the session plugin never saw (not registered, or not in this context). */
export class SessionNotRegisteredError extends GatewayError {
  constructor(message: string) {
    super('FRG_SESSION_NOT_REGISTERED', message)
  }
}

/**
 * A per-session lifetime (`regenerateSession`'s or `create`'s `lifetime`) that is not an object of
 * positive whole milliseconds within the plugin's `maxIdleTimeoutMs` / `maxAbsoluteTimeoutMs`, or an
 * absolute lifetime shorter than the idle one.
 */
export class SessionLifetimeError extends GatewayRangeError {
  readonly code = 'FRG_SESSION_LIFETIME_INVALID'
}

/** A session handle (`listSessions`' `handle`) that is not a string of 22 base64url characters. */
export class SessionHandleError extends GatewayTypeError {
  readonly code = 'FRG_SESSION_HANDLE_INVALID'
}
