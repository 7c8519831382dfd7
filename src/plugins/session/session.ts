import { SessionFieldNameError, SessionTooLargeError, SessionValueError } from './errors.ts'

/** A value a session field holds: anything JSON represents exactly. */
export type SessionValue = null | boolean | number | string | SessionValue[] | { [key: string]: SessionValue }

/** Most bytes one field's value may take, encoded as JSON (UTF-8). */
export const MAX_FIELD_BYTES = 4096
/** Most bytes a session's application fields may take together: names plus JSON-encoded values. */
export const MAX_SESSION_BYTES = 16_384

/** 1-64 of `A-Z a-z 0-9 _ . : -`, not starting with `.`, `:` or `-`. */
const FIELD_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$/
/** The store's own fields; every name starting with `__` is kept for it too. */
export const STORE_FIELDS: ReadonlySet<string> = new Set(['_principal', '_createdAt', '_absoluteExpiresAt'])

/** True for a name the application may not use: the store's fields and names starting with `__`. */
export function isReservedField(name: string): boolean {
  return STORE_FIELDS.has(name) || name.startsWith('__')
}

export function checkFieldName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || !FIELD_NAME.test(name)) {
    throw new SessionFieldNameError(
      `Invalid session field name ${typeof name === 'string' ? `'${name}'` : `(a ${typeof name})`}: 1-64 of A-Z a-z 0-9 _ . : -, not starting with . : or -`,
    )
  }
  if (isReservedField(name))
    throw new SessionFieldNameError(
      `Session field name '${name}' is reserved (the store's own fields and names starting with __)`,
    )
}

/**
 * The JSON text of a field's value. Refuses what JSON would not give back unchanged (undefined
 * inside an object or array, functions, symbols, bigints, NaN and Infinity, Dates, Maps and other
 * class instances) and values over MAX_FIELD_BYTES. Walks without recursion and stops after as many
 * nodes as the size allows, so a cycle or a deep structure cannot exhaust the stack.
 */
export function encodeField(name: string, value: unknown): string {
  const stack: unknown[] = [value]
  let nodes = 0
  while (stack.length > 0) {
    const node = stack.pop()
    // Every node takes at least two bytes of JSON with its separator: more nodes than bytes is too big.
    if (++nodes > MAX_FIELD_BYTES) throw tooBig(name)
    switch (typeof node) {
      case 'string':
      case 'boolean':
        continue
      case 'number':
        if (!Number.isFinite(node)) throw notJson(name, String(node))
        continue
      case 'object': {
        if (node === null) continue
        if (Array.isArray(node)) {
          // for...of reads holes as undefined, which is refused below.
          for (const item of node) stack.push(item)
          continue
        }
        const proto = Object.getPrototypeOf(node)
        if (proto !== Object.prototype && proto !== null) {
          throw notJson(name, `an instance of ${proto?.constructor?.name ?? 'a class'}`)
        }
        if (Object.getOwnPropertySymbols(node).length > 0) throw notJson(name, 'a symbol key')
        for (const item of Object.values(node)) stack.push(item)
        continue
      }
      default:
        throw notJson(name, typeof node)
    }
  }
  const json = JSON.stringify(value)
  if (json.length > MAX_FIELD_BYTES / 3 && Buffer.byteLength(json) > MAX_FIELD_BYTES) throw tooBig(name)
  return json
}

const tooBig = (name: string) =>
  new SessionTooLargeError(`Session field '${name}' exceeds ${MAX_FIELD_BYTES} bytes as JSON`)
const notJson = (name: string, what: string) =>
  new SessionValueError(`Session field '${name}' is not JSON-serialisable: it holds ${what}`)

/** A stored value back to what was set; a value that is not JSON is returned as the string it is. */
export function decodeField(raw: string): SessionValue {
  try {
    return JSON.parse(raw) as SessionValue
  } catch {
    return raw
  }
}

/** Bytes a field takes against MAX_SESSION_BYTES. */
export function fieldBytes(name: string, encoded: string): number {
  return Buffer.byteLength(name) + Buffer.byteLength(encoded)
}

