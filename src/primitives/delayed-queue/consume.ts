import { InvalidArgumentError, shown } from '../checks.ts'
import { type ConsumeOptions, type DelayedQueueTask, resolveConsumeOptions } from './options.ts'

// A consumer of a delayed queue: workers that take ready ids, run the handler, acknowledge what
// succeeded and give back, with a backoff, what failed.

export interface Consumer {
  /** Stops taking; resolves once the items in hand have been handled and acknowledged (or nacked). */
  stop(): Promise<void>
}

/** What a consumer needs of its queue. */
export interface ConsumedQueue {
  take(): Promise<string | null>
  ack(id: string): Promise<boolean>
  nack(id: string, delayMs?: number): Promise<boolean>
  onError(error: unknown, task: DelayedQueueTask): void
}

/** Starts `concurrency` workers running `handler` on the queue's ready ids. */
export function startConsumer(
  queue: ConsumedQueue,
  handler: (id: string) => unknown,
  consumeOptions: ConsumeOptions,
): Consumer {
  if (typeof handler !== 'function')
    throw new InvalidArgumentError(
      `delayed queue: \`handler\` must be a function of the id, got ${shown(handler)}`,
    )
  const { concurrency, pollMs, retryDelayMs } = resolveConsumeOptions(consumeOptions)
  const { take, ack, nack, onError } = queue
  // Failed attempts per id in this process (an id that fails here again backs off longer).
  const attempts = new Map<string, number>()
  let halted = false
  const wakers = new Set<() => void>()
  const pause = () =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(done, pollMs)
      function done() {
        clearTimeout(timer)
        wakers.delete(done)
        resolve()
      }
      wakers.add(done)
    })

  async function handle(id: string) {
    let failed = false
    let error: unknown
    try {
      await handler(id)
    } catch (err) {
      failed = true
      error = err
    }
    if (!failed) {
      attempts.delete(id)
      await ack(id).catch((err) => onError(err, 'ack'))
      return
    }
    const attempt = (attempts.get(id) ?? 0) + 1
    attempts.delete(id)
    attempts.set(id, attempt)
    if (attempts.size > 10_000) attempts.delete(attempts.keys().next().value!)
    let delay = 0
    try {
      delay = Math.max(0, Number(retryDelayMs(attempt, id, error)) || 0)
    } catch (err) {
      onError(err, 'retryDelay')
    }
    await nack(id, delay).catch((err) => onError(err, 'nack'))
  }

  async function worker() {
    while (!halted) {
      let id: string | null
      try {
        id = await take()
      } catch (err) {
        onError(err, 'take')
        await pause()
        continue
      }
      if (id === null) await pause()
      else await handle(id)
    }
  }

  const running = Promise.all(Array.from({ length: concurrency }, worker))
  return {
    async stop() {
      halted = true
      for (const wake of [...wakers]) wake()
      await running
    },
  }
}
