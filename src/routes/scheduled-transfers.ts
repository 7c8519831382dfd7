import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import { HttpProblem } from '../errors.ts'
import { accountNotFound, getAccountWithOwner, sameAccount } from '../ledger/ledger.ts'
import { cancelSchedule, getSchedule, insertSchedule, listSchedules } from '../scheduler/store.ts'
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
const ScheduleIdParam = Type.String({
  pattern: '^[1-9][0-9]{0,14}$',
  maxLength: 15,
  description: 'A schedule id: 1 to 15 digits, no leading zero.',
})

const YEAR_MS = 366 * 86_400_000

const scheduleNotFound = (scheduleId: string) =>
  new HttpProblem(
    404,
    'schedule-not-found',
    'Schedule not found',
    `Scheduled transfer ${scheduleId} does not exist or is not yours.`,
  )

const scheduledTransferRoutes: FastifyPluginAsyncTypebox<{ worker: TransferWorker }> = async (
  app,
  { worker },
) => {
  app.post(
    '/scheduled-transfers',
    {
      config: { session: 'required', idempotency: { required: true } },
      schema: {
        operationId: 'createScheduledTransfer',
        tags: ['transfers'],
        summary: 'Schedule a transfer for later',
        description:
          'Schedules a transfer from one of your accounts to run at `runAt`, once per `Idempotency-Key` (a ' +
          'retry with the same key and body replays the first response, with `Idempotent-Replayed: true`). ' +
          'Accounts and currency are checked now; funds when it runs: a schedule whose source lacks the ' +
          'amount then ends `failed`. Follow it with `GET /scheduled-transfers/{scheduleId}`.',
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
              409: ['idempotency-key-in-flight'],
              413: ['payload-too-large'],
              415: ['unsupported-media-type'],
              422: ['currency-mismatch', 'idempotency-key-mismatch'],
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
      const [from, to] = await Promise.all([
        getAccountWithOwner(app.db, fromAccountId),
        getAccountWithOwner(app.db, toAccountId),
      ])
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
      const schedule = await insertSchedule(app.db, { customerId, ...request.body, runAt })
      // Postgres has it now; should Redis not take it, the reconciler queues it before it is due.
      await worker
        .schedule(schedule.scheduleId, runAt)
        .catch((err) => request.log.warn({ err, scheduleId: schedule.scheduleId }, 'schedule not queued'))
      return reply
        .code(201)
        .send({ scheduleId: schedule.scheduleId, status: 'scheduled', runAt: schedule.runAt })
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
        Number(request.params.scheduleId),
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
        Number(request.params.scheduleId),
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
      return reply.code(204).send()
    },
  )
}

export default scheduledTransferRoutes
