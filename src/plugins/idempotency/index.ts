import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onSendHookHandler,
  preHandlerHookHandler,
} from 'fastify'
import fp from 'fastify-plugin'
import { Counter } from 'prom-client'
import { bootPluginRedis } from '../../redis/server.ts'
import { adoptMetric, observePluginRedis, whenMetricsReady } from '../common/metrics.ts'
import { type PrincipalFunction, resolvePrincipal } from '../common/principal.ts'
import { HttpProblem, PROBLEM_CONTENT_TYPE, sendProblem } from '../common/problem.ts'
import { pluginRegistered, routeCovered } from '../common/route-coverage.ts'
import { addRouteHook, routeName } from '../common/route-hooks.ts'
import { parseIdempotencyKey, requestFingerprint } from './key.ts'
import {
  defaultScope,
  type IdempotencyFailureMode,
  type IdempotencyKeySource,
  type IdempotencyPluginOptions,
  type IdempotencyReplay,
  type IdempotencyReplayHook,
  type IdempotencyRouteConfig,
  type ResolvedRouteConfig,
  resolveOptions,
  resolveRouteConfig,
} from './options.ts'
import {
  keyInFlight,
  keyInvalid,
  keyMismatch,
  keyMissing,
  principalRequired,
  responseNotKept,
  storeUnavailable,
} from './problems.ts'
import { type IdempotencyLogger, IdempotencyStore, ownerToken, type StoredResponse } from './store.ts'

export {
  IdempotencyError,
  type IdempotencyErrorCode,
  IdempotencyFingerprintTooLargeError,
  IdempotencyInFlightError,
  IdempotencyKeyInvalidError,
  IdempotencyKeyMismatchError,
  IdempotencyResultNotKeptError,
  IdempotencyStoreUnavailableError,
} from './errors.ts'
export { canonicalJson, parseIdempotencyKey, type RequestTarget, requestFingerprint } from './key.ts'
export { type IdempotentFunction, type MakeIdempotentOptions, makeIdempotent } from './make-idempotent.ts'
export { keyMismatch as idempotencyKeyMismatch } from './problems.ts'
export type {
  IdempotencyFailureMode,
  IdempotencyKeySource,
  IdempotencyLogger,
  IdempotencyPluginOptions,
  IdempotencyReplay,
  IdempotencyReplayHook,
  IdempotencyRouteConfig,
}
export { IdempotencyStore, type StoredResponse }

export interface IdempotencyContext {
  /** The decoded key (`"abc"` and `abc` are the same key). */
  key: string
  fingerprint: string
  /** False when Redis could not be asked and the route proceeds on its own guard. */
  claimed: boolean
}

declare module 'fastify' {
  interface FastifyInstance {
    idempotency: IdempotencyStore
  }
  interface FastifyRequest {
    /** Set on opted-in routes once a key was validated; the handler may pass it to its own guard. */
    idempotency: IdempotencyContext | null
  }
  interface FastifyContextConfig {
    idempotency?: boolean | IdempotencyRouteConfig
  }
}

interface Claim {
  recordKey: string
  token: string
  renewal: NodeJS.Timeout
}

export const REPLAYED_HEADER = 'idempotent-replayed'
// Conditions a retry may clear: never kept, the claim is released instead.
const RETRYABLE_4XX = new Set([408, 409, 425, 429])
const MISMATCH_TYPE = keyMismatch().type

function payloadBytes(payload: unknown): Buffer | null {
  if (Buffer.isBuffer(payload)) return payload
  if (typeof payload === 'string') return Buffer.from(payload)
  if (payload === null || payload === undefined) return Buffer.alloc(0)
  return null
}

