import type { FastifyRequest } from 'fastify'
import { HttpProblem } from '../common/problem.ts'
import { SessionNotRegisteredError } from './errors.ts'
import type { Session } from './session.ts'
import { sessionStoreUnavailable } from './unavailable.ts'

/** The 401 a request without a signed-in session gets where one is required. */
export const unauthenticated = () =>
  new HttpProblem(401, 'unauthenticated', 'Authentication required', 'Log in first.')

/**
 * The request's signed-in session, typed as present: on a route with `config: { session:
 * 'required' }` it always is (the plugin answered 401 before the handler otherwise). Elsewhere,
 * without one, it throws what such a route answers: the 401 `unauthenticated` problem (an anonymous
 * session does not count), or the 503 `session-store-unavailable` one when Redis could not load the
 * presented session. Throws SessionNotRegisteredError where the session plugin never ran.
 */
export function requireSession(request: FastifyRequest): Session {
  const session = request.session as Session | null | undefined
  if (session?.principal) return session
  if (session === undefined)
    throw new SessionNotRegisteredError(
      `requireSession: no session plugin ran for ${request.method} ${request.url}: register the session plugin before this route, in its context or a parent of it`,
    )
  throw request.sessionUnavailable ? sessionStoreUnavailable() : unauthenticated()
}
