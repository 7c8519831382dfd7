import { randomBytes } from 'node:crypto'
import { type RedisClient, runScript } from '../../lua/index.ts'
import { HttpProblem } from '../shared/problem.ts'

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

/** Server states that pass on their own (loading, failover, a busy script, memory full): worth a retry. */
const TRANSIENT_REPLY = /^(LOADING|BUSY|CLUSTERDOWN|MASTERDOWN|TRYAGAIN|READONLY|NOREPLICAS|OOM) /
/** ioredis' own messages when it cannot reach Redis or a reply does not come in time. */
const UNREACHABLE =
  /timed out|Socket timeout|writeable|Connection is|Cluster is|isn't ready|startup nodes|Node is disconnected|Cluster redirections|ECONN|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|ENOTFOUND|EAI_AGAIN/

/** True when `err` says Redis could not be asked, as opposed to a bad argument or a script's own error. */
export function isRedisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error)) return false
  if (err.name === 'ReplyError') return TRANSIENT_REPLY.test(err.message)
  if (['AbortError', 'MaxRetriesPerRequestError', 'ClusterAllFailedError'].includes(err.name)) return true
  const code = (err as NodeJS.ErrnoException).code ?? ''
  return UNREACHABLE.test(err.message) || UNREACHABLE.test(code)
}

/** The 503 every session operation answers when Redis cannot be asked: the client may retry soon. */
export function sessionStoreUnavailable(cause?: unknown): HttpProblem {
  const problem = new HttpProblem(
    503,
    'session-store-unavailable',
    'Service unavailable',
    'Sessions cannot be checked now.',
    { headers: { 'retry-after': '1' } },
  )
  if (cause !== undefined) problem.cause = cause
  return problem
}

/**
 * Runs a store operation; a Redis failure becomes the 503 problem, so an app that lets it through
 * answers 503 with Retry-After instead of a 500 carrying the driver's message.
 */
async function guarded<T>(operation: () => Promise<T>): Promise<T> {
  try {
    return await operation()
  } catch (err) {
    throw isRedisUnavailable(err) ? sessionStoreUnavailable(err) : err
  }
}

/**
 * Server-side sessions: one Hash per session under its own hash tag, plus a Set per principal
 * listing its session ids. Every operation is one script or single-key command, so it runs
 * unchanged on Redis Cluster. Every method rejects with a 503 `HttpProblem`
 * (`session-store-unavailable`, Retry-After: 1) when Redis cannot be reached or does not answer in time.
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
    const reply = await guarded(() =>
      runScript<Array<string | number> | null>(
        this.redis,
        'sessionLoad',
        [this.sessionKey(id)],
        [this.options.idleTimeoutMs],
      ),
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
    // The hash first, then the index (two keys, two slots: no order between them otherwise). An id
    // in the index then always names a session that exists or existed, so neither pruneIndex nor
    // destroyAll can drop an id whose session is still to appear and would be unreachable.
    const times = await guarded(async () => {
      const created = await runScript<[number, number, number]>(
        this.redis,
        'sessionCreate',
        [this.sessionKey(id)],
        [idleTimeoutMs, absoluteTimeoutMs, principal, ...flat],
      )
      await runScript<number>(
        this.redis,
        'sessionIndexAdd',
        [this.indexKey(principal)],
        [id, absoluteTimeoutMs],
      )
      return created
    })
    const [createdAt, expiresAt, absoluteExpiresAt] = times.map(Number) as [number, number, number]
    return { id, principal, createdAt, expiresAt, absoluteExpiresAt, data: { ...data } }
  }

  /** Per-field write that never recreates a destroyed session; false when it is gone. */
  async set(id: string, fields: Record<string, string | null>): Promise<boolean> {
    const flat = checkFields(fields)
    return (
      (await guarded(() => runScript<number>(this.redis, 'sessionSet', [this.sessionKey(id)], flat))) === 1
    )
  }

  async destroy(id: string, principal?: string): Promise<void> {
    await guarded(() =>
      Promise.all([
        this.redis.del(this.sessionKey(id)),
        principal ? this.redis.srem(this.indexKey(principal), id) : undefined,
      ]),
    )
  }

  /**
   * "Log out everywhere": ends every session of the principal; returns how many existed. Removes
   * from the index only the ids it read and deleted: a login completing meanwhile keeps its id
   * there, so the next call reaches it (deleting the whole index would orphan that session). The
   * sessions live in other slots than the index, so this cannot be one script on Redis Cluster.
   */
  async destroyAll(principal: string): Promise<number> {
    const index = this.indexKey(principal)
    return guarded(async () => {
      const ids = await this.redis.smembers(index)
      if (ids.length === 0) return 0
      const deleted = await Promise.all(ids.map((id) => this.redis.del(this.sessionKey(id))))
      await this.redis.srem(index, ...ids)
      return deleted.reduce((sum, n) => sum + n, 0)
    })
  }

  /** Drops ids of sessions that expired on their own, so an index never grows past live sessions. */
  async pruneIndex(principal: string): Promise<void> {
    const index = this.indexKey(principal)
    await guarded(async () => {
      const ids = await this.redis.smembers(index)
      const alive = await Promise.all(ids.map((id) => this.redis.exists(this.sessionKey(id))))
      // A missing hash never comes back (ids are never reused, create writes the hash before the index).
      const dead = ids.filter((_, i) => alive[i] === 0)
      if (dead.length) await this.redis.srem(index, ...dead)
    })
  }
}
