import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { findCustomerByUsername } from '../ledger/ledger.ts'
import { verifyPassword } from '../ledger/passwords.ts'
import { json, noContent, problems, setCookieHeader } from './openapi.ts'
import { Id, Timestamp } from './schemas.ts'

const Credentials = Type.Object(
  {
    username: Type.String({ minLength: 1, maxLength: 64 }),
    password: Type.String({ minLength: 1, maxLength: 1024 }),
  },
  { additionalProperties: false, examples: [{ username: 'alice', password: 'demo-password' }] },
)

const SessionCreated = Type.Object({
  customerId: Id,
  expiresAt: Type.String({
    ...Timestamp,
    description:
      'The idle expiry; requests with the session move it (each instance at most every 1/20 of the idle timeout).',
  }),
})

const SessionInfo = Type.Object({
  customerId: Id,
  createdAt: Timestamp,
  expiresAt: Type.String({
    ...Timestamp,
    description:
      'The idle expiry; requests with the session move it (each instance at most every 1/20 of the idle timeout).',
  }),
  absoluteExpiresAt: Type.String({
    ...Timestamp,
    description: 'The end of the session whatever the activity (the absolute timeout from login).',
  }),
})

export interface SessionRoutesOptions {
  /** The session cookie's name as this gateway sends it, for the document's Set-Cookie headers. Default `sid`. */
  sessionCookie?: string
}

export const badCredentials = () =>
  new HttpProblem(401, 'bad-credentials', 'Bad credentials', 'The username or password is wrong.')

const sessionRoutes: FastifyPluginAsyncTypebox<SessionRoutesOptions> = async (
  app,
  { sessionCookie = 'sid' },
) => {
  // The events module (when the app has it) ends the notification streams of a session logged out.
  const events = app.hasDecorator('events') ? app.events : undefined

  app.post(
    '/session',
    {
      // Failed logins per username, when the gateway registers the rate-limit plugin (src/app.ts).
      config: { rateLimits: app.hasDecorator('rateLimiter') ? ['login-ip', 'login'] : false },
      schema: {
        operationId: 'login',
        tags: ['session'],
        summary: 'Log in',
        description:
          'Checks the username and password and starts a new session: a new session id in a new cookie; a ' +
          'session presented with the request is destroyed first (no fixation). Rate limited per client IP ' +
          '(`login-ip`, every attempt) and per username (`login`, failed attempts only).',
        body: Credentials,
        response: {
          200: json(
            SessionCreated,
            'Logged in: the session cookie is set.',
            setCookieHeader(
              sessionCookie,
              'The new session: {cookie}=<id>.<signature>; `HttpOnly`, `SameSite=Lax`, `Path=/`, `Max-Age` the ' +
                'absolute session lifetime in seconds (`Secure` where sessions are secure). Send it back as `Cookie`.',
              `${sessionCookie}=u03pJCYd8h392D0c-UZH8NmZP1JDbwNlIKzYsg5vmfI.EbNGtIPLRiN0XZMdh3WixkUsPEnj4Xcd8HBQhjTd/uQ; Max-Age=28800; Path=/; HttpOnly; SameSite=Lax`,
            ),
          ),
          ...problems({
            400: ['validation', 'bad-request'],
            401: ['bad-credentials'],
            413: ['payload-too-large'],
            415: ['unsupported-media-type'],
            429: ['rate-limited'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
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
        operationId: 'getSession',
        tags: ['session'],
        summary: 'The current session',
        description: 'Who is logged in and until when. Like every session route, it moves the idle expiry.',
        response: {
          200: json(SessionInfo, 'The session presented with the request.'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable'],
          }),
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
        operationId: 'logout',
        tags: ['session'],
        summary: 'Log out',
        description:
          'Deletes the session server-side (its cookie is refused from now on) and clears the cookie. With ' +
          '`everywhere=true`, every session of the customer ends.',
        querystring: Type.Object(
          {
            everywhere: Type.Optional(
              Type.Union([Type.Literal('true'), Type.Literal('false')], {
                description:
                  '`true`: end every session of the customer, on every device ("log out everywhere").',
              }),
            ),
          },
          { additionalProperties: false },
        ),
        response: {
          204: noContent(
            'Logged out; no body.',
            setCookieHeader(
              sessionCookie,
              'Clears the session cookie: {cookie}=; `Max-Age=0`, `Expires` in 1970.',
              `${sessionCookie}=; Max-Age=0; Path=/; Expires=Thu, 01 Jan 1970 00:00:00 GMT; HttpOnly; SameSite=Lax`,
            ),
          ),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable'],
          }),
        },
      },
    },
    async (request, reply) => {
      // Everywhere first: if it fails (503), this session and its cookie remain, so the client can retry.
      const { id, principal } = request.session!
      if (request.query.everywhere === 'true') await app.sessions.destroyAll(principal)
      await reply.destroySession()
      events?.sessionEnded(id)
      return reply.code(204).send(null)
    },
  )
}

export default sessionRoutes
