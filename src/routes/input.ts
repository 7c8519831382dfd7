import type { FastifyInstance, preValidationHookHandler } from 'fastify'
import { HttpProblem } from '../errors.ts'

// Postgres text cannot hold NUL, and a lone UTF-16 surrogate has no UTF-8 form (it would be stored
// as U+FFFD, another string than the one sent). Both are refused before any handler runs.
// biome-ignore lint/suspicious/noControlCharactersInRegex: NUL is one of the characters refused here
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** True when some string in `value` (a value or a field name) could not be stored as sent; no recursion. */
function holdsUnstorable(value: unknown): boolean {
  if (typeof value === 'string') return UNSTORABLE.test(value)
  if (value === null || typeof value !== 'object') return false
  const pending: object[] = [value]
  while (pending.length > 0) {
    const next = pending.pop() as Record<string, unknown>
    for (const field in next) {
      if (!Object.hasOwn(next, field)) continue
      if (UNSTORABLE.test(field)) return true
      const item = next[field]
      if (typeof item === 'string') {
        if (UNSTORABLE.test(item)) return true
      } else if (item !== null && typeof item === 'object') pending.push(item)
    }
  }
  return false
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
    const readIntegers: preValidationHookHandler = (request, _reply, done) => {
      const params = request.params as Record<string, unknown>
      for (const name of names) {
        const value = params[name]
        if (typeof value === 'string' && PLAIN_INTEGER.test(value)) params[name] = Number(value)
      }
      done()
    }
    route.preValidation = [readIntegers, ...[route.preValidation ?? []].flat()]
  })
}

/** Every route: a body, query or parameter with NUL or a lone surrogate is a 400 problem. */
export function refuseUnstorableText(app: FastifyInstance): void {
  app.addHook('preValidation', (request, _reply, done) => {
    if (holdsUnstorable(request.body) || holdsUnstorable(request.query) || holdsUnstorable(request.params))
      done(
        new HttpProblem(
          400,
          'validation',
          'Invalid request',
          'Strings must not contain NUL characters or unpaired UTF-16 surrogates.',
        ),
      )
    else done()
  })
}
