import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import { Type } from 'typebox'
import { accountNotFound, getAccountWithOwner, listAccounts } from '../ledger/ledger.ts'
import { Account, IdParam, problems } from './schemas.ts'

// Cache keys are built from ids the gateway parsed and bounded, never from raw request text.
const MAX_ACCOUNT_ID = 2_147_483_647
export const accountCacheKey = (accountId: number) => `account:${accountId}`
export const accountsCacheKey = (customerId: number) => `accounts:${customerId}`

/**
 * Called once a transfer has committed: drops both balances and both owners' account lists.
 * Never throws (the money has moved); failures are logged and counted, and the TTL bounds them.
 * The recipient comes from the transfer's own lock query (no extra statement). A replay drops both
 * sides again: the first attempt may have committed and died before its invalidation.
 */
export async function invalidateAfterTransfer(
  app: FastifyInstance,
  customerId: number,
  transfer: { fromAccountId: number; toAccountId: number },
  recipientCustomerId?: number,
): Promise<void> {
  if (!app.cache.enabled) return
  const keys = [
    accountCacheKey(transfer.fromAccountId),
    accountCacheKey(transfer.toAccountId),
    accountsCacheKey(customerId),
  ]
  if (recipientCustomerId !== undefined && recipientCustomerId !== customerId) {
    keys.push(accountsCacheKey(recipientCustomerId))
  }
  await app.cache.invalidate(keys)
}

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
    async (request) => {
      const customerId = Number(request.session!.principal)
      const accounts = await app.cache.getOrLoad(accountsCacheKey(customerId), () =>
        listAccounts(app.db, customerId),
      )
      return { accounts: accounts ?? [] }
    },
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
      // Beyond Postgres integer no account exists: answered without a cache key or a query.
      if (accountId > MAX_ACCOUNT_ID) throw accountNotFound(accountId)
      // Cached per account with its owner (unknown ids as "not found"), shared by all customers;
      // another customer's account answers exactly like a missing one.
      const account = await app.cache.getOrLoad(accountCacheKey(accountId), () =>
        getAccountWithOwner(app.db, accountId),
      )
      if (!account || account.customerId !== Number(request.session!.principal)) {
        throw accountNotFound(accountId)
      }
      return { accountId, currency: account.currency, balance: account.balance }
    },
  )
}

export default accountRoutes
