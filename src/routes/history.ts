import { createHmac, timingSafeEqual } from 'node:crypto'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { type HistoryPosition, listTransactions } from '../ledger/history.ts'
import { getOwnAccount } from '../ledger/ledger.ts'
import { accountNotFound } from '../ledger/refusals.ts'
import { json, problems } from './openapi.ts'
import { Amount, Currency, Id, IdParam, Timestamp } from './schemas.ts'

// A cursor is `<payload>.<mac>`, both base64url: the payload is `<accountId>|<createdAt>|<transferId>`
// (the last transfer of the page before), the MAC an HMAC-SHA256 of the payload text. Opaque to
// clients: they send back what they got. Signed so that a client cannot aim the keyset at rows of
// its choosing, and bound to the account so that one account's place cannot be replayed on another.

/** Any cursor this gateway makes is at most 118 characters; longer than this is refused by the schema. */
export const MAX_CURSOR_LENGTH = 256
const DEFAULT_LIMIT = 20
const MAX_ACCOUNT_ID = 2_147_483_647
// The key is derived, not the session secret itself: a cursor's MAC can never pass for a cookie's.
const CURSOR_KEY_LABEL = 'fastify-redis-gateway transaction-history cursor v1'
const CURSOR = /^([A-Za-z0-9_-]{1,200})\.([A-Za-z0-9_-]{43})$/
const PAYLOAD =
  /^([1-9][0-9]{0,9})\|([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z)\|([1-9][0-9]{0,15})$/

export interface CursorCodec {
  encode(accountId: number, position: HistoryPosition): string
  /** The position, or null when this gateway did not make the cursor for this account. */
  decode(cursor: string, accountId: number): HistoryPosition | null
}

/**
 * Cursors signed with the first secret and accepted under any of them, like session cookies: a
 * rotation (new secret first, old one kept) does not break a client in the middle of its paging.
 */
export function cursorCodec(secrets: readonly string[]): CursorCodec {
  const keys = secrets.map((secret) => createHmac('sha256', secret).update(CURSOR_KEY_LABEL).digest())
  const mac = (key: Buffer, payload: string) => createHmac('sha256', key).update(payload).digest('base64url')
  return {
    encode(accountId, { createdAt, transferId }) {
      const payload = Buffer.from(`${accountId}|${createdAt}|${transferId}`).toString('base64url')
      return `${payload}.${mac(keys[0]!, payload)}`
    },
    decode(cursor, accountId) {
      const match = cursor.length <= MAX_CURSOR_LENGTH ? CURSOR.exec(cursor) : null
      if (!match) return null
      const [, payload, given] = match as unknown as [string, string, string]
      // The MAC is compared as the text sent, so no other spelling of the same bytes passes either.
      const sent = Buffer.from(given)
      const signed = keys.some((key) => timingSafeEqual(sent, Buffer.from(mac(key, payload))))
      if (!signed) return null
      const fields = PAYLOAD.exec(Buffer.from(payload, 'base64url').toString())
      if (!fields || Number(fields[1]) !== accountId) return null
      return { createdAt: fields[2]!, transferId: Number(fields[3]) }
    },
  }
}

const invalidCursor = () =>
  new HttpProblem(
    400,
    'invalid-cursor',
    'Invalid cursor',
    'The cursor is not one this gateway issued for this account; start again without `cursor`.',
  )

const HistoryItem = Type.Object({
  transferId: Type.Integer({ minimum: 1 }),
  direction: Type.Union([Type.Literal('debit'), Type.Literal('credit')], {
    description: '`debit`: the money left this account; `credit`: it arrived in it.',
  }),
  amount: Type.Integer({ ...Amount, description: "Positive, in the currency's minor unit." }),
  currency: Currency,
  counterpartyAccountId: Type.Integer({ ...Id, description: 'The account on the other side.' }),
  createdAt: Timestamp,
})

const HistoryPage = Type.Object({
  items: Type.Array(HistoryItem, { maxItems: 100, description: 'Newest first.' }),
  nextCursor: Type.Unsafe<string | null>({
    type: 'string',
    nullable: true,
    description: 'Send it as `cursor` for the next, older page; null on the last page.',
  }),
})

const historyRoutes: FastifyPluginAsyncTypebox<{ secrets: readonly string[] }> = async (app, options) => {
  const cursors = cursorCodec(options.secrets)

  app.get(
    '/accounts/:accountId/transactions',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'listTransactions',
        tags: ['accounts'],
        summary: 'List the transfers of one of your accounts',
        description:
          'The transfers of one of your accounts, newest first, a page at a time: follow `nextCursor` ' +
          'until it is null. Transfers made while you page never repeat or skip one on the pages still to ' +
          'come (keyset paging; a new transfer shows on a first page). Another customer’s account answers ' +
          '404 exactly like one that does not exist.',
        params: Type.Object({ accountId: IdParam }),
        querystring: Type.Object(
          {
            limit: Type.Optional(
              Type.String({
                pattern: '^(?:[1-9][0-9]?|100)$',
                maxLength: 3,
                description: 'Transfers per page: 1 to 100, default 20.',
              }),
            ),
            cursor: Type.Optional(
              Type.String({
                maxLength: MAX_CURSOR_LENGTH,
                description:
                  'The `nextCursor` of the previous page, unchanged (opaque, signed, valid for this account ' +
                  'only). Without it: the newest page.',
              }),
            ),
          },
          { additionalProperties: false },
        ),
        response: {
          200: json(HistoryPage, 'One page of the account’s transfers.'),
          ...problems({
            400: ['validation', 'invalid-cursor'],
            401: ['unauthenticated'],
            404: ['account-not-found'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const { accountId } = request.params
      const limit = Number(request.query.limit ?? DEFAULT_LIMIT)
      // Checked before any query: a cursor is the gateway's own or nothing is read.
      const after =
        request.query.cursor === undefined ? undefined : cursors.decode(request.query.cursor, accountId)
      if (after === null) throw invalidCursor()
      // Beyond Postgres integer no account exists, nor where the account filter says so; otherwise
      // another customer's is answered like a missing one.
      if (
        accountId > MAX_ACCOUNT_ID ||
        !(await app.accountFilter.mightExist(accountId)) ||
        !(await getOwnAccount(app.db, Number(request.session!.principal), accountId))
      ) {
        throw accountNotFound(accountId)
      }
      const page = await listTransactions(app.db, accountId, limit, after)
      return { items: page.items, nextCursor: page.next ? cursors.encode(accountId, page.next) : null }
    },
  )
}

export default historyRoutes
