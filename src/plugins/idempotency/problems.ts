import { HttpProblem } from '../common/problem.ts'
import { MAX_REQUEST_KEY_LENGTH } from './key.ts'

// Each outcome has its own problem type, so clients can tell "retry later" from "never retry".

/** `orFromRequest`: the route also reads the key from the request (`keyFrom`). */
export const keyMissing = (header: string, orFromRequest = false) =>
  new HttpProblem(
    400,
    'idempotency-key-missing',
    'Idempotency key required',
    orFromRequest
      ? `Send an ${header} header, or the key where this route reads it from the request.`
      : `Send an ${header} header.`,
  )

/** `header`: the header the key came from, null when it came from the request (`keyFrom`). */
export const keyInvalid = (header: string | null) =>
  new HttpProblem(
    400,
    'idempotency-key-invalid',
    'Invalid idempotency key',
    `${header ?? 'The idempotency key'} must be a key of 1 to ${MAX_REQUEST_KEY_LENGTH} characters: an RFC 8941 string ("order 42": printable ASCII, \\" and \\\\ escaped) or bare visible ASCII (order-42). An empty string is not a key.`,
  )

export const principalRequired = () =>
  new HttpProblem(
    401,
    'idempotency-principal-required',
    'Authentication required',
    'Idempotency keys are kept per caller on this route; authenticate to use one.',
  )

export const keyInFlight = (retryAfterSeconds: number) =>
  new HttpProblem(
    409,
    'idempotency-key-in-flight',
    'Request in progress',
    'A request with this key is still being processed; retry after the given delay.',
    { headers: { 'retry-after': String(retryAfterSeconds) } },
  )

export const keyMismatch = () =>
  new HttpProblem(
    422,
    'idempotency-key-mismatch',
    'Idempotency key reused',
    'This key was already used with a different request; use a new key for a new request.',
  )

export const storeUnavailable = () =>
  new HttpProblem(
    503,
    'idempotency-store-unavailable',
    'Service unavailable',
    'Idempotency keys cannot be checked now.',
    { headers: { 'retry-after': '1' } },
  )

export const responseNotKept = (status: number) =>
  new HttpProblem(
    410,
    'idempotency-response-not-kept',
    'Response not kept',
    `The request with this key was processed (status ${status}), but its response exceeded the size kept for replays.`,
    { extra: { originalStatus: String(status) } },
  )
