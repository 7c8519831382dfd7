import type {
  FastifyReply,
  FastifyRequest,
  onErrorHookHandler,
  onResponseHookHandler,
  onSendHookHandler,
  preHandlerHookHandler,
} from 'fastify'
import type { RedisPluginContext } from '../common/context.ts'
import { channels, type IdempotencyChannelContext, traced } from '../common/diagnostics.ts'
import { HttpProblem, PROBLEM_CONTENT_TYPE, sendProblem } from '../common/problem.ts'
import type { IdempotencyOutcome } from './decision.ts'
import { parseIdempotencyKey, requestFingerprint } from './key.ts'
import type { IdempotencyMetrics } from './metrics.ts'
import { defaultScope, type ResolvedOptions, type ResolvedRouteConfig } from './options.ts'
import {
  keyInFlight,
  keyInvalid,
  keyMismatch,
  keyMissing,
  principalRequired,
  responseNotKept,
  storeUnavailable,
} from './problems.ts'
import { type ClaimResult, IdempotencyStore, ownerToken, type StoredResponse } from './store.ts'

export const REPLAYED_HEADER = 'idempotent-replayed'
// Conditions a retry may clear: never kept, the claim is released instead.
const RETRYABLE_4XX = new Set([408, 409, 425, 429])
const MISMATCH_TYPE = keyMismatch().type

interface Claim {
  recordKey: string
  token: string
  renewal: NodeJS.Timeout
}

/** What the plugin's hooks share: the skeleton's context and the plugin's own, built once at registration. */
export interface IdempotencyPluginContext extends RedisPluginContext<IdempotencyMetrics> {
  readonly options: ResolvedOptions
  readonly store: IdempotencyStore
  /**
   * Whether the app knows callers (the `principal` option, or the session plugin registered): a key
   * without a principal is then refused unless the route is `anonymous`. Asked once the app is ready.
   */
  readonly knowsCallers: () => boolean
  readonly claims: WeakMap<FastifyRequest, Claim>
  /** The claims of requests still running: what onClose releases when requests were cut (shutdown). */
  readonly inFlight: Set<Claim>
}

/** The plugin's context: the skeleton's, its settings, its store, and the claims of its requests. */
export function idempotencyContext(
  base: RedisPluginContext<IdempotencyMetrics>,
  options: ResolvedOptions,
  knowsCallers: () => boolean,
): IdempotencyPluginContext {
  return Object.freeze({
    ...base,
    options,
    store: new IdempotencyStore(base.redis, options),
    knowsCallers,
    claims: new WeakMap<FastifyRequest, Claim>(),
    inFlight: new Set<Claim>(),
  })
}

const requestLog = (request: FastifyRequest) => request.log.child({ plugin: 'idempotency' })

function payloadBytes(payload: unknown): Buffer | null {
  if (Buffer.isBuffer(payload)) return payload
  if (typeof payload === 'string') return Buffer.from(payload)
  if (payload === null || payload === undefined) return Buffer.alloc(0)
  return null
}

function reject(
  context: IdempotencyPluginContext,
  reply: FastifyReply,
  outcome: string,
  problem: HttpProblem,
) {
  context.metrics.requests.inc({ outcome })
  return sendProblem(reply, problem)
}

/** The stored response, with the route's onReplay hook run once the status and headers are on the reply. */
async function sendReplay(
  request: FastifyRequest,
  reply: FastifyReply,
  route: ResolvedRouteConfig,
  response: StoredResponse,
) {
  const { key, fingerprint } = request.idempotency!
  const notKept = response.body ? null : responseNotKept(response.status)
  request.idempotency!.stored = !notKept
  reply.header(REPLAYED_HEADER, 'true')
  if (notKept) reply.code(notKept.status).headers(notKept.headers).type(PROBLEM_CONTENT_TYPE)
  else {
    for (const [name, value] of response.headers) reply.header(name, value)
    reply.code(response.status)
  }
  if (route.onReplay) {
    try {
      await route.onReplay(request, reply, { key, fingerprint, status: response.status, kept: !notKept })
    } catch (err) {
      requestLog(request).error({ err }, 'onReplay hook failed; the replay is sent')
    }
    if (reply.sent) return reply
  }
  return reply.send(notKept ? notKept.toJSON() : response.body)
}

