import { randomBytes } from 'node:crypto'
import { type Static, Type } from 'typebox'
import { Value } from 'typebox/value'

// Every environment variable the gateway reads, as raw strings; parsed into Config below.
const EnvSchema = Type.Object({
  NODE_ENV: Type.Optional(
    Type.Union([Type.Literal('development'), Type.Literal('production'), Type.Literal('test')]),
  ),
  LOG_LEVEL: Type.Optional(
    Type.Union(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((l) => Type.Literal(l))),
  ),
  METRICS_NAMES: Type.Optional(
    Type.Union([Type.Literal('prometheus'), Type.Literal('opentelemetry'), Type.Literal('both')]),
  ),
  PORT: Type.Optional(Type.String({ pattern: '^[0-9]{1,5}$' })),
  HOST: Type.Optional(Type.String({ minLength: 1 })),
  PUBLIC_URL: Type.Optional(Type.String({ pattern: '^https?://[^/?#\\s]+(/[^?#\\s]*)?$' })),
  TRUST_PROXY: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')])),
  REDIS_URL: Type.Optional(Type.String({ pattern: '^rediss?://' })),
  REDIS_CLUSTER_NODES: Type.Optional(Type.String({ pattern: '^[^,:\\s]+:[0-9]+(,[^,:\\s]+:[0-9]+)*$' })),
  REDIS_COMMAND_TIMEOUT_MS: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*$' })),
  CACHE_REDIS_URL: Type.Optional(Type.String({ pattern: '^rediss?://' })),
  CACHE: Type.Optional(Type.Union([Type.Literal('on'), Type.Literal('off')])),
  CACHE_TTL: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*(ms|s|m|h)$' })),
  CACHE_L1_TTL: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
  CACHE_LEASE_WAIT: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
  DATABASE_URL: Type.Optional(Type.String({ pattern: '^postgres(ql)?://' })),
  SESSION_SECRET: Type.Optional(Type.String({ minLength: 32 })),
  SESSION_IDLE_TIMEOUT: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
  SESSION_ABSOLUTE_TIMEOUT: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
  SESSION_L1_TTL: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
  RATE_LIMIT_TRANSFERS: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*/[0-9]+(ms|s|m|h)$' })),
  RATE_LIMIT_TRANSFERS_SHADOW: Type.Optional(
    Type.String({ pattern: '^(off|[1-9][0-9]*/[0-9]+(ms|s|m|h))$' }),
  ),
  RATE_LIMIT_EXPORTS: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,2}$' })),
  RATE_LIMIT_EXPORT_BYTES: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{3,11}$' })),
  RATE_LIMIT_LOGIN: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*/[0-9]+(ms|s|m|h)$' })),
  RATE_LIMIT_LOGIN_IP: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*/[0-9]+(ms|s|m|h)$' })),
  RATE_LIMIT_IP: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*,[0-9]+(\\.[0-9]+)?$' })),
  RATE_LIMIT_IP_SYNC: Type.Optional(Type.String({ pattern: '^(exact|[1-9][0-9]*(ms|s),[1-9][0-9]*)$' })),
  RATE_LIMITS: Type.Optional(Type.Union([Type.Literal('on'), Type.Literal('off')])),
  SEED_DEMO: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')])),
  SCHEDULER: Type.Optional(Type.Union([Type.Literal('on'), Type.Literal('off')])),
  RECONCILIATION_PERIOD: Type.Optional(Type.String({ pattern: '^[0-9]*[1-9][0-9]*(ms|s|m|h)$' })),
  SCHEDULED_TRANSFERS_MAX_PENDING: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,5}$' })),
  OUTBOX: Type.Optional(Type.Union([Type.Literal('on'), Type.Literal('off')])),
  EVENT_WORKERS: Type.Optional(
    Type.String({
      pattern: '^(on|off|(relay|notifier|campaigns|feed)(,(relay|notifier|campaigns|feed))*)$',
    }),
  ),
  OUTBOX_RELAY_INTERVAL: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*(ms|s|m|h)$' })),
  EVENTS_RETENTION: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,8}$' })),
  EVENTS_DEAD_LETTER_RETENTION: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,8}$' })),
  NOTIFICATIONS_RETENTION: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,8}$' })),
  NOTIFICATIONS_TTL: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*(ms|s|m|h)$' })),
  NOTIFICATIONS_DEDUP: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*(ms|s|m|h)$' })),
  SSE_HEARTBEAT: Type.Optional(Type.String({ pattern: '^[1-9][0-9]*(ms|s|m|h)$' })),
  SSE_MAX_STREAMS: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,3}$' })),
  FEED_PUSH_MAX_FOLLOWERS: Type.Optional(Type.String({ pattern: '^(0|[1-9][0-9]{0,8})$' })),
  FEED_ACTIVE_DAYS: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,2}$' })),
  ACCOUNT_FILTER: Type.Optional(Type.Union([Type.Literal('on'), Type.Literal('off')])),
  ACCOUNT_FILTER_CAPACITY: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,9}$' })),
  SHUTDOWN_DRAIN: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
  SHUTDOWN_GRACE: Type.Optional(Type.String({ pattern: '^[0-9]+(ms|s|m|h)$' })),
})
export type Env = Static<typeof EnvSchema>

