import type { FastifyBaseLogger, FastifyInstance, FastifyRequest } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'
import { bootPluginRedis } from '../../redis/server.ts'
import { type PrincipalFunction, resolvePrincipal } from '../common/principal.ts'
import { parseDuration } from './duration.ts'
import { RateLimitEngine } from './engine.ts'
import { DEFAULT_IPV6_SUBNET } from './keys.ts'
import { createMetrics, type RateLimitMetrics } from './metrics.ts'
import { pluginCheck } from './options.ts'
import { PolicyBook } from './policies.ts'
import { allowListPredicate } from './policy.ts'
import type { RateLimitPluginOptions } from './types.ts'

/**
 * What one instance of the plugin works with: built at registration, before its first hook, and
 * never replaced. Its hooks, its decorator and its ready check all read this one object.
 */
export interface RateLimitContext {
  /** Null with `store: 'memory'`. */
  readonly redis: RedisClient | null
  readonly engine: RateLimitEngine
  readonly policies: PolicyBook
  /** Counted from the start; handed to the metrics plugin's registry once the app is ready. */
  readonly metrics: RateLimitMetrics
  /** The app's logger with `plugin: 'rate-limit'`. */
  readonly log: FastifyBaseLogger
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

/** The context of a plugin instance whose options were checked; waits for its Redis to be ready. */
export async function createContext(
  app: FastifyInstance,
  options: RateLimitPluginOptions,
): Promise<RateLimitContext> {
  const memory = options.store === 'memory'
  const redis = memory
    ? null
    : await bootPluginRedis(app, 'rate-limit', {
        redis: options.redis,
        connectTimeoutMs: options.connectTimeoutMs,
        eviction: 'warn',
      })
  const policies = new PolicyBook(options, {
    ipv6Subnet: options.ipv6Subnet ?? DEFAULT_IPV6_SUBNET,
    onExceeded: options.onExceeded ?? null,
    errorResponse: options.errorResponse ?? null,
  })
  const log = app.log.child({ plugin: 'rate-limit' })
  const metrics = createMetrics()
  const engine = new RateLimitEngine(redis, {
    keyPrefix: options.keyPrefix ?? 'rl:',
    // In memory every decision is as cheap as the cache would be.
    overLimitCacheKeys: memory ? 0 : (options.overLimitCacheKeys ?? 10_000),
    retryRedisAfterMs: parseDuration(options.retryRedisAfterMs ?? 1000)!,
    timeoutMs: parseDuration(options.timeoutMs ?? 500)!,
    log,
    metrics,
    principal: principalOf(app, options.principal),
    memoryMaxKeys: options.memoryMaxKeys ?? 100_000,
    now: options.now ?? Date.now,
  })
  return {
    redis,
    engine,
    policies,
    metrics,
    log,
    allow: allowListPredicate(options.allowList, pluginCheck.fail),
    legacyHeaders: options.legacyHeaders ?? false,
    routes: { limited: 0, foreignConfigs: [] },
  }
}

/**
 * The `principal` option, else the session plugin's, looked up when a key function asks: the
 * session plugin may be registered after this one, and no request comes before the app is ready.
 */
function principalOf(app: FastifyInstance, option: PrincipalFunction | undefined): PrincipalFunction {
  return option ?? ((request) => resolvePrincipal(app, undefined)(request))
}
