/**
 * What the gateway's data and domain layers throw when they refuse a request or cannot serve it:
 * a code and a detail, no HTTP. The HTTP layer turns each code into its problem response (one table,
 * src/errors.ts); the code is the problem's slug.
 */
export type DomainErrorCode = RefusalCode | 'database-unavailable'

/** The request cannot be done as it stands: retrying it unchanged is refused again. */
export type RefusalCode = 'same-account' | 'account-not-found' | 'currency-mismatch' | 'insufficient-funds'

const REFUSAL_CODES: ReadonlySet<DomainErrorCode> = new Set<RefusalCode>([
  'same-account',
  'account-not-found',
  'currency-mismatch',
  'insufficient-funds',
])

export class DomainError extends Error {
  readonly code: DomainErrorCode

  /** `detail` says what happened to this request; it is sent to the client as the problem's detail. */
  constructor(code: DomainErrorCode, detail: string) {
    super(detail)
    this.name = 'DomainError'
    this.code = code
  }
}

/** A refusal, as opposed to a dependency that is not answering (where a retry may succeed). */
export const isRefusal = (err: unknown): err is DomainError =>
  err instanceof DomainError && REFUSAL_CODES.has(err.code)
