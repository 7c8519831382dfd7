import type { FastifyReply } from 'fastify'
import { gatewayErrorOver, PROBLEM_CODES } from './errors.ts'

export const PROBLEM_CONTENT_TYPE = 'application/problem+json; charset=utf-8'

/** RFC 9457 problem details as sent: `type` is a relative URI under /problems/. */
export interface ProblemBody {
  type: string
  title: string
  status: number
  detail: string
  [extension: string]: string | number
}

/**
 * An error answered as application/problem+json; plugins send it themselves, an app's error handler
 * may too. `instanceof GatewayError` holds for it; its `code` is the library's for a plugin's problem.
 */
export class HttpProblem extends gatewayErrorOver(Error) {
  readonly status: number
  readonly type: string
  readonly title: string
  readonly headers: Record<string, string>
  readonly extra: Record<string, string>
  /** The library's code for a problem a plugin sends (`FRG_RATE_LIMITED`, ...); undefined for an app's own. */
  readonly code: string | undefined

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
    this.code = PROBLEM_CODES[slug]
  }

  toJSON(): ProblemBody {
    const body: ProblemBody = {
      type: this.type,
      title: this.title,
      status: this.status,
      detail: this.message,
    }
    if (this.code) body.code = this.code
    return Object.assign(body, this.extra)
  }
}

export function sendProblem(reply: FastifyReply, problem: HttpProblem): FastifyReply {
  return reply.code(problem.status).headers(problem.headers).type(PROBLEM_CONTENT_TYPE).send(problem.toJSON())
}
