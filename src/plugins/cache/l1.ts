/** A small in-process TTL map for hot keys, bounded in entries (the oldest insertion goes first). */
export class L1Cache {
  private readonly entries = new Map<string, { value: unknown; expiresAt: number }>()
  /** Bumped by every local drop, so a read that raced an invalidation does not store what it read. */
  epoch = 0

  /** `coherent` says whether invalidations from other instances can reach us right now. */
  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
    private readonly coherent: () => boolean,
  ) {}

  get(key: string): { value: unknown } | undefined {
    if (!this.coherent()) return undefined
    const entry = this.entries.get(key)
    if (!entry) return undefined
    if (entry.expiresAt <= Date.now()) {
      this.entries.delete(key)
      return undefined
    }
    return entry
  }

  set(key: string, value: unknown, epochAtRead: number): void {
    if (epochAtRead !== this.epoch) return
    this.entries.delete(key)
    if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value!)
    this.entries.set(key, { value, expiresAt: Date.now() + this.ttlMs })
  }

  drop(keys: readonly string[]): void {
    this.epoch++
    for (const key of keys) this.entries.delete(key)
  }

  clear(): void {
    this.epoch++
    this.entries.clear()
  }
}
