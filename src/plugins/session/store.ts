import { randomBytes } from 'node:crypto'
import { type RedisClient, runScript } from '../../lua/index.ts'

export interface SessionTimes {
  createdAt: number
  /** When the session ends if no further request touches it: min(last touch + idle, absolute). */
  expiresAt: number
  absoluteExpiresAt: number
}

export interface SessionRecord extends SessionTimes {
  id: string
  principal: string
  /** Application fields; names starting with `_` are reserved for the store. */
  data: Record<string, string>
}

const SESSION_ID = /^[A-Za-z0-9_-]{43}$/
const FIELD_NAME = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/
const MAX_FIELD_BYTES = 4096

export interface SessionStoreOptions {
  keyPrefix: string
  idleTimeoutMs: number
  absoluteTimeoutMs: number
}

function checkFields(fields: Record<string, string | null>): Array<string> {
  const flat: string[] = []
  for (const [name, value] of Object.entries(fields)) {
    if (!FIELD_NAME.test(name)) throw new TypeError(`Invalid session field name '${name}'`)
    if (value !== null && Buffer.byteLength(value) > MAX_FIELD_BYTES) {
      throw new TypeError(`Session field '${name}' exceeds ${MAX_FIELD_BYTES} bytes`)
    }
    flat.push(name, value ?? '')
  }
  return flat
}

/**
 * Server-side sessions: one Hash per session under its own hash tag, plus a Set per principal
 * listing its session ids. Every operation is one script or single-key command, so it runs
 * unchanged on Redis Cluster.
 */
export class SessionStore {
  readonly redis: RedisClient
  readonly options: SessionStoreOptions

  constructor(redis: RedisClient, options: SessionStoreOptions) {
    this.redis = redis
    this.options = options
  }

  sessionKey(id: string): string {
    return `${this.options.keyPrefix}{${id}}`
  }

  indexKey(principal: string): string {
    return `${this.options.keyPrefix}principal:{${principal}}`
  }

  static isWellFormedId(id: string): boolean {
    return SESSION_ID.test(id)
  }

  /** Loads and touches (TTL only); null for unknown, expired or malformed ids, with no write. */
  async load(id: string): Promise<SessionRecord | null> {
    if (!SESSION_ID.test(id)) return null
    const reply = await runScript<Array<string | number> | null>(
      this.redis,
      'sessionLoad',
      [this.sessionKey(id)],
      [this.options.idleTimeoutMs],
    )
    if (!reply) return null
    const [, expiresAt, ...fields] = reply
    const all: Record<string, string> = {}
    for (let i = 0; i < fields.length; i += 2) all[String(fields[i])] = String(fields[i + 1])
    const data: Record<string, string> = {}
    for (const [name, value] of Object.entries(all)) if (!name.startsWith('_')) data[name] = value
    return {
      id,
      principal: all._principal ?? '',
      createdAt: Number(all._createdAt),
      expiresAt: Number(expiresAt),
      absoluteExpiresAt: Number(all._absoluteExpiresAt),
      data,
    }
  }

  /** A new session with a fresh 256-bit id, recorded in the principal's index. */
  async create(principal: string, data: Record<string, string> = {}): Promise<SessionRecord> {
    if (principal.length === 0 || principal.length > 128)
      throw new TypeError('Session principal must be 1-128 chars')
    const id = randomBytes(32).toString('base64url')
    const flat = checkFields(data)
    const { idleTimeoutMs, absoluteTimeoutMs } = this.options
    const [times] = await Promise.all([
      runScript<[number, number, number]>(
        this.redis,
        'sessionCreate',
        [this.sessionKey(id)],
        [idleTimeoutMs, absoluteTimeoutMs, principal, ...flat],
      ),
      runScript<number>(this.redis, 'sessionIndexAdd', [this.indexKey(principal)], [id, absoluteTimeoutMs]),
    ])
    const [createdAt, expiresAt, absoluteExpiresAt] = times.map(Number) as [number, number, number]
    return { id, principal, createdAt, expiresAt, absoluteExpiresAt, data: { ...data } }
  }

  /** Per-field write that never recreates a destroyed session; false when it is gone. */
  async set(id: string, fields: Record<string, string | null>): Promise<boolean> {
    const flat = checkFields(fields)
    return (await runScript<number>(this.redis, 'sessionSet', [this.sessionKey(id)], flat)) === 1
  }

  async destroy(id: string, principal?: string): Promise<void> {
    await Promise.all([
      this.redis.del(this.sessionKey(id)),
      principal ? this.redis.srem(this.indexKey(principal), id) : undefined,
    ])
  }

  /** "Log out everywhere": ends every session of the principal; returns how many existed. */
  async destroyAll(principal: string): Promise<number> {
    const ids = await this.redis.smembers(this.indexKey(principal))
    const deleted = await Promise.all(ids.map((id) => this.redis.del(this.sessionKey(id))))
    await this.redis.del(this.indexKey(principal))
    return deleted.reduce((sum, n) => sum + n, 0)
  }

  /** Drops ids of sessions that expired on their own, so an index never grows past live sessions. */
  async pruneIndex(principal: string): Promise<void> {
    const ids = await this.redis.smembers(this.indexKey(principal))
    const alive = await Promise.all(ids.map((id) => this.redis.exists(this.sessionKey(id))))
    const dead = ids.filter((_, i) => alive[i] === 0)
    if (dead.length) await this.redis.srem(this.indexKey(principal), ...dead)
  }
}
