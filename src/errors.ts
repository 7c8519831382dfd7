import { type Static, Type } from '@sinclair/typebox'
import type { FastifyError, FastifyInstance, FastifyReply } from 'fastify'

/** RFC 9457 problem details; `type` is a relative URI under /problems/ documented in the README. */
export const Problem = Type.Object(
  {
    type: Type.String(),
    title: Type.String(),
    status: Type.Integer(),
    detail: Type.String(),
    instance: Type.Optional(Type.String()),
    policy: Type.Optional(Type.String()),
  },
  { description: 'RFC 9457 problem details' },
)
export type Problem = Static<typeof Problem>

export const PROBLEM_CONTENT_TYPE = 'application/problem+json; charset=utf-8'

/** An error that the error handler turns into a problem+json response as it is. */
export class HttpProblem extends Error {
  readonly status: number
  readonly type: string
  readonly title: string
  readonly headers: Record<string, string>
  readonly extra: Record<string, string>

  constructor(
    status: number,
    slug: string,
    title: string,
    detail: string,
    options: { headers?: Record<string, string>; extra?: Record<string, string> } = {},
  ) {
    super(detail)
    this.status = status
    this.type = `/problems/${slug}`
    this.title = title
    this.headers = options.headers ?? {}
    this.extra = options.extra ?? {}
  }

  toJSON(): Problem {
    return { type: this.type, title: this.title, status: this.status, detail: this.message, ...this.extra }
  }
}

export function sendProblem(reply: FastifyReply, problem: HttpProblem): FastifyReply {
  return reply.code(problem.status).headers(problem.headers).type(PROBLEM_CONTENT_TYPE).send(problem.toJSON())
}

const GENERIC: Record<number, [string, string]> = {
  400: ['bad-request', 'Bad request'],
  401: ['unauthenticated', 'Authentication required'],
  404: ['not-found', 'Not found'],
  405: ['method-not-allowed', 'Method not allowed'],
  406: ['not-acceptable', 'Not acceptable'],
  413: ['payload-too-large', 'Payload too large'],
  415: ['unsupported-media-type', 'Unsupported media type'],
  431: ['headers-too-large', 'Request header fields too large'],
}

/** Converts Fastify's own 4xx errors (validation, bad JSON, body limit) to problems; hides 5xx internals. */
export function toProblem(error: FastifyError | HttpProblem): HttpProblem {
  if (error instanceof HttpProblem) return error
  if (error.validation) {
    return new HttpProblem(400, 'validation', 'Invalid request', error.message)
  }
  const status = error.statusCode ?? 500
  if (status >= 400 && status < 500) {
    const [slug, title] = GENERIC[status] ?? ['client-error', 'Client error']
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
