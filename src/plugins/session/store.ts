import { randomBytes } from 'node:crypto'
import type { RedisClient } from '../../redis/client.ts'
import { callScript } from '../../redis/scripts.ts'
import {
  checkHandle,
  checkPrincipal,
  isWellFormedHandle,
  isWellFormedId,
  MAX_INDEX_SCAN,
  MAX_LISTED_SESSIONS,
  resolveLifetime,
  type SessionInfo,
  type SessionLifetime,
  sessionHandle,
} from './checks.ts'
import type { LoadResult } from './decision.ts'
import { SessionTooLargeError } from './errors.ts'
import { type L1Counters, newOrigin, publishInvalidation, type SessionFields, SessionL1 } from './l1.ts'
import { SESSION_STORE_OPTIONS, type SessionStoreOptions, type SessionStoreSettings } from './options.ts'
import { SESSION_CREATE, SESSION_DESCRIBE, SESSION_INDEX_ADD, SESSION_SET } from './scripts.ts'
import {
  type AnonymousSessionHooks,
  checkFieldName,
  encodeField,
  encodeFields,
  loadedSession,
  MAX_SESSION_BYTES,
  Session,
  type SessionRecord,
  type SessionSaver,
  type SessionValue,
} from './session.ts'
import { Touches } from './touches.ts'
import { guarded } from './unavailable.ts'

export {
  MAX_INDEX_SCAN,
  MAX_LISTED_SESSIONS,
  type SessionInfo,
  type SessionLifetime,
  type SessionTimes,
  sessionHandle,
} from './checks.ts'
export { sessionStoreUnavailable } from './unavailable.ts'
export type { SessionRecord, SessionStoreOptions, SessionValue }

/** The hash field holding a session's own idle timeout, when it was given one at login. */
const IDLE_FIELD = '__idleTimeoutMs'

/**
 * Server-side sessions: one Hash per session under its own hash tag, plus a Set per principal
 * listing its session ids. Every operation is one script or single-key command, so it runs
 * unchanged on Redis Cluster. Every method rejects with a 503 `HttpProblem`
 * (`session-store-unavailable`, Retry-After: 1) when Redis cannot be reached or does not answer in time.
 */
export class SessionStore implements SessionSaver {
  readonly redis: RedisClient
  readonly options: SessionStoreSettings
  readonly #now: () => number
  /** When this process last slid each session's idle expiry, and when it slides it again. */
  readonly #touches: Touches
  /** The loaded sessions this instance answers without Redis (the `l1` option), or null. */
  readonly l1: SessionL1 | null
  /** Names this store in the invalidations it publishes (its L1, if any, skips them). */
  readonly #origin: string

  /**
   * Throws an InvalidOptionError (or UnknownOptionError) for options the plugin would refuse.
   * `counters` (internal) counts the L1's hits, misses and invalidations.
   */
  constructor(redis: RedisClient, options: SessionStoreOptions = {}, counters?: L1Counters) {
    this.redis = redis
    this.options = SESSION_STORE_OPTIONS.read(options)
    const { idleTimeoutMs, touchAfterMs } = this.options
    this.#touches = new Touches(idleTimeoutMs, touchAfterMs ?? Math.floor(idleTimeoutMs / 20))
    this.#now = this.options.now
    const l1 = this.options.l1
    this.l1 = l1 === false ? null : new SessionL1(redis, this.options.keyPrefix, l1, counters)
    this.#origin = this.l1?.origin ?? newOrigin()
  }

  /** Closes the L1's subscriber connection (never the client it was given). */
  close(): void {
    this.l1?.close()
  }

  /**
   * Runs a write that changes or ends the sessions `ids`, then publishes them (awaited: every
   * subscribed L1 is then a message's delivery away from dropping them). This L1 drops them before
   * (its loads in flight keep nothing) and after (a load that started meanwhile read the old
   * value). A failed publish rejects like a failed write (the 503 problem).
   */
  async #changing<T>(ids: readonly string[], write: () => Promise<T>): Promise<T> {
    for (const id of ids) this.l1?.drop(id)
    const result = await write()
    for (const id of ids) this.l1?.drop(id)
    if (ids.length > 0) await publishInvalidation(this.redis, this.options.keyPrefix, this.#origin, ids)
    return result
  }

  sessionKey(id: string): string {
    return `${this.options.keyPrefix}{${id}}`
  }

