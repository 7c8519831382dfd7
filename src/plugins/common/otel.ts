import { tracingChannel } from 'node:diagnostics_channel'
import type { FastifyRequest } from 'fastify'
import { scriptNameOf } from '../../redis/scripts.ts'
import {
  type CacheChannelContext,
  CHANNELS,
  channels,
  type RateLimitChannelContext,
  type RateLimitDecisionInfo,
} from './diagnostics.ts'

// OpenTelemetry without configuration (docs/observability.md#opentelemetry): when
// @opentelemetry/api is installed and an SDK registered a tracer provider, every decision published
// on the tracing channels becomes attributes of a span: the request's span (@fastify/otel's) for
// the plugins' hooks, else the active span. No span of our own, none per Redis call. Without an SDK
// nothing subscribes, so the channels cost nothing. The Redis spans a Redis instrumentation makes
// get the name of the script they run (`db.stored_procedure.name`): from ioredis's own tracing
// channel, or through `ioredisRequestHook` for @opentelemetry/instrumentation-ioredis.

/** The part of @opentelemetry/api this uses. */
interface OtelApi {
  trace: {
    getActiveSpan(): OtelSpan | undefined
    getTracer(name: string): { startSpan(name: string): OtelSpan }
  }
  isSpanContextValid(context: unknown): boolean
}
interface OtelSpan {
  setAttributes(attributes: Record<string, unknown>): unknown
  isRecording(): boolean
  spanContext(): { traceId: string; spanId: string; traceFlags: number }
  /** The SDK's spans have these (ReadableSpan); the API's interface does not. */
  readonly kind?: number
  readonly attributes?: Record<string, unknown>
}

const SPAN_KIND_CLIENT = 2

/**
 * `requestHook` for @opentelemetry/instrumentation-ioredis, which patches the client and makes a
 * span per command: names the script an EVALSHA or EVAL of this package runs, as the OpenTelemetry
 * Redis conventions ask (`db.stored_procedure.name`). `new IORedisInstrumentation({ requestHook:
 * ioredisRequestHook })`.
 */
export function ioredisRequestHook(
  span: { setAttribute(key: string, value: string): unknown },
  command: { cmdName: string; cmdArgs: readonly unknown[] },
): void {
  const name = scriptNameOf(command.cmdName, command.cmdArgs)
  if (name) span.setAttribute('db.stored_procedure.name', name)
}

/**
 * ioredis 5.11+ publishes each command on its `ioredis:command` tracing channel; a tracer built on
 * it makes the command's span active when `start` is published. If one subscribed before the app
 * was ready, name the scripts on its spans. Subscribing otherwise would make ioredis build a context
 * for every command for nobody.
 */
function nameScriptSpans(api: OtelApi): void {
  const commands = tracingChannel('ioredis:command')
  if (!commands.start.hasSubscribers) return
  commands.start.subscribe((message) => {
    const command = message as { command: string; args: readonly unknown[] }
    const name = scriptNameOf(command.command, command.args)
    if (!name) return
    const span = api.trace.getActiveSpan()
    const system = span?.attributes?.['db.system.name'] ?? span?.attributes?.['db.system']
    // Only the command's own span: never the request's, when no tracer made one.
    if (span?.isRecording() && span.kind === SPAN_KIND_CLIENT && system === 'redis')
      span.setAttributes({ 'db.stored_procedure.name': name })
  })
}

type Attributes = Record<string, string | number | boolean | string[] | number[] | boolean[]>

let bridged: Promise<boolean> | null = null
/** The API once the bridge subscribed; null while no SDK is registered. */
let bridgedApi: OtelApi | null = null

/**
 * Subscribes the channels once per process if OpenTelemetry is there; resolves whether it did.
 * Called by each plugin at registration (the SDK is registered before the app, as @fastify/otel
 * needs too); while no SDK is registered, a later registration asks again.
 */
export function bridgeOpenTelemetry(): Promise<boolean> {
  bridged ??= (async () => {
    let api: OtelApi
    try {
      api = (await import('@opentelemetry/api' as string)) as OtelApi
    } catch {
      return false
    }
    // The API without an SDK answers with invalid, non-recording spans: nothing to attach to.
    const probe = api.trace.getTracer('fastify-redis-gateway').startSpan('probe')
    if (!api.isSpanContextValid(probe.spanContext())) {
      bridged = null
      return false
    }
    subscribe(api)
    nameScriptSpans(api)
    bridgedApi = api
    return true
  })()
  return bridged
}

