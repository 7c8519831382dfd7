import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { PrincipalFunction } from '../common/principal.ts'
import { pluginRegistered } from '../common/route-coverage.ts'
import { type RateLimitDecorator, rateLimiterApi } from './api.ts'
import { createContext } from './context.ts'
import { checkReady, limitNotFound, limitRoute } from './hooks.ts'
import { RATE_LIMIT_OPTIONS, type RateLimitPluginOptions } from './options.ts'
import type { Refund } from './outcome.ts'
import type { Reservation } from './settlements.ts'
import type { RouteRateLimit } from './types.ts'

export type { RateLimitDecorator } from './api.ts'
export type { Duration } from './duration.ts'
export {
  RateLimitArgumentError,
  RateLimitError,
  RateLimitNoPolicyError,
  RateLimitPolicyConflictError,
  RateLimitUnknownPolicyError,
} from './errors.ts'
export { clientAddress, type KeyFunction, keyBy } from './keys.ts'
export type { LeaseReport } from './leases.ts'
export type { RateLimitPluginOptions } from './options.ts'
export type { RateLimitResult } from './outcome.ts'
export {
  MAX_OVERRIDES,
  type Override,
  type OverrideChange,
  type OverrideInput,
  type OverrideNote,
  overrideKeys,
} from './override-store.ts'
export type { RateLimitOverrides } from './overrides.ts'
export type { Algorithm } from './protocol.ts'
export type {
  AllowList,
  AsyncKeyFunction,
  BanHandler,
  BanOptions,
  Decision,
  ErrorResponseBuilder,
  ExceededHandler,
  FailureMode,
  LimitFunction,
  RateLimitPolicy,
  RouteRateLimit,
  SettleFunction,
  ShadowOptions,
  SyncOptions,
} from './types.ts'
export type { PrincipalFunction }

declare module 'fastify' {
  // Not `rateLimit`: @fastify/rate-limit declares that name, and its types may share a program with ours.
  interface FastifyContextConfig {
    rateLimits?: RouteRateLimit
  }
  interface FastifyInstance {
    rateLimiter: RateLimitDecorator
  }
  interface FastifyRequest {
    rateLimitRefunds: Refund[] | null
    rateLimitReservations: Reservation[] | null
  }
}

/**
 * Options read, then one context (Redis ready, policies checked, engine, metrics, logger) built
 * before any hook; every hook, the decorator and the ready check read that context.
 */
async function rateLimitPlugin(app: FastifyInstance, options: RateLimitPluginOptions) {
  const settings = RATE_LIMIT_OPTIONS.read(options)
  pluginRegistered(app, 'rateLimits')
  const context = await createContext(app, settings)
  app.decorateRequest('rateLimitRefunds', null)
  app.decorateRequest('rateLimitReservations', null)
  app.decorate<RateLimitDecorator>('rateLimiter', rateLimiterApi(context))
  app.addHook('onRoute', limitRoute(app, context))
  limitNotFound(app, context)
  app.addHook('onReady', async () => {
    checkReady(app, context)
    await context.engine.buffered?.startSync(context.policies.all)
    await context.engine.overrides?.start()
  })
  app.addHook('onClose', async () => context.engine.close())
}

export default fp(rateLimitPlugin, { name: 'fastify-redis-gateway/rate-limit', fastify: '5.x' })
