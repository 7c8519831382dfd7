import { talliedCounter } from '../common/tallied-counter.ts'

/**
 * Counters labelled by the key's namespace (`account` for `account:42`), a set fixed by the code;
 * created unregistered at registration (see `pluginMetrics`): the metrics plugin exports them.
 * Tallied (hits are counted on every read).
 */
export function createCacheMetrics() {
  const counter = (name: string, help: string) =>
    talliedCounter({ name, help, labelNames: ['name'] as const })
  return {
    hits: counter('cache_hits_total', 'Reads answered by a fresh Redis entry (negative entries included)'),
    misses: counter('cache_misses_total', 'Reads that found no entry in Redis'),
    staleServed: counter('cache_stale_served_total', 'Reads answered past the soft TTL while a refresh runs'),
    loads: counter('cache_loads_total', 'Loader calls (reads of the source of truth)'),
    leaseWaits: counter('cache_lease_waits_total', 'Misses that waited for another caller holding the lease'),
    fenceRejections: counter(
      'cache_fence_rejections_total',
      'Fills refused because an invalidation happened since their generation was read',
    ),
    invalidationFailures: counter(
      'cache_invalidation_failures_total',
      'Keys whose invalidation failed; they stay until their TTL',
    ),
    tagInvalidationFailures: counter(
      'cache_tag_invalidation_failures_total',
      "Tags whose invalidation failed (labelled by the tag's namespace); their entries stay until their TTL",
    ),
    softTimeouts: counter(
      'cache_soft_timeouts_total',
      'Reads answered with the stale copy because their refresh outlasted softTimeoutMs',
    ),
    hardTimeouts: counter(
      'cache_hard_timeouts_total',
      'Reads rejected with CacheLoadTimeoutError after waiting hardTimeoutMs for a load',
    ),
    staleOnError: counter(
      'cache_stale_on_error_total',
      "Reads answered with the stale copy because their refresh's loader threw (onLoadError serve-stale)",
    ),
    l1Hits: counter('cache_l1_hits_total', 'Reads answered by the in-process L1'),
    redisErrors: counter(
      'cache_redis_errors_total',
      'Reads that went to the source of truth because the cache Redis failed or was down',
    ),
  }
}

export type CacheMetrics = ReturnType<typeof createCacheMetrics>
