import { type TSchema, Type } from 'typebox'
import { Problem } from '../errors.ts'

/** Postgres `integer` ids: anything larger is rejected at the edge instead of failing in SQL. */
export const Id = Type.Integer({ minimum: 1, maximum: 2_147_483_647 })
/** Path parameters arrive as text; digits only, so the cast to integer is exact. */
export const IdParam = Type.String({ pattern: '^[1-9][0-9]{0,9}$', maxLength: 10 })
export const Amount = Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER })
export const Currency = Type.String({ pattern: '^[A-Z]{3}$', minLength: 3, maxLength: 3 })
export const Timestamp = Type.String({ format: 'date-time' })

export const Account = Type.Object({
  accountId: Id,
  currency: Currency,
  balance: Type.Integer({ minimum: 0 }),
})

/** The same problem schema for each listed error status. */
export function problems(...statuses: number[]): Record<number, TSchema> {
  return Object.fromEntries(statuses.map((status) => [status, Problem]))
}
