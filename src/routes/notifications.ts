import { PassThrough } from 'node:stream'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { isStreamId, type SseClient } from '../events/sse-hub.ts'
import { problems } from './openapi.ts'

const LAST_EVENT_ID_PATTERN = '^[0-9]{1,20}-[0-9]{1,20}$'

const EventStream = Type.String({
  description:
    'Server-Sent Events. Each notification: `id:` its id on your notification stream, `event:` ' +
    '`transfer.sent` or `transfer.received`, `data:` a JSON object {eventId, transferId, fromAccountId, ' +
    'toAccountId, amount, currency, occurredAt}. Lines starting with `:` are comments (sent on connect ' +
    'and as heartbeats).',
  example:
    ': connected\n\nid: 1767225600000-0\nevent: transfer.received\ndata: {"eventId":"7","transferId":7,' +
    '"fromAccountId":1,"toAccountId":2,"amount":50000,"currency":"VND","occurredAt":"2026-01-01T00:00:00.000Z"}\n\n',
})

const notificationRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/notifications',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'streamNotifications',
        tags: ['notifications'],
        summary: 'Live notifications of your transfers',
        description:
          'A Server-Sent Events stream of your transfer notifications: `transfer.sent` for money you sent, ' +
          '`transfer.received` for money you received, each exactly once. Reconnecting with `Last-Event-ID` ' +
          '(browsers send it by themselves) first delivers what you missed, in order, then live ones: no ' +
          'gap, no duplicate (as long as the missed ones are still kept: the latest 1000 per customer by ' +
          'default). The stream ends when your session ends (logout or expiry).',
        headers: Type.Object({
          'last-event-id': Type.Optional(
            Type.String({
              pattern: LAST_EVENT_ID_PATTERN,
              description: 'The `id` of the last notification received: those after it are sent first.',
              examples: ['1767225600000-0'],
            }),
          ),
        }),
        response: {
          200: {
            description: 'The stream, open until you close it or your session ends.',
            content: { 'text/event-stream': { schema: EventStream } },
          },
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            429: ['rate-limited', 'too-many-notification-streams'],
            503: ['session-store-unavailable', 'notifications-unavailable'],
          }),
        },
      },
    },
    async (request, reply) => {
      const session = request.session!
      const customerId = Number(session.principal)
      const { hub, maxStreamsPerCustomer } = app.events
      const lastEventId = request.headers['last-event-id'] ?? null
      // The pattern allows 20 digits a part; Redis refuses a part of 2^64 or more (a 503 otherwise).
      if (lastEventId !== null && !isStreamId(lastEventId))
        throw new HttpProblem(
          400,
          'validation',
          'Invalid request',
          'headers/last-event-id must be a notification id: <milliseconds>-<sequence>, each below 2^64, not the largest',
        )
      if (hub.count(customerId) >= maxStreamsPerCustomer) {
        throw new HttpProblem(
          429,
          'too-many-notification-streams',
          'Too many notification streams',
          `At most ${maxStreamsPerCustomer} notification streams per customer are open at once.`,
          { headers: { 'retry-after': '5' } },
        )
      }
      const out = new PassThrough()
      out.on('error', () => {})
      const client: SseClient = { customerId, sessionId: session.id, out, buffer: [], lastId: null }
      reply.raw.on('close', () => hub.close(client))
      // A client gone before the route ran (while its session loaded) has emitted its 'close'
      // already: opened now, its stream would hold a place until the session ends.
      if (reply.raw.destroyed) return reply.hijack()
      try {
        await hub.open(client, lastEventId)
      } catch (err) {
        hub.close(client)
        request.log.warn({ err }, 'notification stream could not be opened')
        throw new HttpProblem(
          503,
          'notifications-unavailable',
          'Service unavailable',
          'Notifications cannot be streamed now (Redis is not answering); retry shortly.',
          { headers: { 'retry-after': '1' } },
        )
      }
      return reply
        .header('content-type', 'text/event-stream; charset=utf-8')
        .header('cache-control', 'no-cache, no-transform')
        .header('x-accel-buffering', 'no')
        .send(out)
    },
  )
}

export default notificationRoutes