/** The times and identity of a stored session, and its application fields decoded. */
export interface SessionRecord {
  /** The session id; '' for an anonymous session that is not stored yet. */
  id: string
  /** Who logged in; '' for an anonymous session (never a principal). */
  principal: string
  createdAt: number
  /** When the session ends if no further request touches it: min(last touch + idle, absolute). */
  expiresAt: number
  absoluteExpiresAt: number
  /** The application fields, decoded (a copy: change them with `set` and `delete`). */
  readonly data: Record<string, SessionValue>
}

/** What a session needs from its store to save itself. */
export interface SessionSaver {
  /** Writes `set` and deletes `deleted` if the session still exists; the expiry after a touch, 0 otherwise; null when gone. */
  saveFields(
    id: string,
    set: Array<[string, string]>,
    deleted: string[],
    touch: boolean,
  ): Promise<number | null>
  /** Stores a new anonymous session holding `fields`. */
  createAnonymousEncoded(fields: Array<[string, string]>): Promise<SessionRecord>
}

/** Hooks the plugin gives the anonymous session of a request. */
export interface AnonymousSessionHooks {
  /** Called once it is stored: the plugin sets the cookie. */
  stored(session: Session): void
  /** Why it may not be stored (the presented session could not be loaded), else null. */
  blocked(): Error | null
}

const detach = Symbol('detach')

/** Marks a session replaced (login) or ended (logout): its later saves do nothing. */
export function detachSession(session: Session): void {
  session[detach]()
}

/**
 * `request.session`: a stored session (signed in, or anonymous) or, with `saveUninitialized`, an
 * anonymous one stored on its first change. Fields are JSON values read with `get` and changed with
 * `set`/`delete`; only the changed fields are written, once, at the end of the request (or at
 * `save()`), and only while the session still exists.
 */
export class Session implements SessionRecord {
  id: string
  principal: string
  createdAt: number
  expiresAt: number
  absoluteExpiresAt: number
  readonly #saver: SessionSaver
  /** Stored application fields by name, JSON-encoded, with this request's changes applied. */
  #raw: Map<string, string> | null
  /** Fields changed by this request: the encoded value, or null when deleted. */
  #changes: Map<string, string | null> | null = null
  #touch = false
  #bytes = -1
  #detached = false
  #hooks: AnonymousSessionHooks | null
  #creating: Promise<boolean> | null = null

  constructor(
    saver: SessionSaver,
    record: Omit<SessionRecord, 'data'>,
    raw: Map<string, string> | null,
    hooks: AnonymousSessionHooks | null = null,
  ) {
    this.#saver = saver
    this.id = record.id
    this.principal = record.principal
    this.createdAt = record.createdAt
    this.expiresAt = record.expiresAt
    this.absoluteExpiresAt = record.absoluteExpiresAt
    this.#raw = raw
    this.#hooks = hooks
  }

  /** True when nobody logged in: the session never counts as a principal. */
  get anonymous(): boolean {
    return this.principal === ''
  }

