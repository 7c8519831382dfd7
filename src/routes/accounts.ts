import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import { accountNotFound, getOwnAccount, listAccounts } from '../ledger/ledger.ts'
import { Account, IdParam, problems } from './schemas.ts'

const accountRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/accounts',
    {
      config: { session: 'required' },
      schema: {
        tags: ['accounts'],
        summary: "The customer's accounts",
        response: { 200: Type.Object({ accounts: Type.Array(Account) }), ...problems(401, 429, 503) },
      },
    },
    async (request) => ({ accounts: await listAccounts(app.db, Number(request.session!.principal)) }),
  )

  app.get(
    '/accounts/:accountId/balance',
    {
      config: { session: 'required' },
      schema: {
        tags: ['accounts'],
        summary: 'Balance of one of your accounts (another customer’s answers 404)',
        params: Type.Object({ accountId: IdParam }),
        response: { 200: Account, ...problems(400, 401, 404, 429, 503) },
      },
    },
    async (request) => {
      const accountId = Number(request.params.accountId)
      const account = await getOwnAccount(app.db, Number(request.session!.principal), accountId)
      if (!account) throw accountNotFound(accountId)
      return account
    },
  )
}

export default accountRoutes
