import { Type } from 'typebox'

/** Postgres `integer` ids: anything larger is rejected at the edge instead of failing in SQL. */
export const Id = Type.Integer({ minimum: 1, maximum: 2_147_483_647 })
/**
 * An account id in a path: an integer like in bodies (a generated client passes the same value).
 * Read from the path's text only when written plainly (readIntegerParams); up to 10 digits, so an
 * id beyond Postgres integer is still an id, of no account (404).
 */
export const IdParam = Type.Integer({
  minimum: 1,
  maximum: 9_999_999_999,
  description:
    'An account id, in the path as digits without a leading zero (an id beyond 2147483647 answers 404).',
})
export const Amount = Type.Integer({
  minimum: 1,
  maximum: Number.MAX_SAFE_INTEGER,
  description: "In the currency's minor unit (VND has none: 1 is one dong).",
})
export const Currency = Type.String({
  pattern: '^[A-Z]{3}$',
  minLength: 3,
  maxLength: 3,
  description: 'ISO 4217 code',
})
export const Timestamp = Type.String({ format: 'date-time', description: 'ISO 8601, UTC, milliseconds' })

export const Account = Type.Object({
  accountId: Id,
  currency: Currency,
  balance: Type.Integer({ minimum: 0, description: "In the currency's minor unit." }),
})
