import type { FastifyInstance } from 'fastify'
import { HttpProblem, sendProblem } from '../../src/index.ts'

// What the library's suites build their apps with: a plain Fastify app, the plugins under test and a
// few routes, on Redis alone (never the demo gateway, which needs Postgres).

/**
 * The error handler a user of the package writes: an HttpProblem a route throws (an
 * `idempotencyKeyMismatch()`, a session's 503) is answered as application/problem+json; anything
 * else as Fastify would.
 */
export function answerProblems(app: FastifyInstance): void {
  app.setErrorHandler((error, _request, reply) =>
    error instanceof HttpProblem ? sendProblem(reply, error) : reply.send(error),
  )
}
