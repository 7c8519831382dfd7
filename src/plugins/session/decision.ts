import type { Session } from './session.ts'

/**
 * What the session plugin decided about a request's session, in `request.sessionDecision` (set
 * from preParsing on, like `request.session`; login and logout do not change it):
 *
 * - `'none'`: no session cookie was presented.
 * - `'anonymous'`: none was presented, and with `saveUninitialized` the request got an anonymous
 *   session (stored on its first change).
 * - `'found'`: the presented session, loaded; its idle expiry was not slid (this instance did so
 *   less than `touchAfterMs` ago).
 * - `'slid'`: the presented session, loaded, and its idle expiry slid.
 * - `'forged'`: the cookie was refused before Redis: a signature no secret verifies, a malformed
 *   id, or over 256 characters.
 * - `'ended'`: the cookie is genuine but its session no longer exists: logged out, ended by its
 *   handle or by "log out everywhere", expired while idle, or lost with Redis's data (Redis keeps
 *   nothing that tells these apart).
 * - `'expired'`: the cookie is genuine but its session is past its absolute lifetime: deleted now.
 * - `'unavailable'`: Redis could not be asked (`request.sessionUnavailable` is true).
 *
 * With `saveUninitialized`, a request whose cookie was refused (`'forged'`, `'ended'`, `'expired'`)
 * gets an anonymous session all the same; the decision says why it is not the presented one.
 */
export type SessionDecision =
  | 'none'
  | 'anonymous'
  | 'found'
  | 'slid'
  | 'forged'
  | 'ended'
  | 'expired'
  | 'unavailable'

/** What a load of a presented id found: the session, or why there is none. */
export type LoadResult =
  | { decision: 'found' | 'slid'; session: Session }
  | { decision: 'forged' | 'ended' | 'expired'; session: null }
