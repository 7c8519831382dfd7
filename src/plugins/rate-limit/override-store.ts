import { randomBytes } from 'node:crypto'
import type { RedisClient } from '../../redis/client.ts'
import { callScript, defineScript } from '../../redis/scripts.ts'
import type { Duration } from './duration.ts'
import { RateLimitArgumentError } from './errors.ts'

// Where rate-limit overrides are stored (see overrides.ts): Redis, shared by every instance, or
// this process with the memory store. Both keep the overrides, a version replaced by each change,
// and an audit log of the changes.

/** What `set` takes: the new limit, how long it holds, and for the audit log why and who. */
export interface OverrideInput {
  /** The policy's limit for this key (its window, refill rate and cost stay the policy's). */
  limit: number
  /** How long the override holds: milliseconds or a duration string, at most 30 days. */
  ttl: Duration
  reason?: string
  by?: string
}

/** Why and who, for the audit log of a removal. */
export interface OverrideNote {
  reason?: string
  by?: string
}

export interface Override {
  policy: string
  /** The identity the policy's key function returns (`customer:42`, `ip:192.0.2.1`). */
  key: string
  limit: number
  /** Epoch ms (the Redis clock when set there). */
  expiresAt: number
  setAt: number
  reason: string
  by: string
}

/** One entry of the audit log. */
export interface OverrideChange {
  /** Epoch ms. */
  at: number
  action: 'set' | 'remove'
  policy: string
  key: string
  /** The new limit and ttl of a `set`; null for a `remove`. */
  limit: number | null
  ttlMs: number | null
  reason: string
  by: string
}

/** Overrides kept at most, per key prefix: past it a new one is refused. */
export const MAX_OVERRIDES = 10_000
/** Audit entries kept (about). */
export const AUDIT_LENGTH = 1000

/** Exported for the model run, which writes a change whose message is lost (another channel). */
export const OVERRIDE = defineScript({
  name: 'rateLimitOverride',
  keys: ['entries', 'expiry', 'version', 'audit'],
  args: [
    'action',
    'policy',
    'key',
    'limit',
    'ttlMs',
    'reason',
    'by',
    'maxEntries',
    'auditLength',
    'channel',
    'version',
  ],
  reply: (raw) =>
    JSON.parse(String(raw)) as { full?: true; version: string; existed: boolean; override?: Override },
})

/** Where one key prefix's overrides live in Redis: one hash tag, so one Cluster slot. */
export function overrideKeys(keyPrefix: string) {
  const base = `${keyPrefix}{overrides}`
  return {
    entries: `${base}:entries`,
    expiry: `${base}:expiry`,
    version: `${base}:version`,
    audit: `${base}:audit`,
    channel: `${base}:changed`,
  }
}

/** A change, checked: what the store writes. */
export interface Change {
  action: 'set' | 'remove'
  policy: string
  key: string
  limit: number
  ttlMs: number
  reason: string
  by: string
}

/** Where overrides are stored: Redis (shared by every instance) or this process. */
export interface OverrideStore {
  write(change: Change): Promise<{ existed: boolean; override?: Override }>
  /** The version and the overrides it stands for, read at once. */
  read(): Promise<{ version: string; overrides: Override[] }>
  version(): Promise<string>
  history(count: number): Promise<OverrideChange[]>
}

export function redisStore(redis: RedisClient, keyPrefix: string): OverrideStore {
  const keys = overrideKeys(keyPrefix)
  return {
    async write(change) {
      const reply = await callScript(
        redis,
        OVERRIDE,
        { entries: keys.entries, expiry: keys.expiry, version: keys.version, audit: keys.audit },
        {
          action: change.action,
          policy: change.policy,
          key: change.key,
          limit: change.limit,
          ttlMs: change.ttlMs,
          reason: change.reason,
          by: change.by,
          maxEntries: MAX_OVERRIDES,
          auditLength: AUDIT_LENGTH,
          channel: keys.channel,
          version: randomBytes(12).toString('base64url'),
        },
      )
      if (reply.full)
        throw new RateLimitArgumentError(
          `rate-limit plugin: overrides.set(): ${MAX_OVERRIDES} overrides are in force already: remove some first`,
        )
      return reply
    },
    async read() {
      // One transaction (one slot): a version read apart from the entries could be paired with a
      // change it does not count, and after a data loss the version can come back to that value.
      const replies = (await redis.multi().get(keys.version).hgetall(keys.entries).exec()) ?? []
      for (const [err] of replies) if (err) throw err
      const version = (replies[0]?.[1] as string | null) ?? '0'
      const fields = (replies[1]?.[1] ?? {}) as Record<string, string>
      return { version, overrides: Object.values(fields).map((json) => JSON.parse(json) as Override) }
    },
    async version() {
      return (await redis.get(keys.version)) ?? '0'
    },
    async history(count) {
      const entries = (await redis.xrevrange(keys.audit, '+', '-', 'COUNT', count)) as Array<
        [string, string[]]
      >
      return entries.map(([id, list]) => {
        const f: Record<string, string> = {}
        for (let i = 0; i + 1 < list.length; i += 2) f[list[i]!] = list[i + 1]!
        const set = f.action === 'set'
        return {
          at: Number(id.split('-')[0]),
          action: set ? 'set' : 'remove',
          policy: f.policy ?? '',
          key: f.key ?? '',
          limit: set ? Number(f.limit) : null,
          ttlMs: set ? Number(f.ttlMs) : null,
          reason: f.reason ?? '',
          by: f.by ?? '',
        }
      })
    },
  }
}

export function memoryStore(now: () => number): OverrideStore {
  const overrides = new Map<string, Override>()
  const audit: OverrideChange[] = []
  let version = 0
  const live = () => {
    for (const [field, o] of overrides) if (o.expiresAt <= now()) overrides.delete(field)
    return overrides
  }
  return {
    async write(change) {
      const field = `${change.policy}\n${change.key}`
      const entries = live()
      const existed = entries.has(field)
      let override: Override | undefined
      if (change.action === 'set') {
        if (!existed && entries.size >= MAX_OVERRIDES)
          throw new RateLimitArgumentError(
            `rate-limit plugin: overrides.set(): ${MAX_OVERRIDES} overrides are in force already: remove some first`,
          )
        const at = now()
        override = {
          policy: change.policy,
          key: change.key,
          limit: change.limit,
          expiresAt: at + change.ttlMs,
          setAt: at,
          reason: change.reason,
          by: change.by,
        }
        entries.set(field, override)
      } else entries.delete(field)
      version++
      const set = change.action === 'set'
      audit.unshift({
        at: now(),
        action: change.action,
        policy: change.policy,
        key: change.key,
        limit: set ? change.limit : null,
        ttlMs: set ? change.ttlMs : null,
        reason: change.reason,
        by: change.by,
      })
      audit.length = Math.min(audit.length, AUDIT_LENGTH)
      return { existed, override }
    },
    async read() {
      return { version: String(version), overrides: [...live().values()] }
    },
    async version() {
      return String(version)
    },
    async history(count) {
      return audit.slice(0, count)
    },
  }
}
