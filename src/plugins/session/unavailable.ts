import { HttpProblem } from '../common/problem.ts'

// When Redis cannot be asked, every session operation fails the same way: a 503 with Retry-After,
// never a 500 carrying the driver's message.

/** Server states that pass on their own (loading, failover, a busy script, memory full): worth a retry. */
const TRANSIENT_REPLY = /^(LOADING|BUSY|CLUSTERDOWN|MASTERDOWN|TRYAGAIN|READONLY|NOREPLICAS|OOM) /
/** ioredis' own messages when it cannot reach Redis or a reply does not come in time. */
const UNREACHABLE =
  /timed out|Socket timeout|writeable|Connection is|Cluster is|isn't ready|startup nodes|Node is disconnected|Cluster redirections|ECONN|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|ENOTFOUND|EAI_AGAIN/

/** True when `err` says Redis could not be asked, as opposed to a bad argument or a script's own error. */
export function isRedisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error)) return false
  if (err.name === 'ReplyError') return TRANSIENT_REPLY.test(err.message)
  if (['AbortError', 'MaxRetriesPerRequestError', 'ClusterAllFailedError'].includes(err.name)) return true
  const code = (err as NodeJS.ErrnoException).code ?? ''
  return UNREACHABLE.test(err.message) || UNREACHABLE.test(code)
}

/** The 503 every session operation answers when Redis cannot be asked: the client may retry soon. */
export function sessionStoreUnavailable(cause?: unknown): HttpProblem {
  const problem = new HttpProblem(
    503,
    'session-store-unavailable',
    'Service unavailable',
    'Sessions cannot be checked now.',
    { headers: { 'retry-after': '1' } },
  )
  if (cause !== undefined) problem.cause = cause
  return problem
}

/**
 * Runs a store operation; a Redis failure becomes the 503 problem, so an app that lets it through
 * answers 503 with Retry-After instead of a 500 carrying the driver's message.
 */
export async function guarded<T>(operation: () => Promise<T>): Promise<T> {
  try {
    return await operation()
  } catch (err) {
    throw isRedisUnavailable(err) ? sessionStoreUnavailable(err) : err
  }
}
