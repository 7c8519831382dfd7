import { withTimeout } from '../../redis/timeout.ts'
import type { CacheChannelContext } from '../common/diagnostics.ts'
import { encodeValue, lifetimes } from './entry.ts'
import type { ReadOptions } from './entry-options.ts'
import { CacheLoadTimeoutError } from './errors.ts'
import type { EntryStore } from './store.ts'
import { type CacheTags, tagsOf } from './tags.ts'
import type { CacheParts } from './types.ts'

/** One `getOrLoad` that went past the L1 and the flights: what each step of it needs, passed down whole. */
export interface Read<T> {
  readonly key: string
  /** The key's namespace: the label of its metrics. */
  readonly name: string
  readonly loader: () => Promise<T | null>
  readonly options: ReadOptions
  /** The L1's epoch when the read began: a drop since then keeps what it read out of the L1. */
  readonly epoch: number
  /** When the read stops waiting for a load (epoch ms), set at its first miss if a hard timeout applies; 0: none. */
  hardAt: number
  /** What the cache channel's subscribers see of this read (only when there are any). */
  readonly trace: CacheChannelContext | undefined
}

/** What a fill presents to cache-fill.lua, as its read learned it. */
export interface FillTicket {
  /** The entry's generation, read before the load: an invalidation since then refuses the fill. */
  readonly generation: string
  /** The lease the read holds ('' when it loads without it). */
  readonly owner: string
  /** The generations of the entry's tags, read before the load (undefined: an untagged entry). */
  readonly recorded: string | undefined
}

/**
 * `work`, or CacheLoadTimeoutError once `deadline` (epoch ms) has passed; `work` goes on either way,
 * and a failure after the deadline is handed to `late`.
 */
export function withDeadline<T>(
  work: Promise<T>,
  deadline: number,
  key: string,
  timeoutMs: number,
  late: (err: unknown) => void,
  onTimeout?: () => void,
): Promise<T> {
  return withTimeout(
    work,
    Math.max(0, deadline - Date.now()),
    () => {
      onTimeout?.()
      throw new CacheLoadTimeoutError(key, timeoutMs)
    },
    late,
  )
}

/**
 * Runs loaders for reads: under the concurrency cap, bounded by the read's timeouts, and fills
 * what they load (fenced by the generations the read saw), in the foreground or the background.
 */
export class LoaderRunner {
  constructor(
    private readonly parts: CacheParts,
    private readonly store: EntryStore,
    private readonly tags: CacheTags,
  ) {}

  private load<T>(read: Read<T>): Promise<T | null> {
    return this.parts.limiter.run(() => {
      this.parts.metrics.loads.inc({ name: read.name })
      if (read.trace) read.trace.loaded = true
      return read.loader()
    })
  }

  /** Loads and fills; the value goes to the L1 only if the fill was stored and nothing was dropped since `epoch`. */
  async fill<T>(read: Read<T>, ticket: FillTicket, epoch = read.epoch): Promise<T | null> {
    const { key } = read
    const started = performance.now()
    let value: T | null
    let payload: string
    try {
      value = await this.load(read)
      payload = encodeValue(this.parts.settings, key, value)
    } catch (err) {
      // Released before the caller hears of it, so the next read of the key loads at once.
      if (ticket.owner) await this.store.release(key, ticket.owner)
      throw err
    }
    const loadMs = Math.max(1, Math.round(performance.now() - started))
    if (await this.stored(read, ticket, value === null, payload, loadMs))
      this.parts.l1?.set(
        key,
        value,
        epoch,
        ticket.recorded === undefined ? undefined : tagsOf(ticket.recorded),
      )
    return value
  }

