import type { FastifyReply, FastifyRequest } from 'fastify'
import { HttpProblem, sendProblem } from '../common/problem.ts'
import { RateLimitError } from './errors.ts'
import type { Outcome } from './outcome.ts'
import type { Decision } from './types.ts'

// What the plugin writes on a response it limited: the RateLimit headers of every decision, and
// the answer to a request it refused (429, a ban's 403, 503 when it cannot check, 500 when a
// policy of the route cannot be applied).

/** The request's logger, its messages marked `plugin: 'rate-limit'` as the plugin's own are. */
export const requestLog = (request: FastifyRequest) => request.log.child({ plugin: 'rate-limit' })

function appendHeader(reply: FastifyReply, name: string, value: string): void {
  const previous = reply.getHeader(name)
  reply.header(name, previous ? `${previous}, ${value}` : value)
}

export function writeHeaders(reply: FastifyReply, decisions: Decision[], legacy: boolean): void {
  for (const d of decisions) {
    appendHeader(reply, 'ratelimit-policy', d.header)
    if (d.remaining === null) continue
    appendHeader(reply, 'ratelimit', `"${d.policy.name}";r=${d.remaining};t=${Math.ceil(d.resetMs / 1000)}`)
    if (legacy) {
      const current = reply.getHeader('x-ratelimit-remaining')
      if (current !== undefined && Number(current) <= d.remaining) continue
      reply.header('x-ratelimit-limit', d.header.split(';q=')[1]!.split(';')[0])
      reply.header('x-ratelimit-remaining', d.remaining)
      reply.header('x-ratelimit-reset', Math.ceil(d.resetMs / 1000))
    }
  }
}

function rejection(outcome: Outcome): HttpProblem {
  if (outcome.unavailable) {
    const { name } = outcome.unavailable
    return new HttpProblem(
      503,
      'rate-limit-unavailable',
      'Service unavailable',
      `Rate limit '${name}' cannot be checked now.`,
      {
        headers: { 'retry-after': '1' },
        extra: { policy: name },
      },
    )
  }
  const d = outcome.rejected!
  const seconds = Math.max(1, Math.ceil(d.retryMs / 1000))
  const quota = d.header.slice(d.header.indexOf(';q=') + 3).replace(';w=', ' per ')
  if (d.isBanned)
    return new HttpProblem(
      403,
      'rate-limit-banned',
      'Forbidden',
      `Rate limit '${d.policy.name}' (${quota} s) was exceeded too many times; banned for ${seconds} s.`,
      {
        headers: { 'retry-after': String(seconds) },
        extra: { policy: d.policy.name },
      },
    )
  return new HttpProblem(
    429,
    'rate-limited',
    'Too many requests',
    d.policy.algorithm === 'concurrency'
      ? `Rate limit '${d.policy.name}' (${d.limit} requests at once) reached; retry in ${seconds} s.`
      : `Rate limit '${d.policy.name}' (${quota} s) exceeded; retry in ${seconds} s.`,
    {
      headers: { 'retry-after': String(seconds) },
      extra: { policy: d.policy.name },
    },
  )
}

/**
 * A request the limiter could not check because of the route's own setup (a policy function threw
 * or returned what cannot be counted): 500 for this request only, logged with the policy, and never
 * taken for a Redis outage that would change every other route.
 */
export function notChecked(request: FastifyRequest, err: unknown): HttpProblem {
  const policies = err instanceof RateLimitError ? err.policies : []
  requestLog(request).error({ err, policy: policies.join(', ') || undefined }, 'request not checked')
  const named = policies.length ? ` '${policies.join("', '")}'` : 's'
  return new HttpProblem(
    500,
    'rate-limit-error',
    'Internal server error',
    `Rate limit${named} could not be applied to this request.`,
    policies.length ? { extra: { policy: policies.join(', ') } } : {},
  )
}

/** Calls a user's callback without awaiting it: what it throws, at once or later, is logged. */
function notify(request: FastifyRequest, policy: string, callback: string, call: () => unknown): void {
  const logError = (err: unknown) => requestLog(request).error({ err, policy }, `${callback} threw`)
  try {
    const result = call()
    if (result && typeof (result as Promise<void>).then === 'function')
      (result as Promise<void>).catch(logError)
  } catch (err) {
    logError(err)
  }
}

/** The 429: onExceeded told (never awaited), the body from errorResponse if the policy has one. */
export async function sendRejection(request: FastifyRequest, reply: FastifyReply, outcome: Outcome) {
  const problem = rejection(outcome)
  const decision = outcome.unavailable ? null : outcome.rejected
  if (!decision) return sendProblem(reply, problem)
  const { policy } = decision
  const bannedKey = outcome.banReached
  if (bannedKey !== null && policy.onBanReach)
    notify(request, policy.name, 'onBanReach', () => policy.onBanReach!(request, bannedKey))
  if (policy.onExceeded)
    notify(request, policy.name, 'onExceeded', () => policy.onExceeded!(request, decision))
  if (!policy.errorResponse) return sendProblem(reply, problem)
  let body: unknown
  try {
    body = await policy.errorResponse(request, decision)
  } catch (err) {
    requestLog(request).error({ err, policy: policy.name }, 'errorResponse threw; the default body is sent')
    return sendProblem(reply, problem)
  }
  reply.code(problem.status).headers(problem.headers)
  if (typeof body === 'string') return reply.type('text/plain; charset=utf-8').send(body)
  return reply.type('application/json; charset=utf-8').send(JSON.stringify(body ?? null))
}