const HINTS: Record<string, string> = {
  PORT: 'a port number',
  PUBLIC_URL: 'an http:// or https:// URL without query or fragment',
  REDIS_URL: 'a redis:// or rediss:// URL',
  REDIS_CLUSTER_NODES: 'a comma list of host:port',
  CACHE_REDIS_URL: 'a redis:// or rediss:// URL',
  CACHE: 'on or off',
  CACHE_TTL: 'a duration above zero like 60s',
  CACHE_L1_TTL: 'a duration like 1s (0s: no in-process L1)',
  CACHE_LEASE_WAIT: 'a duration like 2s',
  DATABASE_URL: 'a postgres:// URL',
  SESSION_SECRET: 'at least 32 characters (comma list for rotation; the first signs)',
  SESSION_IDLE_TIMEOUT: 'a duration like 30m',
  SESSION_ABSOLUTE_TIMEOUT: 'a duration like 8h',
  SESSION_L1_TTL: 'a duration like 5s (0s: no in-process L1)',
  RATE_LIMIT_TRANSFERS: 'LIMIT/WINDOW like 10/60s',
  RATE_LIMIT_TRANSFERS_SHADOW: 'LIMIT/WINDOW like 3/60s, or off',
  RATE_LIMIT_EXPORTS: 'a whole number from 1 to 999',
  RATE_LIMIT_EXPORT_BYTES: 'bytes a day, a whole number from 1000',
  RATE_LIMIT_LOGIN: 'LIMIT/WINDOW like 5/60s',
  RATE_LIMIT_LOGIN_IP: 'LIMIT/WINDOW like 20/60s',
  RATE_LIMIT_IP: 'CAPACITY,REFILL_PER_SECOND like 100,50',
  RATE_LIMIT_IP_SYNC: 'exact, or INTERVAL,BATCH like 250ms,100',
  RATE_LIMITS: 'on or off',
  SEED_DEMO: 'true or false',
  SCHEDULER: 'on or off',
  RECONCILIATION_PERIOD: 'a duration above zero like 24h',
  SCHEDULED_TRANSFERS_MAX_PENDING: 'a positive integer (unfinished scheduled transfers per customer)',
  OUTBOX: 'on or off',
  EVENT_WORKERS: 'on, off, or a comma list of relay, notifier, campaigns, feed',
  OUTBOX_RELAY_INTERVAL: 'a duration above zero like 1s',
  EVENTS_RETENTION: 'a positive integer (stream entries kept)',
  EVENTS_DEAD_LETTER_RETENTION: 'a positive integer (dead letters kept)',
  NOTIFICATIONS_RETENTION: 'a positive integer (notifications kept per customer)',
  NOTIFICATIONS_TTL: 'a duration above zero like 168h',
  NOTIFICATIONS_DEDUP: 'a duration above zero like 24h',
  SSE_HEARTBEAT: 'a duration above zero like 15s',
  SSE_MAX_STREAMS: 'a positive integer (open notification streams per customer and instance)',
  FEED_PUSH_MAX_FOLLOWERS: 'a whole number (followers above which a public account is pulled)',
  FEED_ACTIVE_DAYS: 'a whole number of days, 1 to 999',
  ACCOUNT_FILTER: 'on or off',
  ACCOUNT_FILTER_CAPACITY: 'a positive integer (accounts the filter is sized for)',
  TRUST_PROXY: 'true or false',
  SHUTDOWN_DRAIN: 'a duration like 5s (0s: no drain)',
  SHUTDOWN_GRACE: 'a duration like 20s',
}

