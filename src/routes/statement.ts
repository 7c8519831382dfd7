import { Readable } from 'node:stream'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyRequest } from 'fastify'
import { Type } from 'typebox'
import type { Queryable } from '../db/database.ts'
import { type HistoryItem, type HistoryPosition, listTransactions } from '../ledger/history.ts'
import { getOwnAccount } from '../ledger/ledger.ts'
import { accountNotFound } from '../ledger/refusals.ts'
import { problems } from './openapi.ts'
import { IdParam } from './schemas.ts'

// GET /accounts/:accountId/statement.csv: a customer's whole history of one account as CSV,
// streamed a keyset page at a time (the next page is read only when the client has taken the
// last one: backpressure reaches Postgres). Its limits (src/rate-limits.ts): at most a few exports
// of a customer in flight, and a daily budget of bytes, reserved as an estimate at admission and
// settled with the bytes this export produced when its response ends, cut or not.

const MAX_ACCOUNT_ID = 2_147_483_647
/** Transfers per query: pages of this size are read one after another. */
const PAGE = 500
export const CSV_HEADER = 'transfer_id,created_at,direction,amount,currency,counterparty_account_id\n'

/** Bytes each export has produced so far (handed to its response stream), by request. */
const produced = new WeakMap<FastifyRequest, number>()

/** The bytes `request`'s export produced (0 for a request that streamed nothing): its actual cost. */
export const exportedBytes = (request: FastifyRequest): number => produced.get(request) ?? 0

const csvLine = (item: HistoryItem) =>
  `${item.transferId},${item.createdAt},${item.direction},${item.amount},${item.currency},${item.counterpartyAccountId}\n`

/** The statement's text, a page at a time, counted as it is handed on. */
async function* statement(db: Queryable, accountId: number, request: FastifyRequest) {
  const count = (text: string) => {
    produced.set(request, exportedBytes(request) + Buffer.byteLength(text))
    return text
  }
  yield count(CSV_HEADER)
  let after: HistoryPosition | undefined
  for (;;) {
    const page = await listTransactions(db, accountId, PAGE, after)
    if (page.items.length > 0) yield count(page.items.map(csvLine).join(''))
    if (!page.next) return
    after = page.next
  }
}

const statementRoutes: FastifyPluginAsyncTypebox<{ rateLimits: string[] | false }> = async (app, options) => {
  app.get(
    '/accounts/:accountId/statement.csv',
    {
      config: { session: 'required', rateLimits: options.rateLimits },
      schema: {
        operationId: 'exportStatement',
        tags: ['accounts'],
        summary: 'Download the statement of one of your accounts as CSV',
        description:
          'Every transfer of one of your accounts, newest first, as CSV (`transfer_id, created_at, direction, ' +
          'amount, currency, counterparty_account_id`), streamed as it is read. At most ' +
          '`RATE_LIMIT_EXPORTS` exports of a customer run at once (429 `rate-limited`, policy `exports`), and ' +
          'a customer downloads at most `RATE_LIMIT_EXPORT_BYTES` bytes a day (policy `export-bytes`): an ' +
          'export reserves an estimate when it starts and is charged the bytes it sent when it ends, so an ' +
          'export cut short gets back what it did not send. Another customer’s account answers 404 exactly ' +
          'like one that does not exist.',
        params: Type.Object({ accountId: IdParam }),
        response: {
          200: {
            description: 'The statement, as an attachment (`statement-<accountId>.csv`).',
            content: { 'text/csv': { schema: { type: 'string' } } },
          },
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            404: ['account-not-found'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request, reply) => {
      const { accountId } = request.params
      if (
        accountId > MAX_ACCOUNT_ID ||
        !(await app.accountFilter.mightExist(accountId)) ||
        !(await getOwnAccount(app.db, Number(request.session!.principal), accountId))
      ) {
        throw accountNotFound(accountId)
      }
      return reply
        .type('text/csv; charset=utf-8')
        .header('content-disposition', `attachment; filename="statement-${accountId}.csv"`)
        .send(Readable.from(statement(app.db, accountId, request)))
    },
  )
}

export default statementRoutes