  indexKey(principal: string): string {
    return `${this.options.keyPrefix}principal:{${principal}}`
  }

  static isWellFormedId(id: string): boolean {
    return isWellFormedId(id)
  }

  /** True for a string of the handles' form (22 base64url characters): what a route may accept. */
  static isWellFormedHandle(handle: unknown): handle is string {
    return isWellFormedHandle(handle)
  }

  /**
   * Loads and touches (TTL only); null for unknown, expired or malformed ids. Plain commands sent
   * together, no script (Redis would run each command of a script through Lua, about 1 µs apiece):
   * HGETALL, and PEXPIRE sliding the idle expiry on the Redis clock (a no-op on a missing key) unless
   * this process did so less than `touchAfterMs` ago: the idle expiry is then at most that much
   * early (for a shorter idle timeout than the plugin's, the same share of its own: #touchAfter),
   * and most loads write nothing. The absolute lifetime is checked here, on this process's
   * clock: a session past it is deleted and refused, and one whose idle expiry would pass it gets
   * its expiry moved back to it. A session given its own idle timeout at login is slid by that one:
   * the first load in a process, which does not know it yet, slides by the plugin's and then again
   * by the session's.
   */
  async load(id: string): Promise<Session | null> {
    if (!isWellFormedId(id)) return null
    return (await this.loadPresented(id)).session
  }

  /** @internal `load` of an id of an id's form (a verified cookie's): what it found, at once when the L1 has it. */
  loadPresented(id: string): LoadResult | Promise<LoadResult> {
    return (this.l1 && this.#loadCached(this.l1, id)) || this.#loadStored(id)
  }

  /** A presented session read from Redis (see `load`). */
  async #loadStored(id: string): Promise<LoadResult> {
    const key = this.sessionKey(id)
    const sentAt = this.#now()
    const last = this.#touches.get(id)
    const touch = this.#touches.due(last, sentAt)
    const slidBy = last?.idle ?? this.options.idleTimeoutMs
    const pending = this.l1?.begin(id)
    let fields: Record<string, string>
    try {
      fields = await guarded(() =>
        touch
          ? Promise.all([this.redis.hgetall(key), this.redis.pexpire(key, slidBy)]).then(([f]) => f)
          : this.redis.hgetall(key),
      )
    } catch (err) {
      if (pending) this.l1!.end(pending, null, sentAt)
      throw err
    }
    const absoluteExpiresAt = Number(fields._absoluteExpiresAt)
    const now = this.#now()
    // Kept as read at its sending: its `ttlMs` runs from before Redis answered.
    if (pending) this.l1!.end(pending, absoluteExpiresAt > now ? fields : null, sentAt)
    if (!absoluteExpiresAt) {
      this.#touches.delete(id)
      return { decision: 'ended', session: null }
    }
    if (now >= absoluteExpiresAt) {
      this.#touches.delete(id)
      await this.#changing([id], () => this.redis.del(key)).catch(() => {})
      return { decision: 'expired', session: null }
    }
    const idleTimeoutMs = Number(fields[IDLE_FIELD]) || this.options.idleTimeoutMs
    if (touch) {
      this.#touches.set(id, sentAt, idleTimeoutMs)
      // Not awaited: should it fail, the session ends sooner than it should, never later.
      if (idleTimeoutMs !== slidBy) this.redis.pexpire(key, idleTimeoutMs).catch(() => {})
    }
    // A touch in the last idle period of its lifetime only. Not awaited: the check above refuses
    // the session at its absolute end whatever its TTL, so this only frees the memory on time.
    if (touch && now + idleTimeoutMs > absoluteExpiresAt)
      this.redis.pexpireat(key, absoluteExpiresAt).catch(() => {})
    const expiresAt = Math.min((touch ? sentAt : last!.at) + idleTimeoutMs, absoluteExpiresAt)
    const session = loadedSession(this, id, fields, expiresAt, absoluteExpiresAt)
    return { decision: touch ? 'slid' : 'found', session }
  }

