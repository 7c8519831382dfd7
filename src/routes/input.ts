import type { FastifyInstance, preValidationHookHandler } from 'fastify'
import { HttpProblem } from '../errors.ts'

// Postgres text cannot hold NUL, and a lone UTF-16 surrogate has no UTF-8 form (it would be stored
// as U+FFFD, another string than the one sent). Both are refused before any handler runs.
// biome-ignore lint/suspicious/noControlCharactersInRegex: NUL is one of the characters refused here
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** The first string (a value or a field name) Postgres could not store as sent; no recursion. */
function findUnstorable(value: unknown): string | null {
  const pending: unknown[] = [value]
  while (pending.length > 0) {
    const next = pending.pop()
    if (typeof next === 'string') {
      if (UNSTORABLE.test(next)) return next
    } else if (next !== null && typeof next === 'object') {
      for (const [field, item] of Object.entries(next)) {
        if (UNSTORABLE.test(field)) return field
        pending.push(item)
      }
    }
  }
  return null
}

// At most 15 digits: exact as a number. No sign, no leading zero: one spelling per id.
const PLAIN_INTEGER = /^[1-9][0-9]{0,14}$/

/**
 * Path parameters arrive as text and the validator coerces nothing (a body's "10" is no amount).
 * A parameter its route declares an integer becomes one before validation when written plainly;
 * anything else (`010`, `0x10`, `1e3`, ` 1`) stays text and fails the schema: a 400, never an alias.
 * Called before the routes are registered.
 */
export function readIntegerParams(app: FastifyInstance): void {
  app.addHook('onRoute', (route) => {
    const schema = route.schema?.params as { properties?: Record<string, { type?: unknown }> } | undefined
    const names = Object.entries(schema?.properties ?? {})
      .filter(([, property]) => property.type === 'integer')
      .map(([name]) => name)
    if (names.length === 0) return
    const readIntegers: preValidationHookHandler = async (request) => {
      const params = request.params as Record<string, unknown>
      for (const name of names) {
        const value = params[name]
        if (typeof value === 'string' && PLAIN_INTEGER.test(value)) params[name] = Number(value)
      }
    }
    route.preValidation = [readIntegers, ...[route.preValidation ?? []].flat()]
  })
}

/** Every route: a body, query or parameter with NUL or a lone surrogate is a 400 problem. */
export function refuseUnstorableText(app: FastifyInstance): void {
  app.addHook('preValidation', async (request) => {
    if (findUnstorable([request.body, request.query, request.params]) !== null) {
      throw new HttpProblem(
        400,
        'validation',
        'Invalid request',
        'Strings must not contain NUL characters or unpaired UTF-16 surrogates.',
      )
    }
  })
}
