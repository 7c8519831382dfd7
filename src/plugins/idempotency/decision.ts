/**
 * What became of a request that came with a valid key:
 * - `claimed`: this request owns the key; the handler runs.
 * - `replayed`: the stored response was sent (or the route's own guard answered with a replay,
 *   setting `Idempotent-Replayed: true`); nothing ran again.
 * - `mismatched`: the key was used with another request (422), by the plugin or by the route's own
 *   guard throwing `idempotencyKeyMismatch()`.
 * - `conflicted`: a request with the key and the same body is still running elsewhere (409).
 * - `unavailable`: Redis could not be asked: 503 on an `onRedisError: 'closed'` route, else the
 *   handler runs on its own guard.
 */
export type IdempotencyOutcome = 'claimed' | 'replayed' | 'mismatched' | 'conflicted' | 'unavailable'

/** `request.idempotency`: the plugin's decision on a request with a valid key. */
export interface IdempotencyContext {
  outcome: IdempotencyOutcome
  /** The decoded key (`"abc"` and `abc` are the same key). */
  key: string
  /** What the key is bound to: the request's method, route, target and body, hashed. */
  fingerprint: string
  /** True when this request took the key's claim in Redis (the handler ran guarded by it). */
  claimed: boolean
  /**
   * Whether Redis keeps this key's response for replays. On a claimed request, false until the
   * plugin's onSend hook has written it; it stays false when the response was released (5xx, 408,
   * 409, 425, 429, a thrown error, a mismatch from the route's guard), was over `maxResponseBytes`
   * or could not be written. On a replay, false when the stored response was over the cap (the
   * replay is the 410 problem).
   */
  stored: boolean
}
