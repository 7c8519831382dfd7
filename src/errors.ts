import type { FastifyError, FastifyInstance } from 'fastify'
import { DomainError, type DomainErrorCode } from './domain-error.ts'
import { HttpProblem, PROBLEM_CONTENT_TYPE, sendProblem } from './index.ts'
import type { ScheduleFailure } from './ledger/ledger.ts'
import { type ProblemSlug, problemType } from './routes/problem-types.ts'

export { HttpProblem, PROBLEM_CONTENT_TYPE }

// Problems are RFC 9457 problem details; every `type` is a relative URI under /problems/, documented
// in docs/problems.md and served at that URI (src/routes/problem-types.ts, src/routes/problems.ts).

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

/** Headers a domain error's problem carries: when to retry a dependency that is not answering. */
const DOMAIN_PROBLEM_HEADERS: Partial<Record<DomainErrorCode, Record<string, string>>> = {
  'database-unavailable': { 'retry-after': '2' },
}

/**
 * The problem a domain error answers: its code is the problem's slug, and the status and title are
 * that problem type's (src/routes/problem-types.ts, the table behind docs/problems.md).
 */
export function domainProblem(error: DomainError): HttpProblem {
  // `satisfies`: a domain code without its problem type fails the type check.
  const type = problemType(error.code satisfies ProblemSlug)
  if (!type || typeof type.status !== 'number') throw new Error(`no problem type for ${error.code}`)
  return new HttpProblem(type.status, error.code, type.title, error.message, {
    headers: DOMAIN_PROBLEM_HEADERS[error.code],
  })
}

/** A scheduled transfer's refusal as recorded on its schedule: the problem it would have answered. */
export function scheduleFailureOf(refusal: DomainError): ScheduleFailure {
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
