/** Caps concurrent loads; callers beyond the cap queue in arrival order. */
export class ConcurrencyLimiter {
  private active = 0
  private readonly queue: Array<() => void> = []

  constructor(private readonly max: number) {}

  async run<T>(task: () => Promise<T>): Promise<T> {
    if (this.active >= this.max) await new Promise<void>((resolve) => this.queue.push(resolve))
    else this.active++
    try {
      return await task()
    } finally {
      // The slot passes straight to the next waiter, so `active` never drops below the queue's need.
      const next = this.queue.shift()
      if (next) next()
      else this.active--
    }
  }
}
