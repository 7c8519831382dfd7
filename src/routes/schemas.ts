import { Type } from 'typebox'

/** Postgres `integer` ids: anything larger is rejected at the edge instead of failing in SQL. */
export const Id = Type.Integer({ minimum: 1, maximum: 2_147_483_647 })
/** Path parameters arrive as text; digits only, so the cast to integer is exact. */
export const IdParam = Type.String({
  pattern: '^[1-9][0-9]{0,9}$',
  maxLength: 10,
  description: 'An account id: 1 to 10 digits, no leading zero (an id beyond 2147483647 answers 404).',
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