  get data(): Record<string, SessionValue> {
    const data: Record<string, SessionValue> = {}
    if (this.#raw) for (const [name, raw] of this.#raw) data[name] = decodeField(raw)
    return data
  }

  /** The field's value (a fresh copy: changing it changes nothing until it is `set` again), or undefined. */
  get<T extends SessionValue = SessionValue>(name: string): T | undefined {
    const raw = this.#raw?.get(name)
    return raw === undefined ? undefined : (decodeField(raw) as T)
  }

  /**
   * Sets a field to a JSON value (`undefined` deletes it). Throws a SessionFieldNameError (a
   * TypeError) for a reserved or malformed name, a SessionValueError (a TypeError) for a value JSON
   * cannot represent, a SessionTooLargeError (a RangeError) past the size limits.
   */
  set(name: string, value: SessionValue | undefined): this {
    if (value === undefined) {
      this.delete(name)
      return this
    }
    checkFieldName(name)
    const encoded = encodeField(name, value)
    const previous = this.#raw?.get(name)
    if (previous === encoded) return this
    const bytes = this.#size() - (previous === undefined ? 0 : fieldBytes(name, previous))
    const after = bytes + fieldBytes(name, encoded)
    if (after > MAX_SESSION_BYTES) {
      throw new SessionTooLargeError(`Session fields would exceed ${MAX_SESSION_BYTES} bytes with '${name}'`)
    }
    this.#bytes = after
    this.#raw ??= new Map()
    this.#raw.set(name, encoded)
    this.#change(name, encoded)
    return this
  }

  /** Deletes a field; false when it was not there. */
  delete(name: string): boolean {
    checkFieldName(name)
    const previous = this.#raw?.get(name)
    if (previous === undefined) return false
    if (this.#bytes >= 0) this.#bytes -= fieldBytes(name, previous)
    this.#raw!.delete(name)
    this.#change(name, null)
    return true
  }

  /** Slides the idle expiry again at the end of the request (each request already slides it when it loads). */
  touch(): void {
    if (this.id !== '') this.#touch = true
  }

  /** True when the request changed a field or called `touch()` since the last save. */
  isModified(): boolean {
    return this.#changes !== null || this.#touch
  }

  /**
   * Writes the changes now instead of at the end of the request. Resolves false when the session
   * no longer exists (logged out or expired meanwhile: nothing is written, nothing is recreated).
   * Rejects with the 503 problem when Redis cannot be asked; the changes are then dropped.
   */
  async save(): Promise<boolean> {
    if (this.#detached) return false
    if (this.#creating) await this.#creating
    const changes = this.#changes
    const touch = this.#touch
    this.#changes = null
    this.#touch = false
    if (changes === null && !touch) return true
    const set: Array<[string, string]> = []
    const deleted: string[] = []
    if (changes) {
      for (const [name, value] of changes) {
        if (value === null) deleted.push(name)
        else set.push([name, value])
      }
    }
    if (this.id === '') {
      this.#creating = this.#create(set)
      try {
        return await this.#creating
      } finally {
        this.#creating = null
      }
    }
    const expiresAt = await this.#saver.saveFields(this.id, set, deleted, touch)
    if (expiresAt === null) return false
    if (expiresAt > 0) this.expiresAt = expiresAt
    return true
  }

  async #create(set: Array<[string, string]>): Promise<boolean> {
    if (set.length === 0) return true
    const blocked = this.#hooks?.blocked() ?? null
    if (blocked) throw blocked
    const record = await this.#saver.createAnonymousEncoded(set)
    if (this.#detached) return false
    this.id = record.id
    this.createdAt = record.createdAt
    this.expiresAt = record.expiresAt
    this.absoluteExpiresAt = record.absoluteExpiresAt
    this.#hooks?.stored(this)
    return true
  }

  [detach](): void {
    this.#detached = true
    this.#changes = null
    this.#touch = false
  }

  #change(name: string, encoded: string | null): void {
    this.#changes ??= new Map()
    this.#changes.set(name, encoded)
  }

  #size(): number {
    if (this.#bytes < 0) {
      let bytes = 0
      if (this.#raw) for (const [name, raw] of this.#raw) bytes += fieldBytes(name, raw)
      this.#bytes = bytes
    }
    return this.#bytes
  }

  toJSON(): SessionRecord {
    return {
      id: this.id,
      principal: this.principal,
      createdAt: this.createdAt,
      expiresAt: this.expiresAt,
      absoluteExpiresAt: this.absoluteExpiresAt,
      data: this.data,
    }
  }
}

/** Validated, JSON-encoded fields of a new session, within MAX_SESSION_BYTES. */
export function encodeFields(data: Record<string, SessionValue>): Array<[string, string]> {
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

/** A loaded session from its hash's fields (as HGETALL answers them). */
export function loadedSession(
  saver: SessionSaver,
  id: string,
  fields: Readonly<Record<string, string>>,
  expiresAt: number,
  absoluteExpiresAt: number,
): Session {
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
  return new Session(saver, { id, principal, createdAt, expiresAt, absoluteExpiresAt }, raw)
}
