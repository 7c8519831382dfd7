import type { FastifyBaseLogger } from 'fastify'

const MAX_PENDING = 10_000

/**
 * Failed invalidations, retried with backoff until they succeed or until the entries they target
 * have expired anyway (their longest possible lifetime). The TTL stays the bound; this shortens it
 * for the common case of a brief outage or a timeout while the entry is still readable elsewhere.
 */
export class InvalidationRetry {
  private readonly pending = new Map<string, number>()
  private timer: NodeJS.Timeout | undefined
  private delayMs = 250

  constructor(
    private readonly invalidate: (keys: string[]) => Promise<void>,
    private readonly lifetimeMs: number,
    private readonly log: FastifyBaseLogger,
  ) {}

  add(keys: readonly string[]): void {
    const giveUpAt = Date.now() + this.lifetimeMs
    let dropped = 0
    for (const key of keys) {
      if (this.pending.size < MAX_PENDING || this.pending.has(key)) this.pending.set(key, giveUpAt)
      else dropped++
    }
    if (dropped)
      this.log.error({ dropped }, 'too many failed cache invalidations queued; these rely on their TTL')
    this.timer ??= setTimeout(() => this.retry(), this.delayMs).unref()
  }

  private async retry(): Promise<void> {
    const now = Date.now()
    for (const [key, giveUpAt] of this.pending) if (giveUpAt <= now) this.pending.delete(key)
    const keys = [...this.pending.keys()]
    try {
      if (keys.length) await this.invalidate(keys)
      for (const key of keys) this.pending.delete(key)
      if (keys.length) this.log.warn({ keys }, 'failed cache invalidations completed on retry')
      this.delayMs = 250
    } catch {
      this.delayMs = Math.min(this.delayMs * 2, 5000)
    }
    this.timer = this.pending.size ? setTimeout(() => this.retry(), this.delayMs).unref() : undefined
  }

  close(): void {
    clearTimeout(this.timer)
    this.timer = undefined
  }
}