/** The route's preHandler: reads the key, asks Redis, and answers or lets the handler run. */
export function claimKey(
  context: IdempotencyPluginContext,
  route: ResolvedRouteConfig,
  constraints: unknown,
): preHandlerHookHandler {
  const { options, store } = context
  const headerField = options.headerName.toLowerCase()
  return async function idempotencyClaim(request, reply) {
    let raw: unknown = request.headers[headerField]
    // The header wins; the route's own source is asked only without it (null means no key too).
    let fromRequest = false
    if (raw === undefined && route.keyFrom !== undefined) {
      raw = route.keyFrom(request) ?? undefined
      fromRequest = raw !== undefined
    }
    if (raw === undefined && !route.required) return
    // A custom scope decides alone who shares keys; the default one needs to know the caller. With
    // a notion of callers, a key without a principal would be shared by everyone behind one IP (a
    // NAT, a proxy): refused unless the route is open to anonymous callers.
    const who = options.scope ? null : context.principal(request)
    if (!options.scope && !who && context.knowsCallers() && !route.anonymous)
      return reject(context, reply, 'anonymous', principalRequired())
    if (raw === undefined)
      return reject(context, reply, 'missing', keyMissing(options.headerName, route.keyFrom !== undefined))
    const key = parseIdempotencyKey(raw)
    if (key === null)
      return reject(context, reply, 'invalid', keyInvalid(fromRequest ? null : options.headerName))
    // The scope stays with the route pattern, the fingerprint covers the target: the same key on
    // another order, query or constrained route is a mismatch (422), never a replay of another's answer.
    const fingerprint = requestFingerprint(request.method, request.routeOptions.url ?? '', request.body, {
      params: request.params,
      query: request.query,
      constraints,
    })
    const recordKey = store.recordKey(
      options.scope ? options.scope(request) : defaultScope(request, who),
      key,
    )
    const token = ownerToken()
    const decided = (outcome: IdempotencyOutcome, claimed = false) => {
      request.idempotency = { outcome, key, fingerprint, claimed, stored: false }
    }
    let result: Awaited<ReturnType<IdempotencyStore['claim']>>
    try {
      result = await traced(
        channels.idempotency,
        () => ({ request, outcome: null, takeover: false, retryAfterMs: null }),
        () => store.claim(recordKey, fingerprint, token),
        describeClaim,
      )
    } catch (err) {
      requestLog(request).warn({ err }, 'store unavailable')
      decided('unavailable')
      if (route.onRedisError === 'closed') return reject(context, reply, 'unavailable', storeUnavailable())
      context.metrics.requests.inc({ outcome: 'unavailable' })
      return
    }
    switch (result.kind) {
      case 'mismatch':
        decided('mismatched')
        return reject(context, reply, 'mismatch', keyMismatch())
      case 'conflict':
        decided('conflicted')
        return reject(
          context,
          reply,
          'conflict',
          keyInFlight(Math.max(1, Math.ceil(result.retryAfterMs / 1000))),
        )
      case 'replay':
        decided('replayed')
        context.metrics.requests.inc({ outcome: 'replayed' })
        return sendReplay(request, reply, route, result.response)
      default: {
        decided('claimed', true)
        context.metrics.requests.inc({ outcome: result.kind })
        const claim = { recordKey, token, renewal: store.keepAlive(recordKey, token, requestLog(request)) }
        context.claims.set(request, claim)
        context.inFlight.add(claim)
      }
    }
  }
}

/** What the idempotency channel's subscribers see of a claim (src/plugins/common/diagnostics.ts). */
function describeClaim(context: IdempotencyChannelContext, result: ClaimResult): void {
  context.outcome =
    result.kind === 'replay'
      ? 'replayed'
      : result.kind === 'mismatch'
        ? 'mismatched'
        : result.kind === 'conflict'
          ? 'conflicted'
          : 'claimed'
  context.takeover = result.kind === 'takeover'
  if (result.kind === 'conflict') context.retryAfterMs = result.retryAfterMs
}

