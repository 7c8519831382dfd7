import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyBaseLogger } from 'fastify'
import { InvalidArgumentError } from 'fastify-redis-gateway'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import {
  follow,
  type FeedEntry as HydratedEntry,
  hydrate,
  isPublicAccount,
  listPublicAccounts,
  unfollow,
} from '../public-accounts/store.ts'
import { json, noContent, problems } from './openapi.ts'
import { Amount, Currency, Id, IdParam, Timestamp } from './schemas.ts'

const MAX_ACCOUNT_ID = 2_147_483_647
/** Reads of the feed one page of `GET /feed` makes at most, filling it past items that do not hydrate. */
const MAX_FEED_ROUNDS = 5

/** The feed's cursors are base64url of a time and an item id: well under this. */
const MAX_CURSOR_LENGTH = 200

const PublicAccount = Type.Object({
  accountId: Id,
  name: Type.String({ description: 'The public name, e.g. a relief fund’s.', maxLength: 100 }),
  currency: Currency,
  following: Type.Boolean({ description: 'Whether you follow it.' }),
})

const FeedEntry = Type.Object({
  transferId: Id,
  accountId: Type.Integer({ minimum: 1, description: 'The public account that moved money.' }),
  accountName: Type.String({ maxLength: 100 }),
  direction: Type.Union([Type.Literal('in'), Type.Literal('out')], {
    description: '`in`: the public account received the money; `out`: it sent it.',
  }),
  counterparty: Type.String({
    description: 'The other side’s username, masked: first and last character (`alice`: `a***e`).',
    example: 'a***e',
  }),
  amount: Amount,
  currency: Currency,
  occurredAt: Timestamp,
})

const publicAccountNotFound = (accountId: number) =>
  new HttpProblem(
    404,
    'account-not-found',
    'Account not found',
    `Account ${accountId} is not a public account.`,
  )

const feedUnavailable = () =>
  new HttpProblem(
    503,
    'feed-unavailable',
    'Service unavailable',
    'The feed cannot be read or changed now (Redis is not answering); retry shortly.',
    { headers: { 'retry-after': '1' } },
  )

/** A feed call: a bad cursor is the client's (400), anything else Redis's (a 503, logged). */
async function fromFeed<T>(log: FastifyBaseLogger, call: () => Promise<T>): Promise<T> {
  try {
    return await call()
  } catch (err) {
    if (err instanceof InvalidArgumentError)
      throw new HttpProblem(
        400,
        'invalid-cursor',
        'Invalid cursor',
        'The cursor was not issued by this feed.',
      )
    log.warn({ err }, 'feed: Redis call failed')
    throw feedUnavailable()
  }
}

const publicAccountRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/public-accounts',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'listPublicAccounts',
        tags: ['feed'],
        summary: 'List the public accounts',
        description:
          'Accounts that publish their movements (relief funds, campaigns), with whether you follow each. ' +
          'Their transfers in and out appear in the feed of everyone who follows them.',
        response: {
          200: json(
            Type.Object({ publicAccounts: Type.Array(PublicAccount, { maxItems: 100 }) }),
            'The public accounts.',
          ),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request) => ({
      publicAccounts: await listPublicAccounts(app.db, Number(request.session!.principal)),
    }),
  )

  for (const method of ['PUT', 'DELETE'] as const) {
    app.route({
      method,
      url: '/public-accounts/:accountId/follow',
      config: { session: 'required' },
      schema: {
        operationId: method === 'PUT' ? 'followPublicAccount' : 'unfollowPublicAccount',
        tags: ['feed'],
        summary: method === 'PUT' ? 'Follow a public account' : 'Stop following a public account',
        description:
          method === 'PUT'
            ? 'Its movements appear in your feed from now on, and its recent ones at once. Idempotent.'
            : 'Its movements leave your feed at once (filtered at read). Idempotent.',
        params: Type.Object({ accountId: IdParam }),
        response: {
          204: noContent(method === 'PUT' ? 'Followed.' : 'Not followed.'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            404: ['account-not-found'],
            503: ['session-store-unavailable', 'database-unavailable', 'feed-unavailable'],
          }),
        },
      },
      handler: async (request, reply) => {
        const { accountId } = request.params as { accountId: number }
        const customerId = Number(request.session!.principal)
        if (
          accountId > MAX_ACCOUNT_ID ||
          !(await app.accountFilter.mightExist(accountId)) ||
          !(await isPublicAccount(app.db, accountId))
        )
          throw publicAccountNotFound(accountId)
        // Postgres first, the truth the feed is rebuilt from; then the feed (a retry redoes both).
        const feed = app.publicAccounts.feed
        if (method === 'PUT') {
          await follow(app.db, customerId, accountId)
          await fromFeed(request.log, () => feed.follow(String(customerId), String(accountId)))
        } else {
          await unfollow(app.db, customerId, accountId)
          await fromFeed(request.log, () => feed.unfollow(String(customerId), String(accountId)))
        }
        return reply.code(204).send()
      },
    })
  }

  app.get(
    '/feed',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'getFeed',
        tags: ['feed'],
        summary: 'Your feed: the movements of the public accounts you follow',
        description:
          'Newest first, a page at a time: pass the previous page’s `nextCursor` as `cursor` for the next ' +
          '(a page never repeats or skips an item, even while new movements arrive). Counterparties are masked.',
        querystring: Type.Object(
          {
            limit: Type.Optional(
              Type.String({
                pattern: '^(?:[1-9][0-9]?|100)$',
                maxLength: 3,
                description: 'Items per page: 1 to 100, default 20.',
              }),
            ),
            cursor: Type.Optional(Type.String({ minLength: 1, maxLength: MAX_CURSOR_LENGTH })),
          },
          { additionalProperties: false },
        ),
        response: {
          200: json(
            Type.Object({
              items: Type.Array(FeedEntry, { maxItems: 100 }),
              nextCursor: Type.Union([Type.String(), Type.Null()], {
                description: 'The cursor of the next page; null on the last.',
              }),
            }),
            'A page of your feed.',
          ),
          ...problems({
            400: ['validation', 'invalid-cursor'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'database-unavailable', 'feed-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const customerId = String(request.session!.principal)
      const limit = Number(request.query.limit ?? 20)
      const items: HydratedEntry[] = []
      let cursor = request.query.cursor ?? null
      // Items that do not hydrate are dropped: read on to fill the page (a bounded number of times).
      for (let round = 0; round < MAX_FEED_ROUNDS; round++) {
        const page = await fromFeed(request.log, () =>
          app.publicAccounts.feed.read(customerId, { limit: limit - items.length, cursor }),
        )
        const { entries, dropped } = await hydrate(app.db, page.items)
        if (dropped > 0) request.log.warn({ dropped }, 'feed: items dropped at hydration')
        items.push(...entries)
        cursor = page.cursor
        if (items.length === limit || cursor === null) break
      }
      return { items, nextCursor: cursor }
    },
  )
}

export default publicAccountRoutes
