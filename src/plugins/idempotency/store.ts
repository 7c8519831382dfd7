import { createHash } from 'node:crypto'
import type { RedisClient } from '../../redis/client.ts'
import { callScript } from '../../redis/scripts.ts'
import { randomToken } from '../common/random-token.ts'
import { IDEMPOTENCY_CLAIM, IDEMPOTENCY_COMPLETE, IDEMPOTENCY_RELEASE, IDEMPOTENCY_RENEW } from './scripts.ts'

export interface StoredResponse {
  status: number
  headers: Array<[string, string]>
  /** null when the response exceeded the size cap: the record only remembers that it ran. */
  body: Buffer | null
}

export type ClaimResult =
  | { kind: 'new' | 'takeover' | 'mismatch' }
  | { kind: 'conflict'; retryAfterMs: number }
  | { kind: 'replay'; response: StoredResponse }

/** Where the store reports what it cannot return: a lease it lost. Fastify's and pino's loggers fit it, so does `console`. */
export interface IdempotencyLogger {
  warn(details: object, message: string): void
  error(details: object, message: string): void
}

/** A fresh owner token for one claim: complete, release and renew only act for the token that claimed. */
export function ownerToken(): string {
  return randomToken(16)
}

const FINGERPRINT = /^[A-Za-z0-9_-]{43}$/

/**
 * Header lines common enough to be kept as their index in this list: `[0]` rather than
 * `[["content-type","application/json; charset=utf-8"]]` is what keeps the record of a typical JSON
 * answer (a transfer: 119 bytes of body) within one 160-byte allocation. Records outlive deploys,
 * so entries are only ever appended: an index must mean the same line to every version that reads it.
 */
const COMMON_HEADERS: ReadonlyArray<readonly [string, string]> = [
  ['content-type', 'application/json; charset=utf-8'],
  ['content-type', 'application/problem+json; charset=utf-8'],
  ['content-type', 'text/plain; charset=utf-8'],
  ['content-type', 'text/html; charset=utf-8'],
  ['content-type', 'application/octet-stream'],
]
const commonIndex = new Map(COMMON_HEADERS.map(([name, value], i) => [`${name}\n${value}`, i]))

/** The stored headers as JSON: an array of [name, value] pairs, or of indexes into COMMON_HEADERS for common lines. */
function encodeHeaders(headers: ReadonlyArray<[string, string]>): string {
  return JSON.stringify(headers.map((pair) => commonIndex.get(`${pair[0]}\n${pair[1]}`) ?? pair))
}

/** Reads encodeHeaders' JSON (plain pairs, as records written without the common lines hold, read alike). */
function decodeHeaders(json: string): Array<[string, string]> {
  return (JSON.parse(json) as Array<number | [string, string]>).map((entry) => {
    if (typeof entry !== 'number') return entry
    const common = COMMON_HEADERS[entry]
    // A record from a version with a longer list: replaying it without the header would not be the same answer.
    if (!common) throw new Error(`idempotency record names common header ${entry}, unknown to this version`)
    return [common[0], common[1]]
  })
}

export interface IdempotencyStoreOptions {
  keyPrefix: string
  leaseMs: number
  retentionMs: number
}

/**
 * Idempotency records, one key per (scope, key) under its own hash tag: a Hash while the request
 * runs, one packed String once its response is kept (a few hundred bytes less per retained record).
 * Every state change is one script that checks the owner token, so only the request that claimed a
 * record completes, releases or renews it. Replies come back as Buffers, so stored bodies stay byte-exact.
 */
export class IdempotencyStore {
  readonly redis: RedisClient
  readonly options: IdempotencyStoreOptions

  constructor(redis: RedisClient, options: IdempotencyStoreOptions) {
    this.redis = redis
    this.options = options
  }

  /** The scope and key are hashed: client-chosen text never appears in key names, and length is fixed. */
  recordKey(scope: string, key: string): string {
    const digest = createHash('sha256').update(`${scope}\n${key}`).digest('base64url')
    return `${this.options.keyPrefix}{${digest}}`
  }

  /**
   * `fingerprint`: a SHA-256 digest in base64url, as `requestFingerprint` and the functions' fingerprints
   * are; a completed record keeps its first 22 characters (132 bits), so a shorter or free-form string
   * could not be told apart.
   */
  async claim(recordKey: string, fingerprint: string, token: string): Promise<ClaimResult> {
    const { leaseMs, retentionMs } = this.options
    if (!FINGERPRINT.test(fingerprint))
      throw new TypeError('an idempotency fingerprint is a SHA-256 digest in base64url (43 characters)')
    const { kind, rest } = await callScript(
      this.redis,
      IDEMPOTENCY_CLAIM,
      { record: recordKey },
      { fingerprint, token, leaseMs, retentionMs },
    )
    if (kind === 'conflict') return { kind, retryAfterMs: Number(rest[0]) }
    if (kind === 'replay') {
      const [status, headers, body, kept] = rest
      return {
        kind,
        response: {
          status: Number(status),
          headers: decodeHeaders(String(headers)),
          body: String(kept) === '1' ? body! : null,
        },
      }
    }
    return { kind }
  }

  async renew(recordKey: string, token: string): Promise<boolean> {
    const reply = await callScript(
      this.redis,
      IDEMPOTENCY_RENEW,
      { record: recordKey },
      { token, leaseMs: this.options.leaseMs },
    )
    return reply === 'renewed'
  }

  /**
   * Renews the lease every third of it while its owner works (a route's handler, a wrapped
   * function), so a slow run keeps its claim. Stops by itself once the lease is lost (taken over or
   * expired); the owner stops it with clearInterval when done. Unref'd: it never keeps a process alive.
   */
  keepAlive(recordKey: string, token: string, log: IdempotencyLogger): NodeJS.Timeout {
    const renewal = setInterval(
      () => {
        this.renew(recordKey, token).then(
          (renewed) => {
            if (renewed) return
            clearInterval(renewal)
            log.warn({}, 'idempotency lease lost while its owner ran (taken over or expired)')
          },
          (err) => log.warn({ err }, 'idempotency lease renewal failed'),
        )
      },
      Math.floor(this.options.leaseMs / 3),
    )
    renewal.unref()
    return renewal
  }

  /** False when the caller no longer owns the record (its lease was taken over). `status`: 100 to 999. */
  async complete(recordKey: string, token: string, response: StoredResponse): Promise<boolean> {
    // The record keeps the status as three digits at a fixed place.
    if (!Number.isInteger(response.status) || response.status < 100 || response.status > 999)
      throw new TypeError('an idempotency record keeps a three-digit status')
    const reply = await callScript(
      this.redis,
      IDEMPOTENCY_COMPLETE,
      { record: recordKey },
      {
        token,
        status: response.status,
        headers: encodeHeaders(response.headers),
        body: response.body ?? '',
        kept: response.body ? '1' : '0',
        retentionMs: this.options.retentionMs,
      },
    )
    return reply === 'stored'
  }

  async release(recordKey: string, token: string): Promise<boolean> {
    const reply = await callScript(this.redis, IDEMPOTENCY_RELEASE, { record: recordKey }, { token })
    return reply === 'deleted'
  }
}
