import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { problems } from './openapi.ts'
import { problemIndexHtml, problemPageHtml, problemType } from './problem-types.ts'

const HTML = 'text/html; charset=utf-8'
const htmlPage = (description: string) => ({
  description,
  content: { 'text/html': { schema: Type.String({ description: 'An HTML page' }) } },
})

/** The `type` URIs of problems resolve here: one page per type, and the list of all of them. */
const problemRoutes: FastifyPluginAsyncTypebox = async (app) => {
  // Built once: the table does not change while the process runs.
  const index = problemIndexHtml()

  app.get(
    '/problems',
    {
      schema: {
        operationId: 'listProblemTypes',
        tags: ['problems'],
        summary: 'Every problem type',
        description: 'The table of every problem `type` the gateway answers with, as an HTML page.',
        response: { 200: htmlPage('The list of problem types.'), ...problems({ 400: ['validation'] }) },
      },
    },
    async (_request, reply) => reply.type(HTML).send(index),
  )

  app.get(
    '/problems/:slug',
    {
      schema: {
        operationId: 'getProblemType',
        tags: ['problems'],
        summary: 'The documentation of one problem type',
        description:
          'Where the `type` of a problem (`/problems/<slug>`, relative to the gateway) resolves: what the type ' +
          'means and when it is answered, as an HTML page.',
        params: Type.Object({
          slug: Type.String({
            pattern: '^[a-z]+(-[a-z]+)*$',
            maxLength: 64,
            description: 'The last segment of the problem `type`, e.g. `insufficient-funds`.',
          }),
        }),
        response: {
          200: htmlPage('The page of this problem type.'),
          ...problems({ 400: ['validation'], 404: ['not-found'] }),
        },
      },
    },
    async (request, reply) => {
      const type = problemType(request.params.slug)
      if (!type)
        throw new HttpProblem(
          404,
          'not-found',
          'Not found',
          `No problem type /problems/${request.params.slug}.`,
        )
      return reply.type(HTML).send(problemPageHtml(type))
    },
  )
}

export default problemRoutes