/**
 * onSend, awaited before the response leaves, so a client that has its answer always gets a replay
 * next: keeps the response of a claimed request, or releases the claim.
 */
export function keepResponse(context: IdempotencyPluginContext): onSendHookHandler {
  const { options, store, claims, inFlight } = context
  return async function idempotencyKeep(request, reply, payload) {
    const claim = claims.get(request)
    if (!claim) return payload
    claims.delete(request)
    inFlight.delete(claim)
    clearInterval(claim.renewal)
    const { responses, storedBytes } = context.metrics
    const status = reply.statusCode
    const decision = request.idempotency!
    try {
      if (status >= 500 || RETRYABLE_4XX.has(status) || decision.outcome === 'mismatched') {
        await store.release(claim.recordKey, claim.token)
        responses.inc({ result: 'released' })
        return payload
      }
      const bytes = payloadBytes(payload)
      const kept = bytes !== null && bytes.length <= options.maxResponseBytes
      const headers: Array<[string, string]> = []
      if (kept) {
        for (const name of options.replayHeaders) {
          const value = reply.getHeader(name)
          if (value !== undefined)
            headers.push([name, Array.isArray(value) ? value.join(', ') : String(value)])
        }
      }
      const written = await store.complete(claim.recordKey, claim.token, {
        status,
        headers,
        body: kept ? bytes : null,
      })
      decision.stored = written && kept
      if (!written) {
        responses.inc({ result: 'lost' })
        requestLog(request).warn('record not stored: the claim was taken over')
      } else if (kept) {
        responses.inc({ result: 'stored' })
        storedBytes.inc(bytes.length)
      } else {
        responses.inc({ result: 'not_kept' })
        requestLog(request).warn(
          { limit: options.maxResponseBytes },
          'response too large to keep for replays',
        )
      }
    } catch (err) {
      // The claim stays: its lease runs out and a retry takes it over. Deleting it instead would
      // let a retry run while this response is still on its way to the client.
      responses.inc({ result: 'store_failed' })
      requestLog(request).error({ err }, 'record could not be written')
    }
    return payload
  }
}

/** onResponse, the safety net: whatever path a response took, the renewal ends with it. */
export function stopRenewal(context: IdempotencyPluginContext): onResponseHookHandler {
  return async function idempotencyStopRenewal(request) {
    const claim = context.claims.get(request)
    if (!claim) return
    clearInterval(claim.renewal)
    context.inFlight.delete(claim)
  }
}

/**
 * onClose, with requests still running (cut at the end of a shutdown's grace period): their claims
 * are released, so a retry elsewhere runs at once instead of waiting out the lease. A handler that
 * still completes after this finds its claim gone (`lost`); the route's own guard covers that case.
 */
export async function releaseInFlight(context: IdempotencyPluginContext): Promise<void> {
  const open = [...context.inFlight]
  context.inFlight.clear()
  for (const claim of open) clearInterval(claim.renewal)
  await Promise.allSettled(open.map((claim) => context.store.release(claim.recordKey, claim.token)))
}

/**
 * onError: a guard behind the plugin (a database row holding the key) answering with the plugin's
 * own mismatch problem. The decision becomes `mismatched` and the claim is released, which keeps
 * the key free for the request it really belongs to.
 */
export const noteGuardMismatch: onErrorHookHandler = async function idempotencyGuardMismatch(
  request,
  _reply,
  error,
) {
  if (request.idempotency && error instanceof HttpProblem && error.type === MISMATCH_TYPE)
    request.idempotency.outcome = 'mismatched'
}

/**
 * onSend, first of the route's own: a guard behind the plugin answering with a replay of its own
 * (`Idempotent-Replayed: true`) makes the decision `replayed` before any later hook reads it (the
 * rate limit's `countOnlyFailures` among them).
 */
export const noteGuardReplay: onSendHookHandler = async function idempotencyGuardReplay(
  request,
  reply,
  payload,
) {
  if (request.idempotency && reply.getHeader(REPLAYED_HEADER) === 'true')
    request.idempotency.outcome = 'replayed'
  return payload
}