  /**
   * A presented session from the L1: loaded less than `ttlMs` ago, within its absolute lifetime
   * and within the idle expiry this instance last slid (past it, another instance may not have
   * slid it either: Redis answers). No command unless the idle expiry is due to slide: a PEXPIRE
   * then, whose answer also says whether the key still exists. Null when the L1 cannot answer.
   */
  #loadCached(l1: SessionL1, id: string): LoadResult | Promise<LoadResult> | null {
    const now = this.#now()
    const last = this.#touches.get(id)
    const fields = l1.answerable(id, now, last)
    if (!fields || !last) return null
    if (this.#touches.due(last, now)) return this.#slide(id, fields, last.idle, now)
    const absoluteExpiresAt = Number(fields._absoluteExpiresAt)
    const expiresAt = Math.min(last.at + last.idle, absoluteExpiresAt)
    return { decision: 'found', session: loadedSession(this, id, fields, expiresAt, absoluteExpiresAt) }
  }

  /** A session from the L1 whose idle expiry is due to slide: PEXPIRE, whose answer says whether it still exists. */
  async #slide(id: string, fields: SessionFields, idle: number, now: number): Promise<LoadResult> {
    const key = this.sessionKey(id)
    const absoluteExpiresAt = Number(fields._absoluteExpiresAt)
    const slid = await guarded(() => this.redis.pexpire(key, idle))
    if (slid === 0) {
      this.l1?.drop(id)
      this.#touches.delete(id)
      return { decision: 'ended', session: null }
    }
    this.#touches.set(id, now, idle)
    if (now + idle > absoluteExpiresAt) this.redis.pexpireat(key, absoluteExpiresAt).catch(() => {})
    const expiresAt = Math.min(now + idle, absoluteExpiresAt)
    return { decision: 'slid', session: loadedSession(this, id, fields, expiresAt, absoluteExpiresAt) }
  }

  /**
   * A new session with a fresh 256-bit id, recorded in the principal's index. `data` holds JSON
   * values (validated like `Session#set`). `lifetime` gives this session its own idle timeout and
   * lifetime, within `maxIdleTimeoutMs` and `maxAbsoluteTimeoutMs` (SessionLifetimeError otherwise).
   */
  async create(
    principal: string,
    data: Record<string, SessionValue> = {},
    lifetime?: SessionLifetime,
  ): Promise<Session> {
    checkPrincipal(principal)
    const { idleTimeoutMs, absoluteTimeoutMs, ownIdleTimeout } = resolveLifetime(lifetime, this.options)
    const fields = encodeFields(data)
    if (ownIdleTimeout) fields.push([IDLE_FIELD, String(idleTimeoutMs)])
    return this.#create(principal, fields, idleTimeoutMs, absoluteTimeoutMs)
  }

  /** Throws the SessionLifetimeError `create` would throw for `lifetime`. */
  checkLifetime(lifetime: SessionLifetime | undefined): void {
    resolveLifetime(lifetime, this.options)
  }

  /** A new anonymous session (no principal, in no index) holding `data`. */
  createAnonymous(data: Record<string, SessionValue> = {}): Promise<Session> {
    return this.#create('', encodeFields(data), this.options.idleTimeoutMs, this.options.absoluteTimeoutMs)
  }

  /** @internal How an anonymous `request.session` stores itself on its first change. */
  createAnonymousEncoded(fields: Array<[string, string]>): Promise<Session> {
    return this.#create('', fields, this.options.idleTimeoutMs, this.options.absoluteTimeoutMs)
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

  async #create(
    principal: string,
    fields: Array<[string, string]>,
    idleTimeoutMs: number,
    absoluteTimeoutMs: number,
  ): Promise<Session> {
    const id = randomBytes(32).toString('base64url')
    // The hash first, then the index (two keys, two slots: no order between them otherwise). An id
    // in the index then always names a session that exists or existed, so neither pruneIndex nor
    // destroyAll can drop an id whose session is still to appear and would be unreachable.
    const sentAt = this.#now()
    const { createdAt, expiresAt, absoluteExpiresAt } = await guarded(async () => {
      const created = await callScript(
        this.redis,
        SESSION_CREATE,
        { session: this.sessionKey(id) },
        { idleTimeoutMs, absoluteTimeoutMs, principal, fields: fields.flat() },
      )
      if (principal !== '') {
        const index = { index: this.indexKey(principal) }
        await callScript(this.redis, SESSION_INDEX_ADD, index, { id, absoluteTimeoutMs })
      }
      return created
    })
    // Created with the idle expiry: a touch as of its sending.
    this.#touches.set(id, sentAt, idleTimeoutMs)
    const appFields = fields.filter(([name]) => name !== IDLE_FIELD)
    const raw = appFields.length > 0 ? new Map(appFields) : null
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
    if (!isWellFormedId(id)) return null
    const args = {
      idleTimeoutMs: touch ? this.options.idleTimeoutMs : 0,
      maxBytes: MAX_SESSION_BYTES,
      deleteCount: deleted.length,
      changes: [...deleted, ...set.flat()],
    }
    // Fields changed: every L1 drops the session (a touch alone changes nothing an L1 holds).
    const changed = set.length + deleted.length > 0 ? [id] : []
    const reply = await guarded(() =>
      this.#changing(changed, () =>
        callScript(this.redis, SESSION_SET, { session: this.sessionKey(id) }, args),
      ),
    )
    if (reply.saved) return reply.expiresAt
    if (reply.failure === 'gone') return null
    throw new SessionTooLargeError(`Session fields would exceed ${MAX_SESSION_BYTES} bytes`)
  }

  async destroy(id: string, principal?: string): Promise<void> {
    this.#touches.delete(id)
    await guarded(() =>
      this.#changing([id], () =>
        Promise.all([
          this.redis.del(this.sessionKey(id)),
          principal ? this.redis.srem(this.indexKey(principal), id) : undefined,
        ]),
      ),
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
      const deleted = await this.#changing(ids, () =>
        Promise.all(ids.map((id) => this.redis.del(this.sessionKey(id)))),
      )
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

  /**
   * The principal's live sessions ("devices"), newest first, at most MAX_LISTED_SESSIONS: each by
   * its handle (never its id), times and idle timeout. Reads the principal's index (at most
   * MAX_INDEX_SCAN of its ids), asks every session key at once (one script each: the keys live in
   * their own slots) and drops from the index the ids of sessions that ended, as `pruneIndex` does.
   */
  async listSessions(principal: string): Promise<SessionInfo[]> {
    checkPrincipal(principal)
    const index = this.indexKey(principal)
    return guarded(async () => {
      const ids = await this.#indexIds(index)
      const replies = await Promise.all(
        ids.map((id) => callScript(this.redis, SESSION_DESCRIBE, { session: this.sessionKey(id) }, {})),
      )
      const sessions: SessionInfo[] = []
      const dead: string[] = []
      replies.forEach((reply, i) => {
        const id = ids[i]!
        if (!reply) {
          dead.push(id)
          return
        }
        // Only ids this principal's logins added are in its index; checked all the same.
        if (reply.principal !== principal) return
        sessions.push({
          handle: sessionHandle(id),
          createdAt: reply.createdAt,
          expiresAt: reply.expiresAt,
          absoluteExpiresAt: reply.absoluteExpiresAt,
          idleTimeoutMs: reply.idleTimeoutMs || this.options.idleTimeoutMs,
        })
      })
      if (dead.length) await this.redis.srem(index, ...dead)
      sessions.sort((a, b) => b.createdAt - a.createdAt)
      return sessions.slice(0, MAX_LISTED_SESSIONS)
    })
  }

  /**
   * Ends the principal's session named by `handle` (from `listSessions`) and removes it from the
   * index; true when a session was ended. A handle that names no session of this principal (another
   * principal's, an ended one, a made-up one) ends nothing: false. Throws SessionHandleError for a
   * handle not of the handles' form, SessionPrincipalError for a principal that is not one.
   */
  async destroySession(principal: string, handle: string): Promise<boolean> {
    checkPrincipal(principal)
    checkHandle(handle)
    const index = this.indexKey(principal)
    return guarded(async () => {
      // The whole index (as destroyAll reads it): every handle a listing showed is found.
      const ids = await this.redis.smembers(index)
      const id = ids.find((candidate) => sessionHandle(candidate) === handle)
      if (id === undefined) return false
      this.#touches.delete(id)
      const [deleted] = await this.#changing([id], () =>
        Promise.all([this.redis.del(this.sessionKey(id)), this.redis.srem(index, id)]),
      )
      return deleted === 1
    })
  }

  /**
   * The index's ids, at most MAX_INDEX_SCAN of them: all of them (SRANDMEMBER with a positive count
   * answers the whole set when it is smaller), else that many distinct ones in no particular order.
   */
  #indexIds(index: string): Promise<string[]> {
    return this.redis.srandmember(index, MAX_INDEX_SCAN)
  }
}
