import type { FastifyBaseLogger } from 'fastify'
import type { Redis } from 'ioredis'
import { describeValue, isCluster, type RedisClient, rawClient } from '../../redis/client.ts'
import { durationOption } from './duration.ts'
import { RateLimitArgumentError } from './errors.ts'
import { parseNetwork, RangeTable, rangeOfKey } from './ip-ranges.ts'
import {
  AUDIT_LENGTH,
  type Change,
  memoryStore,
  type Override,
  type OverrideChange,
  type OverrideInput,
  type OverrideNote,
  type OverrideStore,
  overrideKeys,
  redisStore,
} from './override-store.ts'
import type { PolicyBook } from './policies.ts'
import type { Policy } from './types.ts'

/**
 * Overrides: a policy's limit for one key (a tenant, a customer, an IP or an IP range), changed at runtime until
 * it expires. They are stored in Redis (or, with the memory store, in this process), and every
 * plugin instance keeps a copy it reads on the hot path: no Redis read per request. A change is
 * published on a channel (each instance reloads at once) and replaces a version token every instance
 * polls (the bound when a message is lost: `pollMs`).
 */

/** `app.rateLimiter.overrides`. */
export interface RateLimitOverrides {
  /** Sets (or replaces) the override of `key` under `policy`; every instance applies it within `pollMs`, usually at once. */
  set(policy: string, key: string, input: OverrideInput): Promise<Override>
  /** Removes it; false when there was none. */
  remove(policy: string, key: string, note?: OverrideNote): Promise<boolean>
  /** The overrides in force, as stored (Redis, or this process with the memory store). */
  list(): Promise<Override[]>
  /** The latest changes, newest first (at most `count`, default 100). */
  history(count?: number): Promise<OverrideChange[]>
  /** Reloads this instance's copy now (a change is otherwise seen at once, or within `pollMs`). */
  refresh(): Promise<void>
}

/** One policy's overrides: by identity, and those of IP ranges by network. */
interface PolicyOverrides {
  exact: Map<string, Override>
  ranges: RangeTable<Override> | null
}

const MAX_TTL_MS = 30 * 24 * 3600 * 1000
const MAX_TEXT = 200
const MAX_KEY = 512

export interface OverrideBookOptions {
  /** Null: the memory store (overrides of this process only). */
  redis: RedisClient | null
  keyPrefix: string
  /** How often the version is polled, the bound when a change's message is lost. */
  pollMs: number
  /** The plugin's policies (a `set` names one; a stored override of another is ignored). */
  policies: Pick<PolicyBook, 'find' | 'byName'>
  now: () => number
  log: FastifyBaseLogger
  /** Counts a change this instance made. */
  changed(action: 'set' | 'remove'): void
}

/**
 * One plugin instance's overrides: the copy its requests read (`limitOf`), kept current by the
 * channel and the poll, and the API that changes them.
 */
export class OverrideBook {
  private byPolicy = new Map<string, PolicyOverrides>()
  private readonly store: OverrideStore
  private readonly keys: ReturnType<typeof overrideKeys>
  private loadedVersion = ''
  private loading: Promise<void> | null = null
  private again = false
  private timer: NodeJS.Timeout | null = null
  private subscriber: Redis | null = null
  private closed = false
  readonly api: RateLimitOverrides

  constructor(private readonly options: OverrideBookOptions) {
    this.store = options.redis ? redisStore(options.redis, options.keyPrefix) : memoryStore(options.now)
    this.keys = overrideKeys(options.keyPrefix)
    this.api = {
      set: (policy, key, input) => this.set(policy, key, input),
      remove: (policy, key, note) => this.remove(policy, key, note),
      list: async () => (await this.store.read()).overrides.filter((o) => o.expiresAt > this.options.now()),
      history: async (count = 100) => {
        if (!Number.isSafeInteger(count) || count < 1 || count > AUDIT_LENGTH)
          fail('history()', `\`count\` must be a whole number from 1 to ${AUDIT_LENGTH}`)
        return this.store.history(count)
      },
      refresh: () => this.reload(),
    }
  }

