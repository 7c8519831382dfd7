import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyReply } from 'fastify'
import { idempotencyKeyMismatch } from 'fastify-redis-gateway'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { getAccountWithOwner } from '../ledger/ledger.ts'
import { accountNotFound, sameAccount } from '../ledger/refusals.ts'
import {
  cancelSchedule,
  createSchedule,
  findScheduleByKey,
  getSchedule,
  listSchedules,
  type PreviousSchedule,
  type ScheduleIdempotency,
} from '../scheduler/store.ts'
import type { TransferWorker } from '../scheduler/transfer-worker.ts'
import { HEADERS, json, noContent, problems } from './openapi.ts'
import { Amount, Currency, Id, Timestamp } from './schemas.ts'

const ScheduleBody = Type.Object(
  {
    fromAccountId: Type.Integer({ ...Id, description: 'One of your accounts.' }),
    toAccountId: Type.Integer({ ...Id, description: 'Any account in the same currency, not the source.' }),
    amount: Amount,
    currency: Type.String({ ...Currency, description: 'ISO 4217 code; must be both accounts’ currency.' }),
    runAt: Type.String({
      format: 'date-time',
      maxLength: 64,
      description: 'When to run it: RFC 3339 with a time zone, in the future, at most one year ahead.',
    }),
  },
  {
    additionalProperties: false,
    examples: [
      { fromAccountId: 1, toAccountId: 2, amount: 50000, currency: 'VND', runAt: '2030-01-01T09:00:00Z' },
    ],
  },
)

const ScheduleId = Type.Integer({ minimum: 1, description: 'The schedule’s id.' })
const ScheduleStatus = Type.Union(
  ['scheduled', 'running', 'completed', 'failed', 'cancelled'].map((s) => Type.Literal(s)),
  {
    description:
      '`scheduled` (waiting; cancellable), `running` (due and being executed, or retried after a transient ' +
      'error), `completed` (the transfer was made: `transferId`), `failed` (refused when it ran: `failure`), ' +
      '`cancelled`.',
  },
)
const Failure = Type.Object(
  {
    type: Type.String({ description: 'The problem type the run met, e.g. `/problems/insufficient-funds`.' }),
    title: Type.String(),
    detail: Type.String(),
  },
  { description: 'Why the schedule failed (present when `failed`).' },
)
const Schedule = Type.Object({
  scheduleId: ScheduleId,
  status: ScheduleStatus,
  runAt: Timestamp,
  transferId: Type.Optional(
    Type.Integer({ minimum: 1, description: 'The transfer it made (present when `completed`).' }),
  ),
  failure: Type.Optional(Failure),
})
const ScheduleCreated = Type.Object({
  scheduleId: ScheduleId,
  status: Type.Literal('scheduled'),
  runAt: Timestamp,
})
// An integer like the schedule's `scheduleId` (read from the path by readIntegerParams).
const ScheduleIdParam = Type.Integer({
  minimum: 1,
  maximum: 999_999_999_999_999,
  description: 'A schedule id, in the path as 1 to 15 digits without a leading zero.',
})

const YEAR_MS = 366 * 86_400_000

const scheduleNotFound = (scheduleId: number) =>
  new HttpProblem(
    404,
    'schedule-not-found',
    'Schedule not found',
    `Scheduled transfer ${scheduleId} does not exist or is not yours.`,
  )

const tooManyPending = (pending: number, earliestDueInMs: number) =>
  new HttpProblem(
    409,
    'too-many-pending-schedules',
    'Too many pending schedules',
    `You have ${pending} scheduled transfers waiting to run, the most allowed; cancel one or retry once one has run.`,
    // When the earliest of them is due: running it frees a place.
    { headers: { 'retry-after': String(Math.max(1, Math.ceil(earliestDueInMs / 1000))) } },
  )

