import { randomBytes } from 'node:crypto'
import { type RedisClient, runScript } from '../../lua/index.ts'
import { HttpProblem } from '../common/problem.ts'
import { SessionPrincipalError, SessionTooLargeError } from './errors.ts'
import {
  type AnonymousSessionHooks,
  checkFieldName,
  encodeField,
  fieldBytes,
  isReservedField,
  MAX_SESSION_BYTES,
  Session,
  type SessionRecord,
  type SessionSaver,
  type SessionValue,
} from './session.ts'

export type { SessionRecord, SessionValue }

export interface SessionTimes {
  createdAt: number
  /** When the session ends if no further request touches it: min(last touch + idle, absolute). */
  expiresAt: number
  absoluteExpiresAt: number
}

const SESSION_ID = /^[A-Za-z0-9_-]{43}$/

export interface SessionStoreOptions {
  keyPrefix: string
  idleTimeoutMs: number
  absoluteTimeoutMs: number
  /**
   * A load slides the idle expiry only when this process last did so for that session at least
   * this long ago (0: on every load). Default idleTimeoutMs / 20.
   */
  touchAfterMs?: number
}

/** Sessions whose last touch this process remembers (about 100 bytes each). */
const REMEMBERED_TOUCHES = 10_000

/** Validated, JSON-encoded fields of a new session, within MAX_SESSION_BYTES. */
function encodeFields(data: Record<string, SessionValue>): Array<[string, string]> {
  const fields: Array<[string, string]> = []
  let bytes = 0
  for (const [name, value] of Object.entries(data)) {
    checkFieldName(name)
    if (value === undefined) continue
    const encoded = encodeField(name, value)
    bytes += fieldBytes(name, encoded)
    fields.push([name, encoded])
  }
  if (bytes > MAX_SESSION_BYTES)
    throw new SessionTooLargeError(`Session fields exceed ${MAX_SESSION_BYTES} bytes`)
  return fields
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
export class SessionStore implements SessionSaver {
  readonly redis: RedisClient
  readonly options: SessionStoreOptions
  readonly #touchAfterMs: number
  /** When this process last slid each session's idle expiry (its own touches only). */
  readonly #touchedAt = new Map<string, number>()

  constructor(redis: RedisClient, options: SessionStoreOptions) {
    this.redis = redis
    this.options = options
    this.#touchAfterMs = options.touchAfterMs ?? Math.floor(options.idleTimeoutMs / 20)
  }

  #touched(id: string, at: number): void {
    this.#touchedAt.delete(id)
    if (this.#touchedAt.size >= REMEMBERED_TOUCHES)
      this.#touchedAt.delete(this.#touchedAt.keys().next().value!)
    this.#touchedAt.set(id, at)
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

  /**
   * Loads and touches (TTL only); null for unknown, expired or malformed ids. Plain commands sent
   * together, no script (Redis would run each command of a script through Lua, about 1 µs apiece):
   * HGETALL, and PEXPIRE sliding the idle expiry on the Redis clock (a no-op on a missing key) unless
   * this process did so less than `touchAfterMs` ago: the idle expiry is then at most that much
   * early, and most loads write nothing. The absolute lifetime is checked here, on this process's
   * clock: a session past it is deleted and refused, and one whose idle expiry would pass it gets
   * its expiry moved back to it.
   */
  async load(id: string): Promise<Session | null> {
    if (!SESSION_ID.test(id)) return null
    const key = this.sessionKey(id)
    const { idleTimeoutMs } = this.options
    const sentAt = Date.now()
    const lastTouch = this.#touchedAt.get(id)
    const touch = lastTouch === undefined || sentAt - lastTouch >= this.#touchAfterMs
    const fields = await guarded(() =>
      touch
        ? Promise.all([this.redis.hgetall(key), this.redis.pexpire(key, idleTimeoutMs)]).then(([f]) => f)
        : this.redis.hgetall(key),
    )
    const absoluteExpiresAt = Number(fields._absoluteExpiresAt)
    if (!absoluteExpiresAt) {
      this.#touchedAt.delete(id)
      return null
    }
    const now = Date.now()
    if (now >= absoluteExpiresAt) {
      this.#touchedAt.delete(id)
      await this.redis.del(key).catch(() => {})
      return null
    }
    if (touch) this.#touched(id, sentAt)
    // A touch in the last idle period of its lifetime only. Not awaited: the check above refuses
    // the session at its absolute end whatever its TTL, so this only frees the memory on time.
    if (touch && now + idleTimeoutMs > absoluteExpiresAt)
      this.redis.pexpireat(key, absoluteExpiresAt).catch(() => {})
    let principal = ''
    let createdAt = 0
    let raw: Map<string, string> | null = null
    for (const name in fields) {
      const value = fields[name]!
      if (name === '_principal') principal = value
      else if (name === '_createdAt') createdAt = Number(value)
      else if (!isReservedField(name)) {
        raw ??= new Map()
        raw.set(name, value)
      }
    }
    const expiresAt = Math.min((touch ? sentAt : lastTouch!) + idleTimeoutMs, absoluteExpiresAt)
    return new Session(this, { id, principal, createdAt, expiresAt, absoluteExpiresAt }, raw)
  }

  /**
   * A new session with a fresh 256-bit id, recorded in the principal's index. `data` holds JSON
   * values (validated like `Session#set`).
   */
  async create(principal: string, data: Record<string, SessionValue> = {}): Promise<Session> {
    if (typeof principal !== 'string' || principal.length === 0 || principal.length > 128)
      throw new SessionPrincipalError(
        `Session principal must be a string of 1-128 characters, got ${typeof principal === 'string' ? `one of ${principal.length}` : `a ${principal === null ? 'null' : typeof principal}`}`,
      )
    return this.#create(principal, encodeFields(data))
  }

  /** A new anonymous session (no principal, in no index) holding `data`. */
  createAnonymous(data: Record<string, SessionValue> = {}): Promise<Session> {
    return this.#create('', encodeFields(data))
  }

  /** @internal How an anonymous `request.session` stores itself on its first change. */
  createAnonymousEncoded(fields: Array<[string, string]>): Promise<Session> {
    return this.#create('', fields)
  }

  /** @internal An anonymous session of a request, stored on its first change. */
  unsavedAnonymous(hooks: AnonymousSessionHooks): Session {
    return new Session(
      this,
      { id: '', principal: '', createdAt: 0, expiresAt: 0, absoluteExpiresAt: 0 },
      null,
      hooks,
    )
  }

  async #create(principal: string, fields: Array<[string, string]>): Promise<Session> {
    const id = randomBytes(32).toString('base64url')
    const { idleTimeoutMs, absoluteTimeoutMs } = this.options
    // The hash first, then the index (two keys, two slots: no order between them otherwise). An id
    // in the index then always names a session that exists or existed, so neither pruneIndex nor
    // destroyAll can drop an id whose session is still to appear and would be unreachable.
    const sentAt = Date.now()
    const times = await guarded(async () => {
      const created = await runScript<[number, number, number]>(
        this.redis,
        'sessionCreate',
        [this.sessionKey(id)],
        [idleTimeoutMs, absoluteTimeoutMs, principal, ...fields.flat()],
      )
      if (principal !== '') {
        await runScript<number>(
          this.redis,
          'sessionIndexAdd',
          [this.indexKey(principal)],
          [id, absoluteTimeoutMs],
        )
      }
      return created
    })
    const [createdAt, expiresAt, absoluteExpiresAt] = times.map(Number) as [number, number, number]
    // Created with the idle expiry: a touch as of its sending.
    this.#touched(id, sentAt)
    const raw = fields.length > 0 ? new Map(fields) : null
    return new Session(this, { id, principal, createdAt, expiresAt, absoluteExpiresAt }, raw)
  }

  /**
   * Writes fields of an existing session only (JSON values; `null` or `undefined` deletes the
   * field): it never recreates a destroyed session; false when the session is gone.
   */
  async set(id: string, fields: Record<string, SessionValue | undefined>): Promise<boolean> {
    const set: Array<[string, string]> = []
    const deleted: string[] = []
    for (const [name, value] of Object.entries(fields)) {
      checkFieldName(name)
      if (value === null || value === undefined) deleted.push(name)
      else set.push([name, encodeField(name, value)])
    }
    return (await this.saveFields(id, set, deleted, false)) !== null
  }

  /**
   * Deletes `deleted`, writes `set` (JSON-encoded) and, with `touch`, slides the idle expiry, in one
   * script that first checks the session still exists and its absolute lifetime has not passed.
   * Resolves the expiry after a touch (0 without one), null when the session is gone.
   */
  async saveFields(
    id: string,
    set: Array<[string, string]>,
    deleted: string[],
    touch: boolean,
  ): Promise<number | null> {
    if (!SESSION_ID.test(id)) return null
    const args: Array<string | number> = [
      touch ? this.options.idleTimeoutMs : 0,
      MAX_SESSION_BYTES,
      deleted.length,
    ]
    for (const name of deleted) args.push(name)
    for (const [name, value] of set) args.push(name, value)
    const reply = Number(
      await guarded(() => runScript<number>(this.redis, 'sessionSet', [this.sessionKey(id)], args)),
    )
    if (reply === -1) return null
    if (reply === -2) throw new SessionTooLargeError(`Session fields would exceed ${MAX_SESSION_BYTES} bytes`)
    return reply
  }

  async destroy(id: string, principal?: string): Promise<void> {
    this.#touchedAt.delete(id)
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
