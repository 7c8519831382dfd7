// What several cache suites build alike: metric reads, the wait for the L1 subscriber, a signal.
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'

/** A cache counter's value for one cache name (its `name` label); 0 before the first count. */
export async function counter(app: FastifyInstance, metric: string, name: string): Promise<number> {
  const found = await app.metrics.registry.getSingleMetric(metric)?.get()
  return found?.values.find((v) => v.labels.name === name)?.value ?? 0
}

/**
 * The L1 is used once its pub/sub subscription is confirmed (shortly after ready), and emptied
 * then: wait until it answers a probe key, so the reads that follow are not dropped by that
 * confirmation.
 */
export async function l1Subscribed(app: FastifyInstance): Promise<void> {
  for (let i = 0; i < 100 && (await counter(app, 'cache_l1_hits_total', 'probe')) === 0; i++) {
    await app.cache.getOrLoad('probe:1', async () => 1)
    await app.cache.getOrLoad('probe:1', async () => 1)
    await sleep(10)
  }
}

/** A promise and the function that settles it. */
export function signal<T = void>() {
  let resolve!: (value: T) => void
  const promise = new Promise<T>((r) => {
    resolve = r
  })
  return { promise, resolve }
}
