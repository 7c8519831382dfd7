import type { FastifyReply, FastifyRequest } from 'fastify'
import type { RedisClient } from '../../redis/client.ts'

// @fastify/rate-limit 11's option, result and decorator types, as its users write them.

export type Awaitable<T> = T | Promise<T>
export type MaxFunction = (request: FastifyRequest, key: string) => Awaitable<number>
export type WindowFunction = (request: FastifyRequest, key: string) => Awaitable<number>

export interface ErrorResponseBuilderContext {
  statusCode: number
  ban: boolean
  after: string
  max: number
  ttl: number
}

export interface RateLimitOptions {
  max?: number | MaxFunction
  timeWindow?: number | string | WindowFunction
  keyGenerator?: (request: FastifyRequest) => Awaitable<string | number>
  allowList?: string[] | ((request: FastifyRequest, key: string) => Awaitable<boolean>)
  groupId?: string
  hook?: 'onRequest' | 'preParsing' | 'preValidation' | 'preHandler'
  skipOnError?: boolean
  errorResponseBuilder?: (request: FastifyRequest, context: ErrorResponseBuilderContext) => unknown
  addHeaders?: Partial<Record<string, boolean>>
  addHeadersOnExceeding?: Partial<Record<string, boolean>>
  enableDraftSpec?: boolean
  ipv6Subnet?: number
  ban?: number
  onBanReach?: (request: FastifyRequest, key: string) => void
  onExceeding?: (request: FastifyRequest, key: string) => void
  onExceeded?: (request: FastifyRequest, key: string) => void
  continueExceeding?: boolean
  exponentialBackoff?: boolean
}

export interface RateLimitPluginOptions extends RateLimitOptions {
  global?: boolean
  /** An ioredis client: counters live in Redis (shared by every instance); without it, in this process. */
  redis?: RedisClient
  /** Redis key prefix. Default 'fastify-rate-limit-'. */
  nameSpace?: string
  /**
   * How long registration waits for `redis` to be ready (ms; 0: do not wait). Default 1000. Past
   * it the boot goes on with a warning, and requests follow `skipOnError` until Redis answers.
   */
  connectTimeoutMs?: number
  /** Keys kept by the in-process store (least recently used dropped first). Default 5000. */
  cache?: number
  /**
   * @fastify/rate-limit's custom store class (`new Store(options)` with `incr`, `read`, `child`):
   * routes then count in it instead of Redis or this process (see the migration guide).
   */
  store?: CustomStoreClass
}

/** What a `createRateLimit` limiter answers: allowed (allow list) or counted. */
export type CreateRateLimitResult =
  | { isAllowed: true; key: string }
  | {
      isAllowed: false
      key: string
      max: number
      timeWindow: number
      remaining: number
      ttl: number
      ttlInSeconds: number
      isExceeded: boolean
      isBanned: boolean
    }

export type StoreCallback = (err: Error | null, result?: { current: number; ttl: number }) => void
export interface CustomStore {
  incr(key: string | number, callback: StoreCallback, timeWindow: number, max: number): void
  read?(key: string | number, callback: StoreCallback, timeWindow: number, max: number): void
  child(options: Record<string, unknown>): CustomStore
}
export type CustomStoreClass = new (options: Record<string, unknown>) => CustomStore

export type Hook = (request: FastifyRequest, reply: FastifyReply) => Promise<void>

/**
 * The decorators this plugin adds. Not declared on FastifyInstance here: @fastify/rate-limit's own
 * types declare the same names and may share a program with ours. An app without them adds:
 * `declare module 'fastify' { interface FastifyInstance extends RateLimitDecorators {} }`.
 */
export interface RateLimitDecorators {
  rateLimit: (options?: RateLimitOptions) => Hook
  createRateLimit: (
    options?: RateLimitOptions,
  ) => (request: FastifyRequest, callOptions?: { increment?: boolean }) => Promise<CreateRateLimitResult>
}
