import { keyBy, type RateLimitPluginOptions } from 'fastify-redis-gateway'
import type { Config } from './config.ts'
import { exportedBytes } from './routes/statement.ts'
import { transferAttemptCounts } from './routes/transfers.ts'

/** What a statement export reserves of the daily byte budget when it starts (settled with what it sent). */
export const EXPORT_ESTIMATE_BYTES = 256 * 1024

/** The stricter transfers limit the demo runs in shadow mode (RATE_LIMIT_TRANSFERS_SHADOW). */
export const TRANSFERS_SHADOW = 'transfers-shadow'

/**
 * The demo's rate-limit policies (docs/rate-limit.md, "In the demo gateway"): the gateway registers
 * them, and `npm run limits` names them when it changes an override.
 */
export function demoRateLimits(
  limits: Config['rateLimits'],
): Pick<RateLimitPluginOptions, 'defaults' | 'policies' | 'namedPolicies'> {
  return {
    defaults: { onRedisError: 'local' },
    policies: [
      {
        name: 'ip',
        algorithm: 'token-bucket',
        limit: limits.ip.capacity,
        refillPerSecond: limits.ip.refillPerSecond,
        // A flood limit: decided from leases, with the error bounds docs/rate-limit.md states.
        // The money and security limits below stay exact.
        sync: limits.ip.sync,
      },
    ],
    namedPolicies: [
      // scrypt costs ~50 ms of CPU: one IP gets this many password checks, a new username each time or not.
      { name: 'login-ip', algorithm: 'sliding-counter', ...limits.loginIp },
      {
        name: 'login',
        algorithm: 'sliding-log',
        ...limits.login,
        key: keyBy.bodyField('username'),
        hook: 'preHandler',
        countOnlyFailures: (reply) => reply.statusCode === 401,
      },
      // preHandler: the session is known from preParsing on (see the session plugin). Checked
      // before the Idempotency-Key, then given back by replays and key mismatches.
      {
        name: 'transfers',
        algorithm: 'fixed-window',
        ...limits.transfers,
        key: keyBy.customer,
        hook: 'preHandler',
        countOnlyFailures: transferAttemptCounts,
      },
      // What a stricter transfers limit would refuse, dark-launched: counted the same way,
      // logged and counted as would_reject, never enforced (docs/rate-limit.md, shadow policies).
      ...(limits.transfersShadow
        ? [
            {
              name: TRANSFERS_SHADOW,
              algorithm: 'fixed-window' as const,
              ...limits.transfersShadow,
              key: keyBy.customer,
              hook: 'preHandler' as const,
              countOnlyFailures: transferAttemptCounts,
              shadow: true,
            },
          ]
        : []),
      // Statement exports: a few of a customer at once, and a daily budget of bytes, reserved as an
      // estimate and settled with the bytes the export sent (docs/demo/http-api.md).
      {
        name: 'exports',
        algorithm: 'concurrency',
        limit: limits.exports,
        leaseMs: '10 minutes',
        key: keyBy.customer,
        hook: 'preHandler',
      },
      {
        name: 'export-bytes',
        algorithm: 'token-bucket',
        limit: limits.exportBytes,
        refillPerSecond: limits.exportBytes / 86_400,
        cost: Math.min(EXPORT_ESTIMATE_BYTES, limits.exportBytes),
        quotaUnit: 'bytes',
        settle: exportedBytes,
        key: keyBy.customer,
        hook: 'preHandler',
      },
    ],
  }
}
