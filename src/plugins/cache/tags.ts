import { callScript } from '../../redis/scripts.ts'
import type { GetReply } from './entry.ts'
import { CACHE_TAGS } from './scripts.ts'
import { type EntryStore, type GetAttempt, token } from './store.ts'
import type { CacheSettings } from './types.ts'

/** The tags of "tag=generation,..." (tags and generations never contain ',' or '='). */
export const tagsOf = (recorded: string) =>
  recorded.split(',').map((pair) => pair.slice(0, pair.indexOf('=')))

/**
 * Tags: each has a generation in a slot of its own (the tag is its hash tag). A tagged entry records
 * "tag=generation,..." as read before its load, and counts only while those are still the current
 * generations; invalidating a tag gives it a new one.
 */
export class CacheTags {
  constructor(
    private readonly store: EntryStore,
    private readonly settings: CacheSettings,
  ) {}

  private key(tag: string): string {
    return `${this.settings.keyPrefix}{${tag}}:t`
  }

  /**
   * "tag=generation,..." for these tags (sorted), each read (or created) by cache-tags.lua in its
   * own slot. `extendToMs` > 0 also extends each generation's TTL to at least that (before a fill).
   */
  async generations(tags: readonly string[], extendToMs: number): Promise<string> {
    const fresh = token()
    const ttl = extendToMs || this.store.generationTtlMs
    const generations = await Promise.all(
      tags.map((tag) =>
        callScript(
          this.store.redis,
          CACHE_TAGS,
          { tag: this.key(tag) },
          { newGeneration: fresh, ttlMs: ttl, extend: extendToMs ? '1' : '0' },
        ),
      ),
    )
    return tags.map((tag, i) => `${tag}=${generations[i]}`).join(',')
  }

  /** How long a tag's generation must live once an entry of hard TTL `hardMs` records it: well past that entry. */
  ttlFor(hardMs: number): number {
    return Math.max(this.store.generationTtlMs, 2 * hardMs + this.settings.leaseTtlMs)
  }

  /** Whether the tags of `recorded` still have the generations it records (extended as `generations` does). */
  async stillRecorded(recorded: string, extendToMs: number): Promise<boolean> {
    return (await this.generations(tagsOf(recorded), extendToMs)) === recorded
  }

  /**
   * The first read of a tagged call: the entry and its tags' generations at once (one call per tag,
   * each in its own slot, concurrently with cache-get.lua), then reconciled.
   */
  async readTagged(key: string, attempt: GetAttempt, tags: readonly string[]): Promise<GetReply> {
    const [reply, current] = await Promise.all([this.store.get(key, attempt), this.generations(tags, 0)])
    return this.reconcile(key, attempt, reply, current)
  }

  /** An untagged call met an entry recording `tags`: read their generations (one more round trip) and check them. */
  async checkRecorded(
    key: string,
    attempt: GetAttempt,
    reply: GetReply,
    tags: readonly string[],
  ): Promise<GetReply> {
    return this.reconcile(key, attempt, reply, await this.generations(tags, 0))
  }

  /**
   * An entry counts only if it recorded exactly the current generations of the caller's tags;
   * otherwise it is a miss. The reply's 4th element becomes the generations a fill records.
   */
  private async reconcile(
    key: string,
    attempt: GetAttempt,
    reply: GetReply,
    current: string,
  ): Promise<GetReply> {
    const [state] = reply
    if (reply[3] === current || state === 'load' || state === 'wait') {
      reply[3] = current
      return reply
    }
    // This caller took the lease to refresh it: it loads the entry anew.
    if (state === 'refresh' || state === 'early') return ['load', '', reply[2], current]
    // Again, telling the script the current generations: it treats the entry as absent, takes the
    // lease or reports it held.
    const again = await this.store.get(key, attempt, current)
    again[3] = current
    return again
  }

  /** A new random generation per tag: every entry that recorded an older one now reads as a miss. */
  async invalidate(tags: readonly string[]): Promise<void> {
    const generation = token()
    await Promise.all(
      tags.map((tag) => this.store.redis.set(this.key(tag), generation, 'PX', this.store.generationTtlMs)),
    )
  }
}
