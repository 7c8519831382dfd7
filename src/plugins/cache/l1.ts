import { namespaceOf } from './key.ts'

interface Entry {
  value: unknown
  /** The key's namespace, the label of its hit count: kept so that a hit slices no string. */
  name: string
  expiresAt: number
  /** The entry's tags, indexed in `byTag` (undefined for an entry without tags). */
  tags: readonly string[] | undefined
}

/** A small in-process TTL map for hot keys, bounded in entries (the oldest insertion goes first). */
export class L1Cache {
  private readonly entries = new Map<string, Entry>()
  /** Keys of the entries carrying each tag, so a tag invalidation drops them without a scan. */
  private readonly byTag = new Map<string, Set<string>>()
  /** Bumped by every local drop, so a read that raced an invalidation does not store what it read. */
  epoch = 0

  /** `coherent` says whether invalidations from other instances can reach us right now. */
  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
    private readonly coherent: () => boolean,
  ) {}

  get(key: string): { value: unknown; name: string } | undefined {
    if (!this.coherent()) return undefined
    const entry = this.entries.get(key)
    if (!entry) return undefined
    if (entry.expiresAt <= Date.now()) {
      this.remove(key)
      return undefined
    }
    return entry
  }

  set(key: string, value: unknown, epochAtRead: number, tags?: readonly string[]): void {
    if (epochAtRead !== this.epoch) return
    this.remove(key)
    if (this.entries.size >= this.maxEntries) this.remove(this.entries.keys().next().value!)
    this.entries.set(key, { value, name: namespaceOf(key), expiresAt: Date.now() + this.ttlMs, tags })
    if (tags) {
      for (const tag of tags) {
        const keys = this.byTag.get(tag)
        if (keys) keys.add(key)
        else this.byTag.set(tag, new Set([key]))
      }
    }
  }

  private remove(key: string): void {
    const entry = this.entries.get(key)
    if (!entry) return
    this.entries.delete(key)
    if (!entry.tags) return
    for (const tag of entry.tags) {
      const keys = this.byTag.get(tag)
      keys?.delete(key)
      if (keys?.size === 0) this.byTag.delete(tag)
    }
  }

  drop(keys: readonly string[]): void {
    this.epoch++
    for (const key of keys) this.remove(key)
  }

  dropTags(tags: readonly string[]): void {
    this.epoch++
    for (const tag of tags) {
      const keys = this.byTag.get(tag)
      if (keys) for (const key of [...keys]) this.remove(key)
    }
  }

  clear(): void {
    this.epoch++
    this.entries.clear()
    this.byTag.clear()
  }
}