export class ConfigError extends Error {
  override name = 'ConfigError'
}

export interface WindowLimit {
  limit: number
  windowMs: number
}

/** The transfer-event workers an instance can run: the outbox relay and the consumer groups. */
export interface EventWorkers {
  relay: boolean
  notifier: boolean
  /** The leaderboard and daily-totals consumer groups. */
  campaigns: boolean
  /** The public accounts' feed: its consumer group and its fan-out worker. */
  feed: boolean
}

export const NO_EVENT_WORKERS: EventWorkers = { relay: false, notifier: false, campaigns: false, feed: false }

function parseEventWorkers(value: string): EventWorkers {
  if (value === 'on') return { relay: true, notifier: true, campaigns: true, feed: true }
  const listed = new Set(value.split(','))
  return {
    relay: listed.has('relay'),
    notifier: listed.has('notifier'),
    campaigns: listed.has('campaigns'),
    feed: listed.has('feed'),
  }
}

export interface Config {
  nodeEnv: 'development' | 'production' | 'test'
  logLevel: string
  /** The latency histograms' names (the metrics plugin's `names`). */
  metricsNames: 'prometheus' | 'opentelemetry' | 'both'
  port: number
  host: string
  /** Where clients reach this gateway: the OpenAPI document's `servers` entry. */
  publicUrl: string
  trustProxy: boolean
  redis: { url?: string; clusterNodes?: Array<{ host: string; port: number }>; commandTimeoutMs: number }
  cacheRedisUrl?: string
  /** Balance cache: on/off, fresh lifetime, in-process L1 lifetime (0: no L1). */
  cache: { enabled: boolean; ttlMs: number; l1TtlMs: number; leaseWaitMs: number }
  databaseUrl?: string
  session: {
    secrets: string[]
    idleTimeoutMs: number
    absoluteTimeoutMs: number
    secure: boolean
    /** The session L1's lifetime; 0: none. */
    l1TtlMs: number
  }
  rateLimits: {
    enabled: boolean
    transfers: WindowLimit
    /** A stricter transfers limit in shadow mode (counted and logged, never enforced); null: none. */
    transfersShadow: WindowLimit | null
    /** Statement exports of a customer in flight at once. */
    exports: number
    /** Bytes of statements a customer downloads a day. */
    exportBytes: number
    login: WindowLimit
    /** Every login attempt from one IP, whatever the username: bounds the password-hashing CPU one client gets. */
    loginIp: WindowLimit
    /** `sync`: false for exact, else the buffered policy's interval and batch. */
    ip: { capacity: number; refillPerSecond: number; sync: { intervalMs: number; batch: number } | false }
  }
  seedDemo: boolean
  /**
   * Public accounts' feed: a public account with more followers than `pushMaxFollowers` is read by
   * its followers (pull) instead of written into each feed (push); fan-out reaches followers active
   * within `activeWindowMs` (FEED_ACTIVE_DAYS).
   */
  feed: { pushMaxFollowers: number; activeWindowMs: number }
  /**
   * The Bloom filter of account ids the balance route asks before the database (ACCOUNT_FILTER);
   * under NODE_ENV=test on only when a test asks (GatewayDependencies.accountFilter).
   */
  accountFilter: { enabled: boolean; capacity: number }
  /**
   * The workers of scheduled transfers and the reconciliation job (SCHEDULER, default on); under
   * NODE_ENV=test they only run when a test asks (GatewayDependencies.scheduler). `maxPending`: a
   * customer's unfinished (`scheduled` or `running`) schedules at most.
   */
  scheduler: { enabled: boolean; reconciliationPeriodMs: number; maxPending: number }
  /** Transfer events (docs/demo/events.md): outbox, relay and notifier workers, SSE notifications. */
  events: {
    outbox: boolean
    /** Which transfer-event workers this instance runs (EVENT_WORKERS; `on`: all of them). */
    workers: EventWorkers
    relayIntervalMs: number
    streamRetention: number
    /** Approximate dead letters kept on `events:transfers:dead` (EVENTS_DEAD_LETTER_RETENTION). */
    deadLetterRetention: number
    notificationsRetention: number
    /**
     * How long a customer's notification stream lives after its latest notification, and the age
     * beyond which its entries are trimmed (NOTIFICATIONS_TTL).
     */
    notificationsTtlMs: number
    /** How long the notifier remembers an event id per customer (NOTIFICATIONS_DEDUP). */
    notificationsDedupMs: number
    sseHeartbeatMs: number
    sseMaxStreamsPerCustomer: number
  }
  /**
   * On SIGTERM/SIGINT (docs/demo/operations.md): `drainMs` of normal serving with /ready at 503, then at
   * most `graceMs` to answer the requests already received before they are cut.
   */
  shutdown: { drainMs: number; graceMs: number }
}

