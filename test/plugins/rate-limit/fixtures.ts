// What several rate-limit suites build alike: an app whose JSON log lines the test reads, and a
// route that answers the status its query asks for.
import { Writable } from 'node:stream'
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify'

/** A Fastify app whose JSON log lines (at `level` and above) are collected in `logs`. */
export function loggedApp(level = 'warn') {
  const logs: Array<Record<string, unknown>> = []
  const stream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split('\n')) if (line) logs.push(JSON.parse(line))
      done()
    },
  })
  return { app: Fastify({ logger: { level, stream } }), logs }
}

/** A handler answering `?status=` (default 200), so a test picks what a limited route returns. */
export async function answerStatus(request: FastifyRequest, reply: FastifyReply) {
  const status = Number((request.query as { status?: string }).status ?? 200)
  return reply.code(status).send({ ok: status < 400 })
}
