import { createHash } from 'node:crypto'

/** The longest key, in characters once decoded. */
export const MAX_REQUEST_KEY_LENGTH = 255
/** The longest field value that can hold such a key: a quoted string with every character escaped. */
const MAX_FIELD_LENGTH = 2 * MAX_REQUEST_KEY_LENGTH + 2
/** A bare key: visible ASCII, not starting with DQUOTE (that is the start of a string). */
const BARE_KEY = /^[\x21\x23-\x7e][\x21-\x7e]*$/

/**
 * An RFC 8941 sf-string as a whole field value, decoded (§4.2.5): DQUOTE, printable ASCII
 * (%x20-7E) in which `\` escapes only `"` or `\`, DQUOTE. null for anything else: an unterminated
 * string, another escape, a character outside %x20-7E, anything after the closing quote
 * (parameters, a second value). `""` decodes to the empty string.
 */
export function parseSfString(field: string): string | null {
  if (field[0] !== '"') return null
  let value = ''
  for (let i = 1; i < field.length; i++) {
    const c = field.charCodeAt(i)
    if (c === 0x22) return i === field.length - 1 ? value : null
    if (c === 0x5c) {
      const escaped = field[++i]
      if (escaped !== '"' && escaped !== '\\') return null
      value += escaped
    } else if (c >= 0x20 && c <= 0x7e) value += field[i]
    else return null
  }
  return null
}

/**
 * The key as sent: an RFC 8941 sf-string (`"order 42"`, decoded, so spaces are allowed inside the
 * quotes) or bare visible ASCII (`order-42`), both spellings naming the same key. null when it is
 * neither, or when it decodes to nothing or to more than MAX_REQUEST_KEY_LENGTH characters: the empty
 * string is a valid sf-string but a useless key.
 */
export function parseIdempotencyKey(raw: unknown): string | null {
  if (typeof raw !== 'string' || raw.length > MAX_FIELD_LENGTH) return null
  const key = raw.startsWith('"') ? parseSfString(raw) : BARE_KEY.test(raw) ? raw : null
  return key !== null && key.length >= 1 && key.length <= MAX_REQUEST_KEY_LENGTH ? key : null
}

/** An array or object being written: its items or fields (keys sorted), and the next to write. */
interface Frame {
  close: ']' | '}'
  array: unknown[] | null
  record: Record<string, unknown>
  keys: string[]
  next: number
  written: number
}

/** Writes a scalar, or the opening bracket of an array or object and returns its frame. */
function open(value: unknown, write: (text: string) => void): Frame | null {
  if (Array.isArray(value)) {
    write('[')
    return { close: ']', array: value, record: {}, keys: [], next: 0, written: 0 }
  }
  // Values with their own JSON form (a Buffer, a Date from a custom parser) are written as such.
  if (
    value !== null &&
    typeof value === 'object' &&
    typeof (value as { toJSON?: unknown }).toJSON !== 'function'
  ) {
    if (value instanceof RegExp) {
      write(JSON.stringify(String(value)))
      return null
    }
    const record = value as Record<string, unknown>
    write('{')
    return { close: '}', array: null, record, keys: Object.keys(record).sort(), next: 0, written: 0 }
  }
  // JSON would write Infinity (a parsed 1e400) and NaN as null, and a BigInt not at all: keep them apart.
  if (typeof value === 'number' && !Number.isFinite(value)) write(String(value))
  else if (typeof value === 'bigint') write(`${value}n`)
  else write(JSON.stringify(value) ?? 'null')
  return null
}

/**
 * Writes JSON with object keys sorted at every depth, in pieces. An explicit stack instead of
 * recursion: any body the JSON parser accepted, however deeply nested, is written without
 * exhausting the call stack.
 */
export function writeCanonicalJson(value: unknown, write: (text: string) => void): void {
  const stack: Frame[] = []
  const first = open(value, write)
  if (first) stack.push(first)
  while (stack.length > 0) {
    const frame = stack[stack.length - 1]!
    const { array, record, keys } = frame
    if (frame.next === (array ? array.length : keys.length)) {
      write(frame.close)
      stack.pop()
      continue
    }
    let item: unknown
    let label = ''
    if (array) item = array[frame.next++]
    else {
      const key = keys[frame.next++]!
      item = record[key]
      // As JSON.stringify does: a field holding undefined is left out (an array item is null).
      if (item === undefined) continue
      label = `${JSON.stringify(key)}:`
    }
    if (frame.written++ > 0) write(',')
    if (label) write(label)
    const child = open(item, write)
    if (child) stack.push(child)
  }
}

/** JSON with object keys sorted at every depth, so `{a,b}` and `{b,a}` fingerprint alike. */
export function canonicalJson(value: unknown): string {
  const parts: string[] = []
  writeCanonicalJson(value, (text) => parts.push(text))
  return parts.join('')
}

/** What a request targets besides its route pattern: path parameters, parsed query string, and the route's constraints. */
export interface RequestTarget {
  params?: unknown
  query?: unknown
  /** Routes may share a pattern and differ by constraint (host, version). */
  constraints?: unknown
}

/**
 * SHA-256 over method, route pattern, path parameters, query (canonical JSON: the order of
 * query fields does not matter), the route's constraints and body (raw bytes for text or binary bodies, else canonical JSON).
 * A key reused on another target (`/orders/2` after `/orders/1`, or with another query) is
 * therefore a different request.
 */
export function requestFingerprint(
  method: string,
  route: string,
  body: unknown,
  target: RequestTarget = {},
): string {
  const hash = createHash('sha256').update(`${method}\n${route}\n`)
  // Pieces are gathered into chunks: one hash update per piece would cost more than the hashing.
  let chunk = ''
  const write = (text: string) => {
    chunk += text
    if (chunk.length >= 65_536) {
      hash.update(chunk)
      chunk = ''
    }
  }
  write('params\n')
  writeCanonicalJson(target.params ?? {}, write)
  write('\nquery\n')
  writeCanonicalJson(target.query ?? {}, write)
  write('\nconstraints\n')
  writeCanonicalJson(target.constraints ?? {}, write)
  write('\n')
  if (Buffer.isBuffer(body) || typeof body === 'string') {
    hash.update(`${chunk}raw\n`).update(body)
    return hash.digest('base64url')
  }
  write('json\n')
  writeCanonicalJson(body ?? null, write)
  return hash.update(chunk).digest('base64url')
}

/** Thrown by valueFingerprint when a value's canonical JSON outgrows its bound (or never ends: a cycle). */
export class FingerprintTooLargeError extends RangeError {}

/**
 * SHA-256 over the canonical JSON of any value (a wrapped function's arguments, or what its
 * `fingerprintOf` returned). The JSON is hashed as it is written and bounded by `maxChars`: a
 * cyclic value, which would be written forever, throws FingerprintTooLargeError instead.
 */
export function valueFingerprint(value: unknown, maxChars: number): string {
  const hash = createHash('sha256').update('value\n')
  let chunk = ''
  let total = 0
  writeCanonicalJson(value, (text) => {
    chunk += text
    if (chunk.length < 65_536) return
    total += chunk.length
    if (total > maxChars) throw new FingerprintTooLargeError(`over ${maxChars} characters of JSON`)
    hash.update(chunk)
    chunk = ''
  })
  if (total + chunk.length > maxChars)
    throw new FingerprintTooLargeError(`over ${maxChars} characters of JSON`)
  return hash.update(chunk).digest('base64url')
}
