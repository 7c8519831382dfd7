import type { FastifyError, FastifyInstance } from 'fastify'
import { HttpProblem, PROBLEM_CONTENT_TYPE, sendProblem } from 'fastify-redis-gateway'
import { DomainError, type DomainErrorCode } from './domain-error.ts'
import type { DescribeRefusal } from './ledger/ledger.ts'

export { HttpProblem, PROBLEM_CONTENT_TYPE }

// Problems are RFC 9457 problem details; every `type` is a relative URI under /problems/, documented
// in docs/demo/problems.md and served at that URI (src/routes/problem-types.ts, src/routes/problems.ts).

/** Fastify's own client errors (bad JSON, body limit, ...) as problems: status -> [slug, title]. */
export const FASTIFY_PROBLEMS: Readonly<Record<number, readonly [string, string]>> = {
  400: ['bad-request', 'Bad request'],
  401: ['unauthenticated', 'Authentication required'],
  404: ['not-found', 'Not found'],
  405: ['method-not-allowed', 'Method not allowed'],
  406: ['not-acceptable', 'Not acceptable'],
  413: ['payload-too-large', 'Payload too large'],
  415: ['unsupported-media-type', 'Unsupported media type'],
  431: ['headers-too-large', 'Request header fields too large'],
}
/** Any other client error Fastify raises. */
const FASTIFY_OTHER_CLIENT_ERROR = ['client-error', 'Client error'] as const

/**
 * What each domain error answers: its code is the problem's slug, with the status and title of that
 * problem type (src/routes/problem-types.ts, the table behind docs/demo/problems.md; the test of that
 * table checks these against it) and the error's detail.
 */
const DOMAIN_PROBLEMS: Readonly<Record<DomainErrorCode, (detail: string) => HttpProblem>> = {
  'same-account': (detail) => new HttpProblem(400, 'same-account', 'Same account', detail),
  'account-not-found': (detail) => new HttpProblem(404, 'account-not-found', 'Account not found', detail),
  'currency-mismatch': (detail) => new HttpProblem(422, 'currency-mismatch', 'Currency mismatch', detail),
  'insufficient-funds': (detail) => new HttpProblem(422, 'insufficient-funds', 'Insufficient funds', detail),
  // Nothing was changed and a retry may succeed: clients wait a little before it.
  'database-unavailable': (detail) =>
    new HttpProblem(503, 'database-unavailable', 'Service unavailable', detail, {
      headers: { 'retry-after': '2' },
    }),
}

const domainProblem = (error: DomainError): HttpProblem => DOMAIN_PROBLEMS[error.code](error.message)

/** A scheduled transfer's refusal as recorded on its schedule: the problem it would have answered. */
export const scheduleFailureOf: DescribeRefusal = (refusal) => {
  const problem = domainProblem(refusal)
  return { type: problem.type, title: problem.title, detail: problem.message }
}

/**
 * Turns what a request throws into a problem: domain errors by their code, Fastify's own 4xx errors
 * (validation, bad JSON, body limit) by status; hides 5xx internals.
 */
export function toProblem(error: FastifyError | HttpProblem | DomainError): HttpProblem {
  if (error instanceof HttpProblem) return error
  if (error instanceof DomainError) return domainProblem(error)
  if (error.validation) {
    return new HttpProblem(400, 'validation', 'Invalid request', error.message)
  }
  const status = error.statusCode ?? 500
  if (status >= 400 && status < 500) {
    const [slug, title] = FASTIFY_PROBLEMS[status] ?? FASTIFY_OTHER_CLIENT_ERROR
    return new HttpProblem(status, slug, title, error.message)
  }
  return new HttpProblem(
    500,
    'internal',
    'Internal server error',
    'The server could not complete the request.',
  )
}

export function registerProblemHandlers(app: FastifyInstance): void {
  app.setErrorHandler((error: FastifyError, request, reply) => {
    const problem = toProblem(error)
    if (problem.status >= 500) request.log.error({ err: error }, 'request failed')
    return sendProblem(reply, problem)
  })
  app.setNotFoundHandler((request, reply) =>
    sendProblem(
      reply,
      new HttpProblem(404, 'not-found', 'Not found', `No route for ${request.method} ${request.url}`),
    ),
  )
}