const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 } as const

export function parseDuration(text: string): number {
  const match = /^([0-9]+)(ms|s|m|h)$/.exec(text)
  if (!match) throw new ConfigError(`invalid duration '${text}'`)
  return Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS]
}

function parseWindowLimit(text: string): WindowLimit {
  const [limit, window] = text.split('/') as [string, string]
  return { limit: Number(limit), windowMs: parseDuration(window) }
}

/** `exact`, or a buffered policy's sync interval and batch. */
function parseSync(text: string): { intervalMs: number; batch: number } | false {
  if (text === 'exact') return false
  const [interval, batch] = text.split(',') as [string, string]
  return { intervalMs: parseDuration(interval), batch: Number(batch) }
}

/** The listen address as clients on this machine reach it (a wildcard address is not one to connect to). */
function defaultPublicUrl(host: string, port: number): string {
  const reachable = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host
  return `http://${reachable.includes(':') ? `[${reachable}]` : reachable}:${port}`
}

/** Reads the environment once; throws ConfigError naming the first bad variable. */
export function loadConfig(env: Record<string, string | undefined> = process.env): Config {
  const raw = Object.fromEntries(
    Object.keys(EnvSchema.properties).map((name) => [name, env[name] || undefined]),
  )
  const error = Value.Errors(EnvSchema, raw)[0]
  if (error) {
    const name = error.instancePath.replace(/^\//, '')
    const got = name === 'SESSION_SECRET' ? '(hidden)' : `'${String(raw[name])}'`
    throw new ConfigError(
      `Invalid environment variable ${name}: expected ${HINTS[name] ?? error.message}, got ${got}`,
    )
  }
  const e = raw as Env
  const nodeEnv = e.NODE_ENV ?? 'development'
  const production = nodeEnv === 'production'
  if (production && !e.SESSION_SECRET) {
    throw new ConfigError('Invalid environment variable SESSION_SECRET: required when NODE_ENV=production')
  }
  const secrets = (e.SESSION_SECRET ?? randomBytes(32).toString('base64url')).split(',')
  if (secrets.some((s) => s.length < 32)) {
    throw new ConfigError(
      'Invalid environment variable SESSION_SECRET: every secret in the list needs 32+ characters',
    )
  }
  const clusterNodes = e.REDIS_CLUSTER_NODES?.split(',').map((node) => {
    const [host, port] = node.split(':') as [string, string]
    return { host, port: Number(port) }
  })
  const port = Number(e.PORT ?? 3000)
  if (port > 65535)
    throw new ConfigError(`Invalid environment variable PORT: expected a port number, got '${port}'`)
  const [capacity, refill] = (e.RATE_LIMIT_IP ?? '100,50').split(',') as [string, string]
  const idleTimeoutMs = parseDuration(e.SESSION_IDLE_TIMEOUT ?? '30m')
  const absoluteTimeoutMs = parseDuration(e.SESSION_ABSOLUTE_TIMEOUT ?? '8h')
  if (idleTimeoutMs === 0 || absoluteTimeoutMs < idleTimeoutMs) {
    throw new ConfigError(
      'Invalid environment variable SESSION_ABSOLUTE_TIMEOUT: must be at least SESSION_IDLE_TIMEOUT, both above zero',
    )
  }
  return {
    nodeEnv,
    logLevel: e.LOG_LEVEL ?? (nodeEnv === 'test' ? 'silent' : 'info'),
    metricsNames: e.METRICS_NAMES ?? 'prometheus',
    port,
    host: e.HOST ?? '127.0.0.1',
    publicUrl: (e.PUBLIC_URL ?? defaultPublicUrl(e.HOST ?? '127.0.0.1', port)).replace(/\/+$/, ''),
    trustProxy: e.TRUST_PROXY === 'true',
    redis: {
      url: e.REDIS_URL,
      clusterNodes,
      commandTimeoutMs: Number(e.REDIS_COMMAND_TIMEOUT_MS ?? 500),
    },
    cacheRedisUrl: e.CACHE_REDIS_URL,
    cache: {
      enabled: (e.CACHE ?? 'on') === 'on',
      ttlMs: parseDuration(e.CACHE_TTL ?? '60s'),
      l1TtlMs: parseDuration(e.CACHE_L1_TTL ?? '5s'),
      leaseWaitMs: parseDuration(e.CACHE_LEASE_WAIT ?? '2s'),
    },
    databaseUrl: e.DATABASE_URL,
    session: {
      secrets,
      idleTimeoutMs,
      absoluteTimeoutMs,
      secure: production,
      l1TtlMs: parseDuration(e.SESSION_L1_TTL ?? '5s'),
    },
    rateLimits: {
      enabled: (e.RATE_LIMITS ?? 'on') === 'on',
      transfers: parseWindowLimit(e.RATE_LIMIT_TRANSFERS ?? '10/60s'),
      transfersShadow:
        (e.RATE_LIMIT_TRANSFERS_SHADOW ?? '3/60s') === 'off'
          ? null
          : parseWindowLimit(e.RATE_LIMIT_TRANSFERS_SHADOW ?? '3/60s'),
      exports: Number(e.RATE_LIMIT_EXPORTS ?? '2'),
      exportBytes: Number(e.RATE_LIMIT_EXPORT_BYTES ?? '50000000'),
      login: parseWindowLimit(e.RATE_LIMIT_LOGIN ?? '5/60s'),
      loginIp: parseWindowLimit(e.RATE_LIMIT_LOGIN_IP ?? '20/60s'),
      ip: {
        capacity: Number(capacity),
        refillPerSecond: Number(refill),
        sync: parseSync(e.RATE_LIMIT_IP_SYNC ?? '250ms,100'),
      },
    },
    seedDemo: e.SEED_DEMO !== 'false',
    feed: {
      pushMaxFollowers: Number(e.FEED_PUSH_MAX_FOLLOWERS ?? 10_000),
      activeWindowMs: Number(e.FEED_ACTIVE_DAYS ?? 30) * 86_400_000,
    },
    accountFilter: {
      enabled: (e.ACCOUNT_FILTER ?? 'on') === 'on',
      capacity: Number(e.ACCOUNT_FILTER_CAPACITY ?? 1_000_000),
    },
    scheduler: {
      enabled: (e.SCHEDULER ?? 'on') === 'on',
      reconciliationPeriodMs: parseDuration(e.RECONCILIATION_PERIOD ?? '24h'),
      maxPending: Number(e.SCHEDULED_TRANSFERS_MAX_PENDING ?? 100),
    },
    events: {
      outbox: (e.OUTBOX ?? 'on') === 'on',
      workers: parseEventWorkers(e.EVENT_WORKERS ?? 'on'),
      relayIntervalMs: parseDuration(e.OUTBOX_RELAY_INTERVAL ?? '1s'),
      streamRetention: Number(e.EVENTS_RETENTION ?? 100_000),
      deadLetterRetention: Number(e.EVENTS_DEAD_LETTER_RETENTION ?? 10_000),
      notificationsRetention: Number(e.NOTIFICATIONS_RETENTION ?? 1000),
      notificationsTtlMs: parseDuration(e.NOTIFICATIONS_TTL ?? '168h'),
      notificationsDedupMs: parseDuration(e.NOTIFICATIONS_DEDUP ?? '24h'),
      sseHeartbeatMs: parseDuration(e.SSE_HEARTBEAT ?? '15s'),
      sseMaxStreamsPerCustomer: Number(e.SSE_MAX_STREAMS ?? 5),
    },
    shutdown: {
      drainMs: parseDuration(e.SHUTDOWN_DRAIN ?? '5s'),
      graceMs: parseDuration(e.SHUTDOWN_GRACE ?? '20s'),
    },
  }
}
