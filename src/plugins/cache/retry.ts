import type { FastifyBaseLogger } from 'fastify'

const MAX_PENDING = 10_000

interface Pending {
  giveUpAt: number
  /** Which failure this entry records: a retry that read an older one must not clear a newer one. */
  failure: number
}

/**
 * Failed invalidations, retried with backoff until they succeed or until the entries they target
 * have expired anyway (their longest possible lifetime). The TTL stays the bound; this shortens it
 * for the common case of a brief outage or a timeout while the entry is still readable elsewhere.
 */
export class InvalidationRetry {
  private readonly pending = new Map<string, Pending>()
  private failures = 0
  private timer: NodeJS.Timeout | undefined
  private delayMs = 250
  private closed = false

  constructor(
    private readonly invalidate: (keys: string[]) => Promise<void>,
    private readonly lifetimeMs: number,
    private readonly log: FastifyBaseLogger,
    /** What the queued strings are, in the logs: 'keys' or 'tags'. */
    private readonly kind: 'keys' | 'tags' = 'keys',
  ) {}

  add(keys: readonly string[]): void {
    if (this.closed) return
    const giveUpAt = Date.now() + this.lifetimeMs
    const failure = ++this.failures
    let dropped = 0
    for (const key of keys) {
      if (this.pending.size < MAX_PENDING || this.pending.has(key))
        this.pending.set(key, { giveUpAt, failure })
      else dropped++
    }
    if (dropped)
      this.log.error({ dropped }, 'too many failed cache invalidations queued; these rely on their TTL')
    this.timer ??= setTimeout(() => this.retry(), this.delayMs).unref()
  }

  private async retry(): Promise<void> {
    const now = Date.now()
    for (const [key, { giveUpAt }] of this.pending) if (giveUpAt <= now) this.pending.delete(key)
    // What this attempt covers: a key that fails again while it runs (its invalidation may have
    // reached Redis before that newer change committed) keeps its newer entry and is retried.
    const attempt = [...this.pending].map(([key, { failure }]) => [key, failure] as const)
    const keys = attempt.map(([key]) => key)
    try {
      if (keys.length) await this.invalidate(keys)
      for (const [key, failure] of attempt)
        if (this.pending.get(key)?.failure === failure) this.pending.delete(key)
      if (keys.length) this.log.warn({ [this.kind]: keys }, 'failed cache invalidations completed on retry')
      this.delayMs = 250
    } catch {
      this.delayMs = Math.min(this.delayMs * 2, 5000)
    }
    // add() schedules nothing while this runs (the timer is still set): reschedule what is left.
    this.timer =
      this.pending.size && !this.closed ? setTimeout(() => this.retry(), this.delayMs).unref() : undefined
  }

  close(): void {
    this.closed = true
    clearTimeout(this.timer)
    this.timer = undefined
  }
}