/** A request's span: @fastify/otel's request span, else the active one. */
function requestSpan(api: OtelApi, request: FastifyRequest | undefined): OtelSpan | undefined {
  const otel = (request as { opentelemetry?: () => { span?: OtelSpan | null } } | undefined)?.opentelemetry
  return (typeof otel === 'function' ? otel.call(request).span : undefined) ?? api.trace.getActiveSpan()
}

/** The span a request's decisions go on, while it records. */
function spanOf(api: OtelApi, request: FastifyRequest | undefined): OtelSpan | undefined {
  const span = requestSpan(api, request)
  return span?.isRecording() ? span : undefined
}

/** The sampled trace the metrics plugin's exemplars point to: the request's span's, else the active one's. */
export function exemplarOf(request?: FastifyRequest): Record<string, string> | undefined {
  if (!bridgedApi) return undefined
  // An ended span (the request's, by onResponse) still names its trace.
  const context = requestSpan(bridgedApi, request)?.spanContext()
  if (!context || !(context.traceFlags & 1) || !bridgedApi.isSpanContextValid(context)) return undefined
  return { trace_id: context.traceId, span_id: context.spanId }
}

function on<C extends object>(
  api: OtelApi,
  channel: { subscribe(handlers: { asyncEnd?: (context: C) => void }): void },
  attributes: (context: C, span: OtelSpan) => Attributes,
  request: (context: C) => FastifyRequest | undefined = () => undefined,
): void {
  channel.subscribe({
    asyncEnd(context) {
      const span = spanOf(api, request(context))
      if (span) span.setAttributes(attributes(context, span))
    },
  })
}

/** A request checked in two hooks (onRequest, preHandler): its span lists the decisions of both. */
const decisionsOf = new WeakMap<OtelSpan, RateLimitDecisionInfo[]>()

function subscribe(api: OtelApi): void {
  on<RateLimitChannelContext>(
    api,
    channels.rateLimit,
    (c, span) => {
      const decisions = (decisionsOf.get(span) ?? []).concat(c.decisions)
      decisionsOf.set(span, decisions)
      return {
        'ratelimiter.name': decisions.map((d) => d.policy),
        'ratelimiter.algorithm': decisions.map((d) => d.algorithm),
        'ratelimiter.result': decisions.map((d) => d.outcome),
        'ratelimiter.remaining': decisions.map((d) => d.remaining ?? -1),
        'ratelimiter.reset_ms': decisions.map((d) => d.resetMs),
        'ratelimiter.shadow': decisions.map((d) => d.shadow),
        ...(c.rejected ? { 'ratelimiter.rejected': c.rejected } : {}),
        ...(c.degraded ? { 'ratelimiter.degraded': true } : {}),
      }
    },
    (c) => c.request,
  )
  on(
    api,
    channels.session,
    (c): Attributes => (c.decision ? { 'session.decision': c.decision } : {}),
    (c) => c.request,
  )
  on(
    api,
    channels.idempotency,
    (c): Attributes => ({
      ...(c.outcome ? { 'idempotency.outcome': c.outcome } : {}),
      ...(c.takeover ? { 'idempotency.takeover': true } : {}),
      ...(c.retryAfterMs !== null ? { 'idempotency.retry_after_ms': c.retryAfterMs } : {}),
    }),
    (c) => c.request,
  )
  on<CacheChannelContext>(api, channels.cache, (c) => ({
    'cache.name': c.name,
    ...(c.usage ? { 'cache.usage': c.usage } : {}),
    'cache.loaded': c.loaded,
    'cache.lease_wait': c.leaseWait,
  }))
  on(api, channels.lock, (c) => ({
    'lock.name': c.name,
    'lock.acquired': c.acquired,
    ...(c.fence !== null ? { 'lock.fence': c.fence } : {}),
  }))
  on(api, channels.delayedQueue, (c) => ({
    'delayed_queue.name': c.queue,
    'delayed_queue.operation': c.operation,
    'delayed_queue.count': c.count,
  }))
  on(api, channels.feed, (c) => ({
    'feed.operation': c.operation,
    ...(c.mode ? { 'feed.mode': c.mode } : {}),
    ...(c.operation === 'read' ? { 'feed.items': c.count } : {}),
  }))
}

/** Every channel the bridge subscribes (for docs and tests). */
export const BRIDGED_CHANNELS = Object.values(CHANNELS)
