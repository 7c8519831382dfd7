import type { FastifyRequest } from 'fastify'
import { describeValue } from '../../redis/client.ts'
import type { RateLimitContext } from './context.ts'
import { type Duration, durationOption } from './duration.ts'
import { RateLimitArgumentError } from './errors.ts'
import type { LeaseReport } from './leases.ts'
import type { RateLimitResult } from './outcome.ts'
import type { RateLimitOverrides } from './overrides.ts'
import { reconcile } from './settlements.ts'
import type { Decision } from './types.ts'

/** `app.rateLimiter`: the plugin's policies, by name, for code outside a route's hooks. */
export interface RateLimitDecorator {
  /** Checks policies by name for this request without consuming anything. */
  peek(request: FastifyRequest, names: string | string[]): Promise<Decision[]>
  /**
   * Consumes `cost` (default 1; 0 only checks) of `key`'s quota under a policy, without a route:
   * `key` is the identity a key function would return (`ip:192.0.2.1`, `username:alice`), so a
   * route and this call share one quota. `request` is needed only for a per-request limit or window.
   */
  consume(policy: string, key: string, cost?: number, request?: FastifyRequest): Promise<RateLimitResult>
  /** Clears `key`'s counter and block under a policy (after a successful login, say). */
  reset(policy: string, key: string, request?: FastifyRequest): Promise<void>
  /** Rejects `key` under a policy (one with `blockMs`) for `ms` from now, on every instance. */
  block(policy: string, key: string, ms: Duration): Promise<void>
  /**
   * Buffered policies: renews this instance's heartbeat and gives back its idle leases now (the
   * sync timer does it every `sync.intervalMs`).
   */
  sync(): Promise<void>
  /** Buffered policies: the live instances this one counts, and the unused units it holds per policy. */
  leases(): LeaseReport
  /**
   * Reconciles what `request` reserved under the `settle` policy `policy` with its actual cost
   * (a whole number, 0 or more): the rest is given back, or the excess charged. Once per request;
   * a policy with a settle function is then not settled again when the response ends.
   */
  settle(request: FastifyRequest, policy: string, actual: number): Promise<void>
  /**
   * Runtime overrides of a policy's limit per key (the plugin's `overrides` option; without it every
   * call throws `RateLimitArgumentError`).
   */
  readonly overrides: RateLimitOverrides
}

/** `app.rateLimiter.overrides` of a plugin registered without `overrides`. */
const OVERRIDES_OFF: RateLimitOverrides = (() => {
  const off = async (): Promise<never> => {
    throw new RateLimitArgumentError(
      'rate-limit plugin: overrides are off: register the plugin with `overrides: true` to change limits at runtime',
    )
  }
  return { set: off, remove: off, list: off, history: off, refresh: off }
})()

export function rateLimiterApi({ engine, policies, metrics }: RateLimitContext): RateLimitDecorator {
  return {
    async peek(request, names) {
      const named = [names].flat().map((name) => policies.byName(name, 'peek()'))
      return (await engine.evaluate(request, named, 'peek'))?.decisions ?? []
    },
    async consume(name, key, cost = 1, request) {
      const policy = policies.byName(name, 'consume()')
      checkKey(key, 'consume()')
      if (!Number.isSafeInteger(cost) || cost < 0)
        throw new RateLimitArgumentError(
          'rate-limit plugin: consume(): `cost` must be a whole number of units (0 or more)',
        )
      if (policy.algorithm === 'concurrency' && cost > 0)
        throw new RateLimitArgumentError(
          `rate-limit plugin: consume(): policy '${policy.name}' counts requests in flight, whose slots a route gives back when its response ends: put it on a route (cost 0 only checks)`,
        )
      return engine.consume(policy, key, cost, request)
    },
    async reset(name, key, request) {
      const policy = policies.byName(name, 'reset()')
      await engine.reset(policy, checkKey(key, 'reset()'), request)
    },
    async block(name, key, ms) {
      const policy = policies.byName(name, 'block()')
      checkKey(key, 'block()')
      if (policy.blockMs === 0)
        throw new RateLimitArgumentError(
          `rate-limit plugin: block(): policy '${policy.name}' has no \`blockMs\` (blocks are checked only for policies that set it)`,
        )
      const duration = durationOption('ms', ms, 1, (message) => {
        throw new RateLimitArgumentError(`rate-limit plugin: block(): ${message}`)
      })
      await engine.block(policy, key, duration)
    },
    sync: async () => engine.buffered?.sync(),
    leases: () => engine.buffered?.leaseReport() ?? { instances: 1, policies: {} },
    overrides: engine.overrides?.api ?? OVERRIDES_OFF,
    async settle(request, name, actual) {
      const policy = policies.byName(name, 'settle()')
      if (!Number.isSafeInteger(actual) || actual < 0)
        throw new RateLimitArgumentError(
          `rate-limit plugin: settle(): \`actual\` must be a whole number of units (0 or more), got ${describeValue(actual)}`,
        )
      const reservation = request.rateLimitReservations?.find(
        (r) => r.reserved.policy === policy && !r.settled,
      )
      if (!reservation)
        throw new RateLimitArgumentError(
          `rate-limit plugin: settle(): this request has no reservation under policy '${policy.name}' to settle (the policy has no \`settle\`, did not apply to it, or it was settled already)`,
        )
      await reconcile(engine, metrics, request, reservation, actual)
    },
  }
}

function checkKey(key: unknown, caller: string): string {
  if (typeof key !== 'string' || key.length === 0)
    throw new RateLimitArgumentError(
      `rate-limit plugin: ${caller}: \`key\` must be a non-empty string (the identity a key function returns), got ${describeValue(key)}`,
    )
  return key
}
