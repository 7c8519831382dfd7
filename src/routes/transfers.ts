import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyReply, FastifyRequest, onSendHookHandler } from 'fastify'
import { Type } from 'typebox'
import { invalidateAfterTransfer } from '../ledger/account-cache.ts'
import { executeTransfer } from '../ledger/ledger.ts'
import { HEADERS, json, problems } from './openapi.ts'
import { Amount, Currency, Id, Timestamp } from './schemas.ts'

export const TransferBody = Type.Object(
  {
    fromAccountId: Type.Integer({ ...Id, description: 'One of your accounts.' }),
    toAccountId: Type.Integer({ ...Id, description: 'Any account in the same currency, not the source.' }),
    amount: Amount,
    currency: Type.String({ ...Currency, description: 'ISO 4217 code; must be both accounts’ currency.' }),
  },
  {
    additionalProperties: false,
    examples: [{ fromAccountId: 1, toAccountId: 2, amount: 50000, currency: 'VND' }],
  },
)

export const TransferCreated = Type.Object({
  transferId: Type.Integer({ minimum: 1 }),
  fromAccountId: Id,
  toAccountId: Id,
  amount: Amount,
  currency: Currency,
  createdAt: Timestamp,
})

/**
 * The `transfers` rate limit's `countOnlyFailures` predicate: false gives the attempt back. A replay
 * and a key reused with another body run nothing, whether the idempotency plugin answered from
 * Redis or the transfer row did (the plugin records both on `request.idempotency`), so a client
 * retrying its transfer never spends its quota on them.
 */
export const transferAttemptCounts = (reply: FastifyReply): boolean => {
  const outcome = reply.request.idempotency?.outcome
  return outcome !== 'replayed' && outcome !== 'mismatched'
}

/** `outbox: false` (OUTBOX=off) makes transfers without their outbox event, for comparing throughput. */
/** The transfer route's options: whether it writes outbox events, and its rate-limit policies by name. */
export interface TransferRoutesOptions {
  outbox?: boolean
  /** Default: `'transfers'` when the rate-limit plugin is registered. */
  rateLimits?: string | string[] | false
}

const transferRoutes: FastifyPluginAsyncTypebox<TransferRoutesOptions> = async (app, options) => {
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

  // The events module (when the app has it) relays the transfer's outbox event soon after the commit.
  const events = app.hasDecorator('events') ? app.events : undefined
  const outbox = options.outbox ?? true

  app.post(
    '/transfers',
    {
      // Required (docs/demo/http-api.md); when Redis cannot be asked the transfer still runs, guarded by the
      // unique (customer, key) of its row in Postgres.
      config: {
        session: 'required',
        idempotency: { required: true, onRedisError: 'open' },
        rateLimits: options.rateLimits ?? (app.hasDecorator('rateLimiter') ? 'transfers' : false),
      },
      schema: {
        operationId: 'createTransfer',
        tags: ['transfers'],
        summary: 'Transfer money',
        description:
          'Moves money from one of your accounts to any account in the same currency, exactly once per ' +
          '`Idempotency-Key`: a retry with the same key and body answers the first response again (with ' +
          '`Idempotent-Replayed: true`), also for the kept errors (400 `same-account`, 404, 422 ' +
          '`currency-mismatch` and `insufficient-funds`); after a 409, 429 or 503, retry with the same key ' +
          'and body. Rate limited per customer (`transfers`); replays and 422 `idempotency-key-mismatch` ' +
          'answers give back what they took.',
        body: TransferBody,
        response: {
          201: json(
            TransferCreated,
            'The transfer was made, or this is the replay of the one made with this key.',
            {
              'Idempotent-Replayed': HEADERS['Idempotent-Replayed'],
            },
          ),
          ...problems(
            {
              400: [
                'validation',
                'bad-request',
                'same-account',
                'idempotency-key-missing',
                'idempotency-key-invalid',
              ],
              401: ['unauthenticated'],
              404: ['account-not-found'],
              409: ['idempotency-key-in-flight'],
              413: ['payload-too-large'],
              415: ['unsupported-media-type'],
              422: ['currency-mismatch', 'insufficient-funds', 'idempotency-key-mismatch'],
              429: ['rate-limited'],
              503: ['session-store-unavailable', 'database-unavailable'],
            },
            { replayable: [400, 404, 422] },
          ),
        },
      },
    },
    async (request, reply) => {
      const idempotency = request.idempotency
      const { replayed, recipientCustomerId, ...transfer } = await executeTransfer(
        app.db,
        { ...request.body, customerId: Number(request.session!.principal) },
        idempotency ? { key: idempotency.key, fingerprint: idempotency.fingerprint } : undefined,
        { outbox },
      )
      if (replayed) reply.header('idempotent-replayed', 'true')
      else if (outbox) events?.transferCommitted()
      // Only after the commit: an earlier drop could be refilled with the old balance.
      invalidations.set(
        request,
        invalidateAfterTransfer(app.cache, Number(request.session!.principal), transfer, recipientCustomerId),
      )
      return reply.code(201).send(transfer)
    },
  )
}

export default transferRoutes
