import { createHash } from 'node:crypto'
import { shownType } from '../common/options.ts'
import { SessionHandleError, SessionLifetimeError, SessionPrincipalError } from './errors.ts'

// What the session store checks of what its caller hands it: a session's id or handle, a
// principal, and the lifetime a login asks for.

const SESSION_ID = /^[A-Za-z0-9_-]{43}$/
const SESSION_HANDLE = /^[A-Za-z0-9_-]{22}$/

/** True for a string of the ids' form (43 base64url characters: 256 random bits). */
export const isWellFormedId = (id: string): boolean => SESSION_ID.test(id)

/**
 * A session's non-secret handle: 128 bits of SHA-256 of its id, base64url (22 characters). The id
 * is the bearer secret the cookie carries; the handle names the session in a listing and cannot be
 * turned back into the id, so showing it (to the user, in a URL, in logs) lets nobody use the session.
 */
export function sessionHandle(id: string): string {
  return createHash('sha256').update(id).digest().subarray(0, 16).toString('base64url')
}

/** True for a string of the handles' form (22 base64url characters): what a route may accept. */
export const isWellFormedHandle = (handle: unknown): handle is string =>
  typeof handle === 'string' && SESSION_HANDLE.test(handle)

const shown = shownType

export function checkPrincipal(principal: unknown): asserts principal is string {
  if (typeof principal !== 'string' || principal.length === 0 || principal.length > 128)
    throw new SessionPrincipalError(
      `Session principal must be a string of 1-128 characters, got ${typeof principal === 'string' ? `one of ${principal.length}` : shown(principal)}`,
    )
}

export function checkHandle(handle: unknown): asserts handle is string {
  if (!isWellFormedHandle(handle))
    throw new SessionHandleError(
      `Session handle must be a string of 22 base64url characters, got ${typeof handle === 'string' ? `one of ${(handle as string).length}` : shown(handle)}`,
    )
}

/** A session's lifetime chosen at login ("remember me", or shorter for a sensitive login). */
export interface SessionLifetime {
  /** Its idle timeout, instead of the plugin's `idleTimeoutMs`; at most `maxIdleTimeoutMs`. */
  idleTimeoutMs?: number
  /** Its lifetime from login, instead of `absoluteTimeoutMs`; at most `maxAbsoluteTimeoutMs`, at least its idle timeout. */
  absoluteTimeoutMs?: number
}

/** The store's timeouts and the most a login may ask for (each maximum defaults to its timeout). */
export interface LifetimeLimits {
  idleTimeoutMs: number
  absoluteTimeoutMs: number
  maxIdleTimeoutMs?: number
  maxAbsoluteTimeoutMs?: number
}

/**
 * The idle timeout and lifetime of a new session, `lifetime` checked against the maxima
 * (SessionLifetimeError otherwise); `ownIdleTimeout` when the login gave its own idle timeout,
 * which the session then stores.
 */
export function resolveLifetime(
  lifetime: SessionLifetime | undefined,
  limits: LifetimeLimits,
): { idleTimeoutMs: number; absoluteTimeoutMs: number; ownIdleTimeout: boolean } {
  const { idleTimeoutMs, absoluteTimeoutMs } = limits
  if (lifetime === undefined) return { idleTimeoutMs, absoluteTimeoutMs, ownIdleTimeout: false }
  const fail = (message: string): never => {
    throw new SessionLifetimeError(`Session lifetime: ${message}`)
  }
  if (typeof lifetime !== 'object' || lifetime === null || Array.isArray(lifetime))
    fail(`expected an object with idleTimeoutMs and/or absoluteTimeoutMs, got ${shown(lifetime)}`)
  for (const key of Object.keys(lifetime))
    if (key !== 'idleTimeoutMs' && key !== 'absoluteTimeoutMs')
      fail(`unknown key \`${key}\` (valid: idleTimeoutMs, absoluteTimeoutMs)`)
  const maxIdle = limits.maxIdleTimeoutMs ?? idleTimeoutMs
  const maxAbsolute = limits.maxAbsoluteTimeoutMs ?? absoluteTimeoutMs
  const idle = lifetime.idleTimeoutMs ?? idleTimeoutMs
  const absolute = lifetime.absoluteTimeoutMs ?? absoluteTimeoutMs
  if (!Number.isSafeInteger(idle) || idle <= 0 || idle > maxIdle)
    fail(
      `\`idleTimeoutMs\` must be a whole number of ms from 1 to maxIdleTimeoutMs (${maxIdle}), got ${shown(idle)}`,
    )
  if (!Number.isSafeInteger(absolute) || absolute <= 0 || absolute > maxAbsolute)
    fail(
      `\`absoluteTimeoutMs\` must be a whole number of ms from 1 to maxAbsoluteTimeoutMs (${maxAbsolute}), got ${shown(absolute)}`,
    )
  if (absolute < idle)
    fail(`\`absoluteTimeoutMs\` (${absolute}) must be no smaller than the idle timeout (${idle})`)
  return {
    idleTimeoutMs: idle,
    absoluteTimeoutMs: absolute,
    ownIdleTimeout: lifetime.idleTimeoutMs !== undefined,
  }
}

export interface SessionTimes {
  createdAt: number
  /** When the session ends if no further request touches it: min(last touch + idle, absolute). */
  expiresAt: number
  absoluteExpiresAt: number
}

/** Most sessions `listSessions` answers with (the newest first). */
export const MAX_LISTED_SESSIONS = 100
/** Most index entries `listSessions` looks at in one call (`destroySession` reads the whole index, as `destroyAll` does). */
export const MAX_INDEX_SCAN = 1000

/** One of a principal's live sessions, as `listSessions` describes it. */
export interface SessionInfo {
  /** The non-secret handle (`sessionHandle(id)`): what `destroySession` takes. Never the id. */
  handle: string
  createdAt: number
  /** When the session ends if no further request touches it (its key's TTL, on the Redis clock). */
  expiresAt: number
  absoluteExpiresAt: number
  /** Its idle timeout: the plugin's, or the one given at login. */
  idleTimeoutMs: number
}
