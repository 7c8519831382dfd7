import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { PROBLEM_CONTENT_TYPE, Problem } from '../errors.ts'

const Check = Type.Union([Type.Literal('ok'), Type.Literal('down')])
const Checks = { redis: Check, postgres: Check }

/** Resolves to 'down' rather than waiting: a readiness probe must answer quickly. */
async function probe(check: () => Promise<unknown>, timeoutMs = 1000): Promise<'ok' | 'down'> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<'down'>((resolve) => {
    timer = setTimeout(() => resolve('down'), timeoutMs)
  })
  try {
    return await Promise.race([check().then(() => 'ok' as const), timeout])
  } catch {
    return 'down'
  } finally {
    clearTimeout(timer)
  }
}

const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/health',
    {
      schema: {
        tags: ['operations'],
        summary: 'Liveness: 200 while the process is up',
        response: { 200: Type.Object({ status: Type.Literal('ok') }) },
      },
    },
    async () => ({ status: 'ok' as const }),
  )

  app.get(
    '/ready',
    {
      schema: {
        tags: ['operations'],
        summary: 'Readiness: 200 when Redis and Postgres answer, else 503 naming the failed one',
        response: {
          200: Type.Object({ status: Type.Literal('ready'), ...Checks }),
          503: Type.Evaluate(Type.Intersect([Problem, Type.Object(Checks)])),
        },
      },
    },
    async (_request, reply) => {
      const [redis, postgres] = await Promise.all([
        probe(() => app.redis.ping()),
        probe(() => app.db.query('SELECT 1')),
      ])
      if (redis === 'ok' && postgres === 'ok') return { status: 'ready' as const, redis, postgres }
      const down = [redis === 'down' && 'Redis', postgres === 'down' && 'Postgres']
        .filter(Boolean)
        .join(' and ')
      return reply
        .code(503)
        .type(PROBLEM_CONTENT_TYPE)
        .header('retry-after', '1')
        .send({
          type: '/problems/not-ready',
          title: 'Not ready',
          status: 503,
          detail: `${down} not answering.`,
          redis,
          postgres,
        })
    },
  )
}

export default healthRoutes
