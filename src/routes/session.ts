import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { findCustomerByUsername } from '../ledger/ledger.ts'
import { verifyPassword } from '../ledger/passwords.ts'
import { Id, problems, Timestamp } from './schemas.ts'

const Credentials = Type.Object(
  {
    username: Type.String({ minLength: 1, maxLength: 64 }),
    password: Type.String({ minLength: 1, maxLength: 1024 }),
  },
  { additionalProperties: false },
)

export const badCredentials = () =>
  new HttpProblem(401, 'bad-credentials', 'Bad credentials', 'The username or password is wrong.')

const sessionRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.post(
    '/session',
    {
      // Failed logins per username, when the gateway registers the rate-limit plugin (src/app.ts).
      config: { rateLimits: ['login-ip', 'login'] },
      schema: {
        tags: ['session'],
        summary: 'Log in: starts a new session (a new id, the presented one destroyed)',
        body: Credentials,
        response: {
          200: Type.Object({ customerId: Id, expiresAt: Timestamp }),
          ...problems(400, 401, 429, 503),
        },
      },
    },
    async (request, reply) => {
      const { username, password } = request.body
      const customer = await findCustomerByUsername(app.db, username)
      if (!(await verifyPassword(password, customer?.password_hash)) || !customer) throw badCredentials()
      const session = await reply.regenerateSession(String(customer.id))
      return { customerId: customer.id, expiresAt: new Date(session.expiresAt).toISOString() }
    },
  )

  app.get(
    '/session',
    {
      config: { session: 'required' },
      schema: {
        tags: ['session'],
        summary: 'The current session',
        response: {
          200: Type.Object({
            customerId: Id,
            createdAt: Timestamp,
            expiresAt: Timestamp,
            absoluteExpiresAt: Timestamp,
          }),
          ...problems(401, 503),
        },
      },
    },
    async (request) => {
      const session = request.session!
      return {
        customerId: Number(session.principal),
        createdAt: new Date(session.createdAt).toISOString(),
        expiresAt: new Date(session.expiresAt).toISOString(),
        absoluteExpiresAt: new Date(session.absoluteExpiresAt).toISOString(),
      }
    },
  )

  app.delete(
    '/session',
    {
      config: { session: 'required' },
      schema: {
        tags: ['session'],
        summary: 'Log out: the session is deleted server-side',
        querystring: Type.Object(
          { everywhere: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')])) },
          { additionalProperties: false },
        ),
        response: { 204: Type.Null(), ...problems(401, 503) },
      },
    },
    async (request, reply) => {
      // Everywhere first: if it fails (503), this session and its cookie remain, so the client can retry.
      if (request.query.everywhere === 'true') await app.sessions.destroyAll(request.session!.principal)
      await reply.destroySession()
      return reply.code(204).send(null)
    },
  )
}

export default sessionRoutes