  /** The overridden limit of `identity` under `policy`, if one is in force (the hot path: a Map read). */
  limitOf(policy: string, identity: string): number | undefined {
    if (this.byPolicy.size === 0) return undefined
    const overrides = this.byPolicy.get(policy)
    if (!overrides) return undefined
    const now = this.options.now()
    const override = overrides.exact.get(identity)
    if (override && override.expiresAt > now) return override.limit
    // An IP range's: the most specific one holding the identity's address.
    if (!overrides.ranges || !identity.startsWith('ip:')) return undefined
    const address = parseNetwork(identity.slice(3))
    return address ? overrides.ranges.find(address, (o) => o.expiresAt > now)?.limit : undefined
  }

  /** Overrides in force in this instance's copy, per policy (the metric). */
  counts(): Map<string, number> {
    const now = this.options.now()
    const counts = new Map<string, number>()
    for (const [policy, { exact }] of this.byPolicy) {
      let n = 0
      for (const o of exact.values()) if (o.expiresAt > now) n++
      counts.set(policy, n)
    }
    return counts
  }

  /** At ready: the copy loaded, the channel subscribed, the poll started. Fails the boot if Redis cannot be read. */
  async start(): Promise<void> {
    await this.reload()
    const { redis, pollMs } = this.options
    if (!redis) return
    this.timer = setInterval(() => void this.poll(), pollMs)
    this.timer.unref()
    this.subscribe(redis)
  }

  async close(): Promise<void> {
    this.closed = true
    if (this.timer) clearInterval(this.timer)
    this.subscriber?.disconnect()
    this.subscriber = null
  }

  /** A connection of its own in subscribe mode; on a Cluster one to a master (a PUBLISH reaches every node). */
  private subscribe(redis: RedisClient): void {
    const source = rawClient(redis)
    const attach = (node: Redis | undefined) => {
      if (!node || this.subscriber || this.closed) return
      const sub = node.duplicate({
        lazyConnect: false,
        enableOfflineQueue: true,
        commandTimeout: undefined,
        maxRetriesPerRequest: null,
        connectionName: `${this.options.keyPrefix}overrides`.replace(/[^\x21-\x7e]/g, '_'),
      })
      sub.on('error', () => {}) // The poll goes on; the command client reports the outage.
      sub.on('message', () => void this.reload().catch(() => {}))
      // Subscribed again after a drop: what was published meanwhile reached nobody here.
      sub.on('ready', () =>
        sub.subscribe(this.keys.channel).then(
          () => this.reload().catch(() => {}),
          () => {},
        ),
      )
      this.subscriber = sub
    }
    if (!isCluster(source)) attach(source)
    else {
      attach(source.nodes('master')[0])
      if (!this.subscriber) source.once('ready', () => attach(source.nodes('master')[0]))
    }
  }

  private async poll(): Promise<void> {
    try {
      if ((await this.store.version()) !== this.loadedVersion) await this.reload()
    } catch (err) {
      this.options.log.debug({ err }, 'rate-limit overrides: poll failed')
    }
  }

  /** Reads every override into a new copy; calls meanwhile share it and one more after it. */
  private reload(): Promise<void> {
    if (this.loading) {
      this.again = true
      return this.loading
    }
    this.loading = (async () => {
      do {
        this.again = false
        const { version, overrides } = await this.store.read()
        const byPolicy = new Map<string, PolicyOverrides>()
        for (const o of overrides) {
          const policy = this.options.policies.find(o.policy)
          // Another deployment's policy (a rolling deploy, another app on the prefix): not ours to apply.
          if (!policy || checkLimit(policy, o.limit) !== null) continue
          let entry = byPolicy.get(o.policy)
          if (!entry) {
            entry = { exact: new Map(), ranges: null }
            byPolicy.set(o.policy, entry)
          }
          entry.exact.set(o.key, o)
          const range = rangeOfKey(o.key)
          if (range) {
            entry.ranges ??= new RangeTable()
            entry.ranges.add(range, o)
          }
        }
        this.byPolicy = byPolicy
        this.loadedVersion = version
      } while (this.again)
    })().finally(() => {
      this.loading = null
    })
    return this.loading
  }

