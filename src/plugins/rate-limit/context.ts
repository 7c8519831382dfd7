import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'
import { type PluginContext, pluginContext, redisPluginContext } from '../common/context.ts'
import { RateLimitEngine } from './engine.ts'
import { createRateLimitMetrics, type RateLimitMetrics } from './metrics.ts'
import type { RateLimitSettings } from './options.ts'
import { OverrideBook } from './overrides.ts'
import { PolicyBook } from './policies.ts'

/**
 * What one instance of the plugin works with: built at registration, before its first hook, and
 * never replaced. Its hooks, its decorator and its ready check all read this one object.
 */
export interface RateLimitContext extends PluginContext<RateLimitMetrics> {
  /** Null with `store: 'memory'`. */
  readonly redis: RedisClient | null
  readonly engine: RateLimitEngine
  readonly policies: PolicyBook
  /** The plugin's `allowList`: requests no policy applies to. */
  readonly allow: ((request: FastifyRequest) => boolean) | null
  readonly legacyHeaders: boolean
  /** What the routes registered so far brought, checked once the app is ready. */
  readonly routes: {
    /** Routes that got at least one policy. */
    limited: number
    /** Routes carrying @fastify/rate-limit's `config.rateLimit`, refused unless that plugin is registered. */
    readonly foreignConfigs: Array<{ where: string; value: unknown }>
  }
}

/** The context of a plugin instance from its settings; waits for its Redis to be ready. */
export async function createContext(
  app: FastifyInstance,
  settings: RateLimitSettings,
): Promise<RateLimitContext> {
  const parts = { metrics: createRateLimitMetrics, principal: settings.principal }
  const memory = settings.store === 'memory'
  const base = memory
    ? { ...pluginContext(app, 'rate-limit', parts), redis: null }
    : await redisPluginContext(app, 'rate-limit', {
        ...parts,
        redis: { redis: settings.redis, connectTimeoutMs: settings.connectTimeoutMs, eviction: 'warn' },
      })
  const policies = new PolicyBook(settings, {
    ipv6Subnet: settings.ipv6Subnet,
    onExceeded: settings.onExceeded ?? null,
    errorResponse: settings.errorResponse ?? null,
  })
  const overrides = settings.overrides
    ? new OverrideBook({
        redis: base.redis,
        keyPrefix: settings.keyPrefix,
        pollMs: settings.overrides.pollMs,
        policies,
        now: settings.now ?? Date.now,
        log: base.log,
        changed: (action) => base.metrics.overrideChanged(action),
      })
    : null
  if (overrides) base.metrics.overrideSources.add(() => overrides.counts())
  const engine = new RateLimitEngine(base.redis, {
    keyPrefix: settings.keyPrefix,
    // In memory every decision is as cheap as the cache would be.
    overLimitCacheKeys: memory ? 0 : settings.overLimitCacheKeys,
    retryRedisAfterMs: settings.retryRedisAfterMs,
    timeoutMs: settings.timeoutMs,
    log: base.log,
    metrics: base.metrics,
    principal: base.principal,
    memoryMaxKeys: settings.memoryMaxKeys,
    now: settings.now,
    overrides,
  })
  return Object.freeze({
    ...base,
    engine,
    policies,
    allow: settings.allowList,
    legacyHeaders: settings.legacyHeaders,
    routes: { limited: 0, foreignConfigs: [] },
  })
}
