import type { FastifyBaseLogger } from 'fastify'
import type { PrincipalFunction } from '../common/principal.ts'
import type { RateLimitMetrics } from './metrics.ts'
import type { OverrideBook } from './overrides.ts'

/** What the engine (one per plugin instance) is built with. */
export interface EngineOptions {
  keyPrefix: string
  overLimitCacheKeys: number
  retryRedisAfterMs: number
  timeoutMs: number
  /** The plugin's logger (its messages carry `plugin: 'rate-limit'`). */
  log: FastifyBaseLogger
  metrics: RateLimitMetrics
  /** Who the caller is, for key functions such as keyBy.customer (default: nobody). */
  principal?: PrincipalFunction
  /** `store: 'memory'`: every decision in this process, with at most this many keys. */
  memoryMaxKeys?: number
  /** This process's clock in ms since the epoch (the memory stores and the over-limit cache read it). */
  now?: () => number
  /** Runtime overrides of limits per key; null when the plugin has them off. */
  overrides?: OverrideBook | null
}
