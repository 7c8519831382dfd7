import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyRequest, onSendHookHandler } from 'fastify'
import { Type } from 'typebox'
import { executeTransfer } from '../ledger/ledger.ts'
import { invalidateAfterTransfer } from './accounts.ts'
import { Amount, Currency, Id, problems, Timestamp } from './schemas.ts'

export const TransferBody = Type.Object(
  { fromAccountId: Id, toAccountId: Id, amount: Amount, currency: Currency },
  { additionalProperties: false },
)

export const TransferCreated = Type.Object({
  transferId: Type.Integer({ minimum: 1 }),
  fromAccountId: Id,
  toAccountId: Id,
  amount: Amount,
  currency: Currency,
  createdAt: Timestamp,
})

const transferRoutes: FastifyPluginAsyncTypebox = async (app) => {
  // Cache invalidation starts in the handler, after the commit, and is awaited in the last onSend
  // hook, after the Idempotency-Key record is stored: both are in flight together (one Redis
  // round trip instead of two), and the client still sees its response only once both are done.
  const invalidations = new WeakMap<FastifyRequest, Promise<void>>()
  const awaitInvalidation: onSendHookHandler = async (request) => {
    await invalidations.get(request)
  }
  // onRoute hooks of the idempotency plugin (registered earlier) run first, so this one comes last.
  app.addHook('onRoute', (route) => {
    route.onSend = [route.onSend ?? []].flat().concat(awaitInvalidation)
  })

  app.post(
    '/transfers',
    {
      // Required (docs/http-api.md); when Redis cannot be asked the transfer still runs, guarded by the
      // unique (customer, key) of its row in Postgres.
      config: {
        session: 'required',
        idempotency: { required: true, onRedisError: 'open' },
        rateLimits: 'transfers',
      },
      schema: {
        tags: ['transfers'],
        summary: 'Move money from one of your accounts to any account in the same currency',
        body: TransferBody,
        response: { 201: TransferCreated, ...problems(400, 401, 404, 409, 422, 429, 503) },
      },
    },
    async (request, reply) => {
      const idempotency = request.idempotency
      const { replayed, recipientCustomerId, ...transfer } = await executeTransfer(
        app.db,
        { ...request.body, customerId: Number(request.session!.principal) },
        idempotency ? { key: idempotency.key, fingerprint: idempotency.fingerprint } : undefined,
      )
      if (replayed) reply.header('idempotent-replayed', 'true')
      // Only after the commit: an earlier drop could be refilled with the old balance.
      invalidations.set(
        request,
        invalidateAfterTransfer(app, Number(request.session!.principal), transfer, recipientCustomerId),
      )
      return reply.code(201).send(transfer)
    },
  )
}

export default transferRoutes