  /** Stores a loaded payload unless a fence refuses it; never rejects (a failure is logged and counted). */
  private async stored(
    read: Read<unknown>,
    ticket: FillTicket,
    notFound: boolean,
    payload: string,
    loadMs: number,
  ): Promise<boolean> {
    const { key, name } = read
    const { settings } = this.parts
    const [softMs, hardMs] = lifetimes(settings, read.options, notFound)
    try {
      // The tag fence. The tags' generations live in other slots than the entry, so no script can
      // check them with the fill: read them again now. Changed since the read: refused. An
      // invalidation landing between this check and the fill still wins, because the entry
      // records the generations read before the load and every read compares them.
      if (
        ticket.recorded &&
        settings.fence &&
        !(await this.tags.stillRecorded(ticket.recorded, this.tags.ttlFor(hardMs)))
      ) {
        this.parts.metrics.fenceRejections.inc({ name })
        if (ticket.owner) await this.store.release(key, ticket.owner)
        return false
      }
      const stored = await this.store.fill(key, { ...ticket, softMs, hardMs, loadMs, payload })
      if (!stored) this.parts.metrics.fenceRejections.inc({ name })
      return stored
    } catch (err) {
      this.parts.metrics.redisErrors.inc({ name })
      this.parts.log.warn({ err, key }, 'cache fill failed')
      if (ticket.owner) void this.store.release(key, ticket.owner)
      return false
    }
  }

  /** Fills without the caller waiting: what it loads reaches the L1 unless a drop happens meanwhile. */
  refreshInBackground<T>(read: Read<T>, ticket: FillTicket): void {
    this.fill(read, ticket, this.parts.l1?.epoch ?? 0).catch((err) =>
      this.parts.log.warn({ err, key: read.key }, 'cache refresh failed; the entry stays until its hard TTL'),
    )
  }

  /**
   * Waits up to the soft timeout (or the hard one, if shorter) for this read's own refresh, else (or
   * when it throws, unless `onLoadError` is 'fail') serves the stale copy.
   */
  refreshWithin<T>(read: Read<T>, refresh: Promise<T | null>, stale: T | null): Promise<T | null> {
    const { key, name, options } = read
    const { softTimeoutMs, hardTimeoutMs } = options
    const waitMs = hardTimeoutMs > 0 ? Math.min(softTimeoutMs, hardTimeoutMs) : softTimeoutMs
    const withinWait = withTimeout(
      refresh,
      waitMs,
      () => {
        this.parts.metrics.softTimeouts.inc({ name })
        this.parts.metrics.staleServed.inc({ name })
        return stale
      },
      (err) => this.parts.log.warn({ err, key }, 'cache refresh failed; the entry stays until its hard TTL'),
    )
    return withinWait.catch((err: unknown) => {
      if (options.onLoadError === 'fail') throw err
      this.parts.log.warn({ err, key }, 'cache refresh failed; serving the stale copy')
      this.parts.metrics.staleOnError.inc({ name })
      this.parts.metrics.staleServed.inc({ name })
      return stale
    })
  }

  /** `work` bounded by the read's hard deadline (none: `work` itself). */
  bounded<T>(work: Promise<T>, read: Read<unknown>): Promise<T> {
    if (!read.hardAt) return work
    const { key, name } = read
    return withDeadline(
      work,
      read.hardAt,
      key,
      read.options.hardTimeoutMs,
      (err) => this.parts.log.warn({ err, key }, 'cache load failed after its read timed out'),
      () => this.parts.metrics.hardTimeouts.inc({ name }),
    )
  }

  /** The cache Redis failed a read: the loader answers it, under the cap and the read's hard timeout. */
  afterReadFailed<T>(read: Read<T>, err: unknown): Promise<T | null> {
    const { key, name, options } = read
    this.parts.metrics.redisErrors.inc({ name })
    this.parts.log.warn({ err, key }, 'cache read failed; loading from the source')
    if (!read.hardAt && options.hardTimeoutMs > 0) read.hardAt = Date.now() + options.hardTimeoutMs
    // Refused as when Redis is up: whether a value can be cached must not depend on an outage.
    const loaded = this.load(read).then((value) => {
      encodeValue(this.parts.settings, key, value)
      return value
    })
    return this.bounded(loaded, read)
  }
}
