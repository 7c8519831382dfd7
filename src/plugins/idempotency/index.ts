import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { redisPluginContext } from '../common/context.ts'
import { pluginRegistered, routeCovered } from '../common/route-coverage.ts'
import { addRouteHook, routeName } from '../common/route-hooks.ts'
import type { IdempotencyContext, IdempotencyOutcome } from './decision.ts'
import {
  claimKey,
  idempotencyContext,
  keepResponse,
  noteGuardMismatch,
  noteGuardReplay,
  releaseInFlight,
  stopRenewal,
} from './handlers.ts'
import { createIdempotencyMetrics } from './metrics.ts'
import {
  type IdempotencyFailureMode,
  type IdempotencyKeySource,
  type IdempotencyPluginOptions,
  type IdempotencyReplay,
  type IdempotencyReplayHook,
  type IdempotencyRouteConfig,
  resolveOptions,
  resolveRouteConfig,
} from './options.ts'
import { type IdempotencyLogger, IdempotencyStore, type StoredResponse } from './store.ts'

export {
  IdempotencyError,
  type IdempotencyErrorCode,
  IdempotencyFingerprintTooLargeError,
  IdempotencyInFlightError,
  IdempotencyKeyInvalidError,
  IdempotencyKeyMismatchError,
  IdempotencyResultNotKeptError,
  IdempotencyStoreUnavailableError,
} from './errors.ts'
export { REPLAYED_HEADER } from './handlers.ts'
export { canonicalJson, parseIdempotencyKey, type RequestTarget, requestFingerprint } from './key.ts'
export { type IdempotentFunction, type MakeIdempotentOptions, makeIdempotent } from './make-idempotent.ts'
export { keyMismatch as idempotencyKeyMismatch } from './problems.ts'
export type {
  IdempotencyContext,
  IdempotencyFailureMode,
  IdempotencyKeySource,
  IdempotencyLogger,
  IdempotencyOutcome,
  IdempotencyPluginOptions,
  IdempotencyReplay,
  IdempotencyReplayHook,
  IdempotencyRouteConfig,
}
export { IdempotencyStore, type StoredResponse }

declare module 'fastify' {
  interface FastifyInstance {
    idempotency: IdempotencyStore
  }
  interface FastifyRequest {
    /**
     * The plugin's decision on a request that came with a valid key (opted-in routes): set in
     * preHandler, before the handler or any answer of the plugin; null without a key (or with one
     * refused before Redis was asked: missing, invalid, no principal).
     */
    idempotency: IdempotencyContext | null
  }
  interface FastifyContextConfig {
    idempotency?: boolean | IdempotencyRouteConfig
  }
}

async function idempotencyPlugin(app: FastifyInstance, options: IdempotencyPluginOptions) {
  const settings = resolveOptions(options)
  pluginRegistered(app, 'idempotency')
  const base = await redisPluginContext(app, 'idempotency', {
    metrics: createIdempotencyMetrics,
    principal: settings.principal,
    redis: {
      redis: settings.redis,
      connectTimeoutMs: settings.connectTimeoutMs,
      eviction: settings.allowEviction ? 'allow' : 'refuse',
      fix: '; or, for routes with a guard of their own that can take an evicted record, pass `allowEviction: true` to the idempotency plugin',
    },
  })
  // The app knows callers with the `principal` option or the session plugin (registered by ready).
  const context = idempotencyContext(
    base,
    settings,
    () => settings.principal !== undefined || app.hasDecorator('sessionPrincipal'),
  )
  app.addHook('onClose', () => releaseInFlight(context))
  app.decorate('idempotency', context.store)
  app.decorateRequest('idempotency', null)

  const keep = keepResponse(context)
  const stop = stopRenewal(context)
  app.addHook('onRoute', (routeOptions) => {
    const route = resolveRouteConfig(routeOptions.config?.idempotency, settings, routeName(routeOptions))
    if (!route) return
    routeCovered(app, 'idempotency', routeOptions)
    addRouteHook(routeOptions, 'preHandler', claimKey(context, route, routeOptions.constraints))
    addRouteHook(routeOptions, 'onSend', noteGuardReplay, 'first')
    addRouteHook(routeOptions, 'onSend', keep)
    addRouteHook(routeOptions, 'onResponse', stop)
    addRouteHook(routeOptions, 'onError', noteGuardMismatch)
  })
}

export default fp(idempotencyPlugin, { name: 'fastify-redis-gateway/idempotency', fastify: '5.x' })
