import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { Type } from 'typebox'
import { accountCacheKey, accountsCacheKey } from '../ledger/account-cache.ts'
import { getAccountWithOwner, listAccounts } from '../ledger/ledger.ts'
import { accountNotFound } from '../ledger/refusals.ts'
import { json, problems } from './openapi.ts'
import { Account, IdParam } from './schemas.ts'

// Postgres integer's largest value: no account id is above it, and no cache key is built for one.
const MAX_ACCOUNT_ID = 2_147_483_647

/**
 * The balance route's key, from its raw path parameter (onRequest runs before validation): only an
 * id the route will read, so the key is the one its handler asks for; anything else, none.
 */
function balanceCacheKey(request: FastifyRequest): string | undefined {
  const raw = (request.params as { accountId?: unknown }).accountId
  if (typeof raw !== 'string' || !/^[1-9][0-9]{0,9}$/.test(raw)) return undefined
  const accountId = Number(raw)
  return accountId > MAX_ACCOUNT_ID ? undefined : accountCacheKey(accountId)
}

/**
 * A miss's admission: the account filter says whether an account of this id may exist. Built here,
 * not inline, so the per-request function is anonymous (tsx names an inline one at every call).
 */
const filterAdmits = (app: FastifyInstance, accountId: number) => () =>
  app.accountFilter.mightExist(accountId)

const accountRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/accounts',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'listAccounts',
        tags: ['accounts'],
        summary: 'List your accounts',
        description:
          "The logged-in customer's accounts with their balances, ordered by id. Cached: a cached list is " +
          'still served while Postgres is down; a transfer invalidates it.',
        response: {
          200: json(Type.Object({ accounts: Type.Array(Account) }), "The customer's accounts."),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
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
      // The entry is peeked in the round trip that loads the session and checks the rate limits;
      // a miss is loaded (lease and all) only by the handler, once both have passed.
      config: { session: 'required', cache: { prefetch: balanceCacheKey } },
      schema: {
        operationId: 'getBalance',
        tags: ['accounts'],
        summary: 'Read the balance of one of your accounts',
        description:
          'The balance of one of your accounts. Another customer’s account answers 404 exactly like one ' +
          'that does not exist. Cached; a transfer invalidates both of its accounts after it commits, so a ' +
          'read that starts after its 201 shows the new balance.',
        params: Type.Object({ accountId: IdParam }),
        response: {
          200: json(Account, 'The account and its balance.'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            404: ['account-not-found'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const { accountId } = request.params
      // Beyond Postgres integer no account exists: answered without a cache key or a query.
      if (accountId > MAX_ACCOUNT_ID) throw accountNotFound(accountId)
      // Cached per account with its owner (unknown ids as "not found"), shared by all customers;
      // another customer's account answers exactly like a missing one.
      // On a miss, the account filter is asked before the database: an id no account has is
      // answered without a query and without a key of its own.
      const account = await app.cache.getOrLoad(
        accountCacheKey(accountId),
        () => getAccountWithOwner(app.db, accountId),
        { admit: filterAdmits(app, accountId) },
      )
      if (!account || account.customerId !== Number(request.session!.principal)) {
        throw accountNotFound(accountId)
      }
      return { accountId, currency: account.currency, balance: account.balance }
    },
  )
}

export default accountRoutes