/** The schedule made earlier with this key: its response again, or 422 for another request. */
function replay(reply: FastifyReply, previous: PreviousSchedule, idempotency: ScheduleIdempotency) {
  if (previous.fingerprint !== idempotency.fingerprint) throw idempotencyKeyMismatch()
  return reply.code(201).header('idempotent-replayed', 'true').send(previous.response)
}

const scheduledTransferRoutes: FastifyPluginAsyncTypebox<{
  worker: TransferWorker
  /** A customer's unfinished schedules at most (SCHEDULED_TRANSFERS_MAX_PENDING). */
  maxPending: number
}> = async (app, { worker, maxPending }) => {
  app.post(
    '/scheduled-transfers',
    {
      config: {
        session: 'required',
        idempotency: { required: true },
        rateLimits: app.hasDecorator('rateLimiter') ? 'transfers' : false,
      },
      schema: {
        operationId: 'createScheduledTransfer',
        tags: ['transfers'],
        summary: 'Schedule a transfer for later',
        description:
          'Schedules a transfer from one of your accounts to run at `runAt`, once per `Idempotency-Key` (a ' +
          'retry with the same key and body replays the first response, with `Idempotent-Replayed: true`, ' +
          'also once the idempotency store lost its record: the key is kept with the schedule). Accounts ' +
          'and currency are checked now; funds when it runs: a schedule whose source lacks the amount then ' +
          'ends `failed`. Follow it with `GET /scheduled-transfers/{scheduleId}`. Rate limited per ' +
          'customer with `POST /transfers` (`transfers`, replays included); a customer has at most ' +
          '`SCHEDULED_TRANSFERS_MAX_PENDING` schedules `scheduled` or `running` (409 ' +
          '`too-many-pending-schedules`).',
        body: ScheduleBody,
        response: {
          201: json(ScheduleCreated, 'The transfer is scheduled (or this is the replay for this key).', {
            'Idempotent-Replayed': HEADERS['Idempotent-Replayed'],
          }),
          ...problems(
            {
              400: [
                'validation',
                'bad-request',
                'same-account',
                'run-at-out-of-range',
                'idempotency-key-missing',
                'idempotency-key-invalid',
              ],
              401: ['unauthenticated'],
              404: ['account-not-found'],
              409: ['idempotency-key-in-flight', 'too-many-pending-schedules'],
              413: ['payload-too-large'],
              415: ['unsupported-media-type'],
              422: ['currency-mismatch', 'idempotency-key-mismatch'],
              429: ['rate-limited'],
              503: ['session-store-unavailable', 'database-unavailable', 'idempotency-store-unavailable'],
            },
            { replayable: [400, 404, 422] },
          ),
        },
      },
    },
    async (request, reply) => {
      const customerId = Number(request.session!.principal)
      const { fromAccountId, toAccountId, currency } = request.body
      const idempotency = request.idempotency
        ? { key: request.idempotency.key, fingerprint: request.idempotency.fingerprint }
        : undefined
      const [previous, from, to] = await Promise.all([
        idempotency ? findScheduleByKey(app.db, customerId, idempotency.key) : null,
        getAccountWithOwner(app.db, fromAccountId),
        getAccountWithOwner(app.db, toAccountId),
      ])
      // A key used before is answered for before anything else is said about the request (its
      // runAt may be past by now): Postgres keeps it when the idempotency store lost its record.
      if (previous && idempotency) return replay(reply, previous, idempotency)
      const runAt = new Date(request.body.runAt)
      const now = Date.now()
      if (!(runAt.getTime() > now && runAt.getTime() <= now + YEAR_MS)) {
        throw new HttpProblem(
          400,
          'run-at-out-of-range',
          'Run time out of range',
          '`runAt` must be in the future and at most one year ahead.',
        )
      }
      if (fromAccountId === toAccountId) throw sameAccount()
      if (!from || from.customerId !== customerId) throw accountNotFound(fromAccountId)
      if (!to) throw accountNotFound(toAccountId)
      for (const account of [from, to]) {
        if (account.currency !== currency)
          throw new HttpProblem(
            422,
            'currency-mismatch',
            'Currency mismatch',
            `The transfer is in ${currency}; account ${account.accountId} cannot ${account === from ? 'send' : 'receive'} it.`,
          )
      }
      const outcome = await createSchedule(
        app.db,
        { customerId, ...request.body, runAt },
        idempotency,
        maxPending,
      )
      // Another request with this key committed meanwhile (only a keyed request finds one).
      if ('previous' in outcome) return replay(reply, outcome.previous, idempotency!)
      if ('pendingLimit' in outcome)
        throw tooManyPending(outcome.pendingLimit.pending, outcome.pendingLimit.earliestDueInMs)
      const { created } = outcome
      // Postgres has it now; should Redis not take it, the reconciler queues it before it is due.
      await worker
        .schedule(created.scheduleId, runAt)
        .catch((err) => request.log.warn({ err, scheduleId: created.scheduleId }, 'schedule not queued'))
      return reply.code(201).send(created)
    },
  )

  app.get(
    '/scheduled-transfers',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'listScheduledTransfers',
        tags: ['transfers'],
        summary: 'List your scheduled transfers',
        description: 'Your scheduled transfers, newest first (the latest 100), with their status.',
        response: {
          200: json(Type.Object({ scheduledTransfers: Type.Array(Schedule) }), 'Your scheduled transfers.'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request) => ({
      scheduledTransfers: await listSchedules(app.db, Number(request.session!.principal)),
    }),
  )

  app.get(
    '/scheduled-transfers/:scheduleId',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'getScheduledTransfer',
        tags: ['transfers'],
        summary: 'Read one of your scheduled transfers',
        description:
          'Its status, with the transfer it made once `completed` or the reason once `failed`. Another ' +
          'customer’s schedule answers 404 exactly like one that does not exist.',
        params: Type.Object({ scheduleId: ScheduleIdParam }),
        response: {
          200: json(Schedule, 'The scheduled transfer.'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            404: ['schedule-not-found'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request) => {
      const schedule = await getSchedule(
        app.db,
        Number(request.session!.principal),
        request.params.scheduleId,
      )
      if (!schedule) throw scheduleNotFound(request.params.scheduleId)
      return schedule
    },
  )

  app.delete(
    '/scheduled-transfers/:scheduleId',
    {
      config: { session: 'required' },
      schema: {
        operationId: 'cancelScheduledTransfer',
        tags: ['transfers'],
        summary: 'Cancel a scheduled transfer',
        description:
          'Cancels a schedule that is still `scheduled`. Once it is `running` or finished it can no longer ' +
          'be cancelled (409): a cancel racing its run waits for the run and answers with its outcome.',
        params: Type.Object({ scheduleId: ScheduleIdParam }),
        response: {
          204: noContent('Cancelled: it will not run.'),
          ...problems({
            400: ['validation'],
            401: ['unauthenticated'],
            404: ['schedule-not-found'],
            409: ['schedule-not-cancellable'],
            503: ['session-store-unavailable', 'database-unavailable'],
          }),
        },
      },
    },
    async (request, reply) => {
      const outcome = await cancelSchedule(
        app.db,
        Number(request.session!.principal),
        request.params.scheduleId,
      )
      if (outcome === null) throw scheduleNotFound(request.params.scheduleId)
      if (outcome !== 'cancelled') {
        throw new HttpProblem(
          409,
          'schedule-not-cancellable',
          'Schedule not cancellable',
          `Scheduled transfer ${request.params.scheduleId} is ${outcome.status}; only a scheduled one can be cancelled.`,
          // Every 409 of the gateway carries Retry-After; a running one finishes within seconds.
          { headers: { 'retry-after': '1' } },
        )
      }
      // Its queue entry would only be delivered to find it cancelled; should Redis not answer, it is.
      await worker
        .unschedule(request.params.scheduleId)
        .catch((err) =>
          request.log.warn({ err, scheduleId: request.params.scheduleId }, 'schedule not unqueued'),
        )
      return reply.code(204).send()
    },
  )
}

export default scheduledTransferRoutes
