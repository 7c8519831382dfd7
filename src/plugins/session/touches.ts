/** Sessions whose last touch this process remembers (about 100 bytes each). */
const REMEMBERED_TOUCHES = 10_000

/** When this process last slid a session's idle expiry, and by how much. */
export interface Touch {
  at: number
  idle: number
}

/**
 * When this process last slid each session's idle expiry (its own touches only), for the last
 * REMEMBERED_TOUCHES sessions it slid, and when it slides one again.
 */
export class Touches {
  readonly #touched = new Map<string, Touch>()
  readonly #idleTimeoutMs: number
  readonly #touchAfterMs: number

  constructor(idleTimeoutMs: number, touchAfterMs: number) {
    this.#idleTimeoutMs = idleTimeoutMs
    this.#touchAfterMs = touchAfterMs
  }

  /**
   * How long after its last slide a session of this idle timeout is slid again: `touchAfterMs`, or
   * for a session given a shorter idle timeout than the plugin's, the same share of its own (a
   * 60 s session under the default 30 min / 90 s is slid every 3 s). Unscaled, a session whose idle
   * timeout is below `touchAfterMs` would expire between two slides while its user is active.
   */
  after(idle: number): number {
    const full = this.#idleTimeoutMs
    return idle >= full ? this.#touchAfterMs : Math.floor((this.#touchAfterMs * idle) / full)
  }

  /** True when a session last slid at `last` (or never, by this process) is due to slide at `now`. */
  due(last: Touch | undefined, now: number): boolean {
    return last === undefined || now - last.at >= this.after(last.idle)
  }

  get(id: string): Touch | undefined {
    return this.#touched.get(id)
  }

  set(id: string, at: number, idle: number): void {
    this.#touched.delete(id)
    if (this.#touched.size >= REMEMBERED_TOUCHES) this.#touched.delete(this.#touched.keys().next().value!)
    this.#touched.set(id, { at, idle })
  }

  delete(id: string): void {
    this.#touched.delete(id)
  }
}