  private async set(policyName: string, key: string, input: OverrideInput): Promise<Override> {
    const policy = this.policyNamed(policyName, 'set()')
    checkKeyText(key, 'set()')
    if (typeof input !== 'object' || input === null)
      fail('set()', `the third argument must be { limit, ttl, reason?, by? }, got ${describeValue(input)}`)
    const problem = checkLimit(policy, input.limit)
    if (problem) fail('set()', problem)
    const ttlMs = durationOption('ttl', input.ttl, 1, (message) => fail('set()', message))
    if (ttlMs > MAX_TTL_MS) fail('set()', '`ttl` must be at most 30 days')
    const change: Change = {
      action: 'set',
      policy: policy.name,
      key,
      limit: input.limit,
      ttlMs,
      ...noteOf(input, 'set()'),
    }
    const { override } = await this.store.write(change)
    this.options.changed('set')
    this.options.log.info(
      { policy: policy.name, key, limit: input.limit, ttlMs, reason: change.reason, by: change.by },
      'rate-limit override set',
    )
    await this.reload()
    return override!
  }

  private async remove(policyName: string, key: string, note: OverrideNote = {}): Promise<boolean> {
    const policy = this.policyNamed(policyName, 'remove()')
    checkKeyText(key, 'remove()')
    const { existed } = await this.store.write({
      action: 'remove',
      policy: policy.name,
      key,
      limit: 0,
      ttlMs: 0,
      ...noteOf(note, 'remove()'),
    })
    this.options.changed('remove')
    this.options.log.info({ policy: policy.name, key, existed }, 'rate-limit override removed')
    await this.reload()
    return existed
  }

  private policyNamed(name: string, caller: string): Policy {
    return this.options.policies.byName(name, `overrides.${caller}`)
  }
}

/** Null when `limit` is one the policy can take, else why not. */
function checkLimit(policy: Policy, limit: unknown): string | null {
  if (!Number.isSafeInteger(limit) || (limit as number) < 1)
    return `\`limit\` must be a positive whole number, got ${describeValue(limit)}`
  if (policy.algorithm === 'gcra' && !policy.windowFn && (limit as number) > policy.windowMs * 100)
    return `\`limit\` ${limit} is more than 100 per millisecond of the policy's window (${policy.windowMs} ms)`
  return null
}

function checkKeyText(key: unknown, caller: string): void {
  if (typeof key !== 'string' || key.length === 0 || key.length > MAX_KEY)
    fail(
      caller,
      `\`key\` must be a string of 1 to ${MAX_KEY} characters (the identity a key function returns), got ${describeValue(key)}`,
    )
  if (key.startsWith('ip:') && key.includes('/') && !rangeOfKey(key))
    fail(
      caller,
      `\`key\` ${describeValue(key)} is not an IP range: write \`ip:\` and a network with no bits past its prefix (\`ip:203.0.113.0/24\`, \`ip:2001:db8::/32\`)`,
    )
}

function noteOf(note: OverrideNote, caller: string): { reason: string; by: string } {
  for (const field of ['reason', 'by'] as const) {
    const value = note[field]
    if (value !== undefined && (typeof value !== 'string' || value.length > MAX_TEXT))
      fail(caller, `\`${field}\` must be a string of at most ${MAX_TEXT} characters`)
  }
  return { reason: note.reason ?? '', by: note.by ?? '' }
}

function fail(caller: string, message: string): never {
  throw new RateLimitArgumentError(`rate-limit plugin: overrides.${caller}: ${message}`)
}
