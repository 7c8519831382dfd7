// What several cache suites build alike: metric reads, a signal.
import type { FastifyInstance } from 'fastify'

/** A cache counter's value for one cache name (its `name` label); 0 before the first count. */
export async function counter(app: FastifyInstance, metric: string, name: string): Promise<number> {
  const found = await app.metrics.registry.getSingleMetric(metric)?.get()
  return found?.values.find((v) => v.labels.name === name)?.value ?? 0
}

/** A promise and the function that settles it. */
export function signal<T = void>() {
  let resolve!: (value: T) => void
  const promise = new Promise<T>((r) => {
    resolve = r
  })
  return { promise, resolve }
}