async function idempotencyPlugin(app: FastifyInstance, rawOptions: IdempotencyPluginOptions) {
  const options = resolveOptions(rawOptions)
  pluginRegistered(app, 'idempotency')
  const redis = await bootPluginRedis(app, 'idempotency', {
    redis: rawOptions.redis,
    connectTimeoutMs: options.connectTimeoutMs,
    eviction: options.allowEviction ? 'allow' : 'refuse',
    fix: '; or, for routes with a guard of their own that can take an evicted record, pass `allowEviction: true` to the idempotency plugin',
  })
  const store = new IdempotencyStore(redis, options)
  const headerField = options.headerName.toLowerCase()
  let principal: PrincipalFunction = () => null
  // With a notion of callers, a key without a principal would be shared by everyone behind one IP
  // (a NAT, a proxy): such requests are refused unless the route is open to anonymous callers.
  let principalSource = false
  app.addHook('onReady', async () => {
    principal = resolvePrincipal(app, rawOptions.principal)
    principalSource = rawOptions.principal !== undefined || app.hasDecorator('sessionPrincipal')
  })
  let outcomes = new Counter({
    name: 'idempotency_requests_total',
    help: 'Requests on idempotent routes by outcome',
    labelNames: ['outcome'] as const,
    registers: [],
  })
  let completions = new Counter({
    name: 'idempotency_responses_total',
    help: 'What happened to the responses of claimed requests',
    labelNames: ['result'] as const,
    registers: [],
  })
  let storedBytes = new Counter({
    name: 'idempotency_stored_bytes_total',
    help: 'Response body bytes written to idempotency records',
    registers: [],
  })
  whenMetricsReady(app, (metrics) => {
    outcomes = adoptMetric(metrics.registry, outcomes)
    completions = adoptMetric(metrics.registry, completions)
    storedBytes = adoptMetric(metrics.registry, storedBytes)
    observePluginRedis(app, metrics, redis, 'idempotency')
  })
  const claims = new WeakMap<FastifyRequest, Claim>()
  // The claims of requests still running: what onClose releases when requests were cut (shutdown).
  const inFlight = new Set<Claim>()
  // A guard behind the plugin (the transfer row's unique key) answering with the plugin's own
  // mismatch problem: releasing keeps the key free for the payload it really belongs to.
  const guardMismatches = new WeakSet<FastifyRequest>()

  app.decorate('idempotency', store)
  app.decorateRequest('idempotency', null)

  const reject = (reply: FastifyReply, outcome: string, problem: HttpProblem) => {
    outcomes.inc({ outcome })
    return sendProblem(reply, problem)
  }

  const replay = (reply: FastifyReply, response: StoredResponse) => {
    outcomes.inc({ outcome: 'replayed' })
    if (!response.body)
      return sendProblem(reply.header(REPLAYED_HEADER, 'true'), responseNotKept(response.status))
    for (const [name, value] of response.headers) reply.header(name, value)
    return reply.code(response.status).header(REPLAYED_HEADER, 'true').send(response.body)
  }

  // The same replay, with the route's onReplay hook run once the status and headers are on the reply.
  const replayWithHook = async (
    request: FastifyRequest,
    reply: FastifyReply,
    hook: IdempotencyReplayHook,
    response: StoredResponse,
    key: string,
    fingerprint: string,
  ) => {
    outcomes.inc({ outcome: 'replayed' })
    const notKept = response.body ? null : responseNotKept(response.status)
    if (notKept) reply.code(notKept.status).headers(notKept.headers).type(PROBLEM_CONTENT_TYPE)
    else {
      for (const [name, value] of response.headers) reply.header(name, value)
      reply.code(response.status)
    }
    reply.header(REPLAYED_HEADER, 'true')
    try {
      await hook(request, reply, { key, fingerprint, status: response.status, kept: !notKept })
    } catch (err) {
      request.log.error({ err }, 'idempotency onReplay hook failed; the replay is sent')
    }
    if (reply.sent) return reply
    return notKept ? reply.send(notKept.toJSON()) : reply.send(response.body)
  }

  const makePreHandler = (route: ResolvedRouteConfig, constraints: unknown): preHandlerHookHandler =>
    async function idempotencyClaim(request, reply) {
      let raw: unknown = request.headers[headerField]
      // The header wins; the route's own source is asked only without it (null means no key too).
      let fromRequest = false
      if (raw === undefined && route.keyFrom !== null) {
        raw = route.keyFrom(request) ?? undefined
        fromRequest = raw !== undefined
      }
      if (raw === undefined && !route.required) return
      // A custom scope decides alone who shares keys; the default one needs to know the caller.
      const who = options.scope ? null : principal(request)
      if (!options.scope && !who && principalSource && !route.anonymous)
        return reject(reply, 'anonymous', principalRequired())
      if (raw === undefined)
        return reject(reply, 'missing', keyMissing(options.headerName, route.keyFrom !== null))
      const key = parseIdempotencyKey(raw)
      if (key === null) return reject(reply, 'invalid', keyInvalid(fromRequest ? null : options.headerName))
      // The scope stays with the route pattern, the fingerprint covers the target: the same key on
      // another order, query or constrained route is a mismatch (422), never a replay of another's answer.
      const fingerprint = requestFingerprint(request.method, request.routeOptions.url ?? '', request.body, {
        params: request.params,
        query: request.query,
        constraints,
      })
      const scope = options.scope ? options.scope(request) : defaultScope(request, who)
      const recordKey = store.recordKey(scope, key)
      const token = ownerToken()
      let result: Awaited<ReturnType<IdempotencyStore['claim']>>
      try {
        result = await store.claim(recordKey, fingerprint, token)
      } catch (err) {
        request.log.warn({ err }, 'idempotency store unavailable')
        if (route.onRedisError === 'closed') return reject(reply, 'unavailable', storeUnavailable())
        outcomes.inc({ outcome: 'unavailable' })
        request.idempotency = { key, fingerprint, claimed: false }
        return
      }
      switch (result.kind) {
        case 'mismatch':
          return reject(reply, 'mismatch', keyMismatch())
        case 'conflict':
          return reject(reply, 'conflict', keyInFlight(Math.max(1, Math.ceil(result.retryAfterMs / 1000))))
        case 'replay':
          if (route.onReplay !== null)
            return replayWithHook(request, reply, route.onReplay, result.response, key, fingerprint)
          return replay(reply, result.response)
        default:
          outcomes.inc({ outcome: result.kind })
          request.idempotency = { key, fingerprint, claimed: true }
          {
            const claim = { recordKey, token, renewal: store.keepAlive(recordKey, token, request.log) }
            claims.set(request, claim)
            inFlight.add(claim)
          }
      }
    }

  // Awaited before the response leaves, so a client that has its answer always gets a replay next.
  const finish: onSendHookHandler = async (request, reply, payload) => {
    const claim = claims.get(request)
    if (!claim) return payload
    claims.delete(request)
    inFlight.delete(claim)
    clearInterval(claim.renewal)
    const status = reply.statusCode
    try {
      if (status >= 500 || RETRYABLE_4XX.has(status) || guardMismatches.has(request)) {
        await store.release(claim.recordKey, claim.token)
        completions.inc({ result: 'released' })
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
      const stored = await store.complete(claim.recordKey, claim.token, {
        status,
        headers,
        body: kept ? bytes : null,
      })
      if (!stored) {
        completions.inc({ result: 'lost' })
        request.log.warn('idempotency record not stored: the claim was taken over')
      } else if (kept) {
        completions.inc({ result: 'stored' })
        storedBytes.inc(bytes.length)
      } else {
        completions.inc({ result: 'not_kept' })
        request.log.warn({ limit: options.maxResponseBytes }, 'response too large to keep for replays')
      }
    } catch (err) {
      // The claim stays: its lease runs out and a retry takes it over. Deleting it instead would
      // let a retry run while this response is still on its way to the client.
      completions.inc({ result: 'store_failed' })
      request.log.error({ err }, 'idempotency record could not be written')
    }
    return payload
  }

  // Safety net: whatever path a response took, the renewal ends with it.
  const stopRenewal = async (request: FastifyRequest) => {
    const claim = claims.get(request)
    if (!claim) return
    clearInterval(claim.renewal)
    inFlight.delete(claim)
  }

  // Closing with requests still running (cut at the end of a shutdown's grace period): their claims
  // are released, so a retry elsewhere runs at once instead of waiting out the lease. A handler that
  // still completes after this finds its claim gone (`lost`); the route's own guard covers that case.
  app.addHook('onClose', async () => {
    const open = [...inFlight]
    inFlight.clear()
    for (const claim of open) clearInterval(claim.renewal)
    await Promise.allSettled(open.map((claim) => store.release(claim.recordKey, claim.token)))
  })

  const noteGuardMismatch = async (request: FastifyRequest, _reply: FastifyReply, error: Error) => {
    if (error instanceof HttpProblem && error.type === MISMATCH_TYPE) guardMismatches.add(request)
  }

  app.addHook('onRoute', (routeOptions) => {
    const route = resolveRouteConfig(routeOptions.config?.idempotency, options, routeName(routeOptions))
    if (!route) return
    routeCovered(app, 'idempotency', routeOptions)
    addRouteHook(routeOptions, 'preHandler', makePreHandler(route, routeOptions.constraints))
    addRouteHook(routeOptions, 'onSend', finish)
    addRouteHook(routeOptions, 'onResponse', stopRenewal)
    addRouteHook(routeOptions, 'onError', noteGuardMismatch)
  })
}

export default fp(idempotencyPlugin, { name: 'fastify-redis-gateway/idempotency', fastify: '5.x' })
