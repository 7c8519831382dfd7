import { createHash } from 'node:crypto'

const VISIBLE_ASCII = /^[\x21-\x7e]{1,255}$/

/**
 * The key as sent bare (`abc`) or as an RFC 8941 structured-field string (`"abc"`), decoded so
 * both spellings name the same key; null when it is not 1 to 255 visible ASCII characters, or is
 * a malformed string (unterminated, bad escape, parameters, several values).
 */
export function parseIdempotencyKey(raw: string | string[] | undefined): string | null {
  if (typeof raw !== 'string') return null
  if (!raw.startsWith('"')) return VISIBLE_ASCII.test(raw) ? raw : null
  let value = ''
  for (let i = 1; i < raw.length; i++) {
    const c = raw[i]!
    if (c === '"') return i === raw.length - 1 && VISIBLE_ASCII.test(value) ? value : null
    if (c === '\\') {
      const escaped = raw[++i]
      if (escaped !== '"' && escaped !== '\\') return null
      value += escaped
    } else value += c
  }
  return null
}

/** JSON with object keys sorted at every depth, so `{a,b}` and `{b,a}` fingerprint alike. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map((v) => canonicalJson(v ?? null)).join(',')}]`
  if (value !== null && typeof value === 'object' && !Buffer.isBuffer(value)) {
    const record = value as Record<string, unknown>
    const fields = Object.keys(record)
      .filter((k) => record[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(record[k])}`)
    return `{${fields.join(',')}}`
  }
  return JSON.stringify(value) ?? 'null'
}

/** SHA-256 over method, route pattern and body (raw bytes for text or binary bodies, else canonical JSON). */
export function requestFingerprint(method: string, route: string, body: unknown): string {
  const hash = createHash('sha256').update(`${method}\n${route}\n`)
  if (Buffer.isBuffer(body)) hash.update('raw\n').update(body)
  else if (typeof body === 'string') hash.update('raw\n').update(body)
  else hash.update('json\n').update(canonicalJson(body ?? null))
  return hash.digest('base64url')
}
