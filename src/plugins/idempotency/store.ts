import { createHash, randomBytes } from 'node:crypto'
import { type RedisClient, runScript } from '../../lua/index.ts'

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
  return randomBytes(16).toString('base64url')
}

export interface IdempotencyStoreOptions {
  keyPrefix: string
  leaseMs: number
  retentionMs: number
}

/**
 * Idempotency records, one Hash per (scope, key) under its own hash tag. Every state change is one
 * script that checks the owner token, so only the request that claimed a record completes,
 * releases or renews it. Replies come back as Buffers, so stored bodies stay byte-exact.
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

  async claim(recordKey: string, fingerprint: string, token: string): Promise<ClaimResult> {
    const { leaseMs, retentionMs } = this.options
    const reply = await runScript<Buffer[]>(
      this.redis,
      'idempotencyClaim',
      [recordKey],
      [fingerprint, token, leaseMs, retentionMs],
      { buffers: true },
    )
    const kind = reply[0]!.toString()
    if (kind === 'conflict') return { kind, retryAfterMs: Number(reply[1]) }
    if (kind === 'replay') {
      const [, status, headers, body, kept] = reply
      return {
        kind,
        response: {
          status: Number(status),
          headers: JSON.parse(String(headers)),
          body: String(kept) === '1' ? body! : null,
        },
      }
    }
    return { kind: kind as 'new' | 'takeover' | 'mismatch' }
  }

  async renew(recordKey: string, token: string): Promise<boolean> {
    return (
      (await runScript<number>(
        this.redis,
        'idempotencyRenew',
        [recordKey],
        [token, this.options.leaseMs],
      )) === 1
    )
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

  /** False when the caller no longer owns the record (its lease was taken over). */
  async complete(recordKey: string, token: string, response: StoredResponse): Promise<boolean> {
    const args = [
      token,
      response.status,
      JSON.stringify(response.headers),
      response.body ?? '',
      response.body ? '1' : '0',
      this.options.retentionMs,
    ]
    return (await runScript<number>(this.redis, 'idempotencyComplete', [recordKey], args)) === 1
  }

  async release(recordKey: string, token: string): Promise<boolean> {
    return (await runScript<number>(this.redis, 'idempotencyRelease', [recordKey], [token])) === 1
  }
}
