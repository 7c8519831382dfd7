import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { PROBLEM_CONTENT_TYPE } from '../errors.ts'
import { json, problems } from './openapi.ts'

const check = (description: string) => Type.Union([Type.Literal('ok'), Type.Literal('down')], { description })
const Checks = {
  redis: check('Whether Redis answered PING within 1 s.'),
  postgres: check('Whether Postgres answered SELECT 1 within 1 s.'),
}

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
        operationId: 'getHealth',
        tags: ['operations'],
        summary: 'Liveness probe',
        description: 'Answers 200 whenever the process is up; it asks neither Redis nor Postgres.',
        response: {
          200: json(Type.Object({ status: Type.Literal('ok') }), 'The process is up.'),
          ...problems({ 400: ['validation'] }),
        },
      },
    },
    async () => ({ status: 'ok' as const }),
  )

  app.get(
    '/ready',
    {
      schema: {
        operationId: 'getReadiness',
        tags: ['operations'],
        summary: 'Readiness probe',
        description:
          'Answers 200 when Redis and Postgres both answer within 1 s, else 503 naming the one that did not; 503 too once the instance is shutting down (its drain period), while its other routes still answer.',
        response: {
          200: json(Type.Object({ status: Type.Literal('ready'), ...Checks }), 'Redis and Postgres answer.'),
          ...problems({ 400: ['validation'], 503: ['not-ready'] }, { extra: { 503: Checks } }),
        },
      },
    },
    async (_request, reply) => {
      const [redis, postgres] = await Promise.all([
        probe(() => app.redis.ping()),
        probe(() => app.db.query('SELECT 1')),
      ])
      const draining = app.lifecycle?.draining === true
      if (redis === 'ok' && postgres === 'ok' && !draining)
        return { status: 'ready' as const, redis, postgres }
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
          detail: draining ? 'This instance is shutting down.' : `${down} not answering.`,
          redis,
          postgres,
        })
    },
  )
}

export default healthRoutes
