import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyBaseLogger } from 'fastify'
import { Type } from 'typebox'
import { memberOf, rankedCustomers, weekBoard } from '../campaigns/leaderboard.ts'
import { isoWeek, utcDay } from '../campaigns/periods.ts'
import { readDay } from '../campaigns/stats.ts'
import { HttpProblem } from '../errors.ts'
import { json, problems } from './openapi.ts'
import { Currency } from './schemas.ts'

const DEFAULT_LIMIT = 10
const DEFAULT_CURRENCY = 'VND'

const Period = Type.Literal('week', {
  description:
    'The ranking period: `week`, the current ISO 8601 week (UTC, Monday to Sunday). Default `week`.',
})
const CurrencyQuery = Type.String({
  ...Currency,
  description:
    'The currency ranked (ISO 4217; volumes in different currencies are never added). Default `VND`.',
})
const Volume = Type.Integer({
  minimum: 1,
  maximum: Number.MAX_SAFE_INTEGER,
  description: "The customer's sent volume this period, in the currency's minor unit.",
})
const Rank = Type.Integer({
  minimum: 1,
  description:
    '1 for the largest volume; equal volumes rank the customer who joined the bank first (lower id) first.',
})
const WeekName = Type.String({
  pattern: '^[0-9]{4}-W[0-9]{2}$',
  description: 'The ISO 8601 week ranked (UTC).',
  example: '2026-W49',
})

const LeaderboardPage = Type.Object({
  period: WeekName,
  currency: Currency,
  items: Type.Array(
    Type.Object({
      rank: Rank,
      customer: Type.String({
        description: 'The customer’s username, masked: first and last character (`alice`: `a***e`).',
        example: 'a***e',
      }),
      volume: Volume,
    }),
    { maxItems: 100, description: 'Highest volume first.' },
  ),
})

const MyEntry = Type.Object({
  period: WeekName,
  currency: Currency,
  rank: Type.Union([Rank, Type.Null()], {
    description: 'Your rank; null when you sent nothing in this currency this period.',
  }),
  volume: Type.Integer({
    minimum: 0,
    maximum: Number.MAX_SAFE_INTEGER,
    description: 'Your sent volume this period, in the currency’s minor unit (0 when you sent nothing).',
  }),
})

const TodayStats = Type.Object({
  date: Type.String({ format: 'date', description: 'Today (UTC).', example: '2026-11-30' }),
  transfers: Type.Integer({ minimum: 0, description: 'Transfers made today, by everyone.' }),
  currency: Currency,
  volume: Type.Integer({
    minimum: 0,
    maximum: Number.MAX_SAFE_INTEGER,
    description: 'Money moved today in `currency`, in its minor unit (saturates at 2^53 - 1).',
  }),
  distinctSenders: Type.Integer({
    minimum: 0,
    description:
      'Customers who sent at least one transfer today: a HyperLogLog estimate (0.81 % standard error; ' +
      'small counts come out exact or nearly).',
  }),
})

const leaderboardUnavailable = () =>
  new HttpProblem(
    503,
    'leaderboard-unavailable',
    'Service unavailable',
    'The leaderboard cannot be read now (Redis is not answering); retry shortly.',
    { headers: { 'retry-after': '1' } },
  )

const statsUnavailable = () =>
  new HttpProblem(
    503,
    'stats-unavailable',
    'Service unavailable',
    'Today’s totals cannot be read now (Redis is not answering); retry shortly.',
    { headers: { 'retry-after': '1' } },
  )

/**
 * Runs a Redis read; a failure is logged and answered with `unavailable()` (a 503): the leaderboard
 * and the totals live in Redis only, there is nothing to fall back on.
 */
async function fromRedis<T>(
  log: FastifyBaseLogger,
  unavailable: () => HttpProblem,
  read: () => Promise<T>,
): Promise<T> {
  try {
    return await read()
  } catch (err) {
    log.warn({ err }, 'campaign data: Redis read failed')
    throw unavailable()
  }
}

const campaignRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get(
    '/leaderboard',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'getLeaderboard',
        tags: ['campaigns'],
        summary: 'The top senders of the week',
        description:
          'The customers who sent the most money this ISO week (UTC), highest volume first, with masked ' +
          'usernames. One currency at a time. Counted from the transfer events a few moments after each ' +
          'transfer commits, each transfer exactly once.',
        querystring: Type.Object(
          {
            period: Type.Optional(Period),
            limit: Type.Optional(
              Type.String({
                pattern: '^(?:[1-9][0-9]?|100)$',
                maxLength: 3,
                description: 'How many customers: 1 to 100, default 10.',
              }),
            ),
            currency: Type.Optional(CurrencyQuery),
          },
          { additionalProperties: false },
        ),
        response: {
          200: json(LeaderboardPage, 'The top of the week’s leaderboard (empty before the first transfer).'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'database-unavailable', 'leaderboard-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const week = isoWeek(Date.now()).name
      const currency = request.query.currency ?? DEFAULT_CURRENCY
      const limit = Number(request.query.limit ?? DEFAULT_LIMIT)
      const board = weekBoard(week, currency)
      const entries = await fromRedis(request.log, leaderboardUnavailable, () =>
        app.campaigns.leaderboard.top(board, limit),
      )
      return { period: week, currency, items: await rankedCustomers(app.db, entries) }
    },
  )

  app.get(
    '/leaderboard/me',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'getMyLeaderboardEntry',
        tags: ['campaigns'],
        summary: 'Your place on the week’s leaderboard',
        description:
          'Your rank and sent volume this ISO week (UTC) in one currency, ranked as `GET /leaderboard` ranks ' +
          'everyone; `rank` null and `volume` 0 when you sent nothing in that currency this week.',
        querystring: Type.Object(
          { period: Type.Optional(Period), currency: Type.Optional(CurrencyQuery) },
          { additionalProperties: false },
        ),
        response: {
          200: json(MyEntry, 'Your rank and volume (rank null when you have none).'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'leaderboard-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const week = isoWeek(Date.now()).name
      const currency = request.query.currency ?? DEFAULT_CURRENCY
      const member = memberOf(Number(request.session!.principal))
      const entry = await fromRedis(request.log, leaderboardUnavailable, () =>
        app.campaigns.leaderboard.entry(weekBoard(week, currency), member),
      )
      return { period: week, currency, rank: entry?.rank ?? null, volume: entry?.score ?? 0 }
    },
  )

  app.get(
    '/stats/today',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'getTodayStats',
        tags: ['campaigns'],
        summary: 'Today’s totals of the whole bank',
        description:
          'How many transfers were made today (UTC), how much money they moved in one currency, and how many ' +
          'customers sent one. Counted from the transfer events a few moments after each transfer commits, ' +
          'each transfer exactly once.',
        querystring: Type.Object(
          {
            currency: Type.Optional(
              Type.String({
                ...Currency,
                description: 'The currency of `volume` (ISO 4217). Default `VND`.',
              }),
            ),
          },
          { additionalProperties: false },
        ),
        response: {
          200: json(TodayStats, 'Today’s totals (zeros before the first transfer of the day).'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'stats-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const currency = request.query.currency ?? DEFAULT_CURRENCY
      const day = await fromRedis(request.log, statsUnavailable, () =>
        readDay(app.redis, app.campaigns.prefix, utcDay(Date.now()).name),
      )
      return {
        date: day.date,
        transfers: day.transfers,
        currency,
        volume: day.volume[currency] ?? 0,
        distinctSenders: day.distinctSenders,
      }
    },
  )
}

export default campaignRoutes
