import type { FastifyDynamicSwaggerOptions, SwaggerTransform } from '@fastify/swagger'
import type { FastifySchema } from 'fastify'
import { type TProperties, type TSchema, Type } from 'typebox'
import type { Config } from '../config.ts'
import { type ProblemSlug, problemType, problemUri } from './problem-types.ts'

// How the served OpenAPI document (/docs/json) is built. Routes declare what is theirs (operationId,
// summary, description, success and problem responses with the helpers below); what follows from a
// route's config is added here, once, so it cannot drift from what the plugins do:
// - `session: 'required'` -> `security` (the session cookie); every other route says `security: []`.
// - `idempotency` -> the `Idempotency-Key` header parameter.
// - rate limited (every documented route: the `ip` policy applies to each route registered after
//   the plugin) -> `RateLimit` and `RateLimit-Policy` on every response, and a 429 if not declared.
// - a `default` problem response (500 and the rare client errors a route does not list).

export const PROBLEM_JSON = 'application/problem+json'

/** The security scheme session routes name. */
export const SESSION_SCHEME = 'session'

/** Request header: the syntax the idempotency plugin accepts (src/plugins/idempotency/key.ts). */
export const IDEMPOTENCY_KEY_PATTERN = '^(?:[!#-~][!-~]{0,254}|"(?:[ !#-\\[\\]-~]|\\\\["\\\\]){1,255}")$'

const IdempotencyKey = Type.String({
  minLength: 1,
  maxLength: 512,
  pattern: IDEMPOTENCY_KEY_PATTERN,
  description:
    'A key the client makes up for this request (a UUID is a good choice), sent again unchanged when ' +
    'retrying it. 1 to 255 characters, sent bare (visible ASCII 0x21-0x7E: `7f3c1e2a-demo`) or as an ' +
    'RFC 8941 structured-field string (printable ASCII with spaces: `"order 42"`, with `\\"` and `\\\\` ' +
    'escapes): `7f3c1e2a-demo` and `"7f3c1e2a-demo"` are the same key. Scoped to the customer and the route; kept 24 hours. Missing: 400 ' +
    '`/problems/idempotency-key-missing`; malformed (or sent twice): 400 `/problems/idempotency-key-invalid`. ' +
    'Same key and body after completion: the first response again with `Idempotent-Replayed: true`; ' +
    'while the first is still running: 409; another body: 422.',
  examples: ['7f3c1e2a-demo'],
})

/** Response headers, as @fastify/swagger takes them (a schema with its description). */
export const HEADERS = {
  'RateLimit-Policy': {
    type: 'string',
    description:
      'The quota of each rate-limit policy that applied to this request (draft-ietf-httpapi-ratelimit-headers): ' +
      'one list item per policy, `q` the limit, `w` the window in seconds (token bucket: the time to refill ' +
      'from empty). Sent while rate limiting is on (the default).',
    example: '"ip";q=100;w=2, "transfers";q=10;w=60',
  },
  RateLimit: {
    type: 'string',
    description:
      'The state of each policy that applied: `r` the remaining units, `t` the seconds until more quota is ' +
      'available. Sent while rate limiting is on (the default).',
    example: '"ip";r=99;t=1, "transfers";r=9;t=43',
  },
  'Retry-After': {
    type: 'integer',
    minimum: 1,
    description: 'Seconds to wait before retrying (with the same `Idempotency-Key`, where there is one).',
    example: 1,
  },
  'Idempotent-Replayed': {
    type: 'string',
    enum: ['true'],
    description:
      'Present on a replay: this is the kept response of the first request with this `Idempotency-Key`; nothing ran again.',
  },
} as const

export const setCookieHeader = (cookieName: string, description: string, example: string) => ({
  'Set-Cookie': {
    type: 'string',
    description: description.replaceAll('{cookie}', `\`${cookieName}\``),
    example,
  },
})

/** A response as a route schema takes it: Fastify serializes by `content`, @fastify/swagger documents all of it. */
export interface ResponseDoc {
  description: string
  headers?: Record<string, object>
  content?: Record<string, { schema: TSchema }>
  type?: 'null'
}

type Headers = Record<string, object>

export function json(schema: TSchema, description: string, headers?: Headers): ResponseDoc {
  return { description, ...(headers ? { headers } : {}), content: { 'application/json': { schema } } }
}

export function noContent(description: string, headers?: Headers): ResponseDoc {
  return { description, ...(headers ? { headers } : {}), type: 'null' }
}

const REASONS: Record<number, string> = {
  400: 'Bad request',
  401: 'Unauthenticated',
  404: 'Not found',
  409: 'Conflict',
  410: 'Gone',
  413: 'Payload too large',
  415: 'Unsupported media type',
  422: 'Unprocessable content',
  429: 'Too many requests',
  500: 'Internal server error',
  503: 'Service unavailable',
}

const WITH_POLICY: readonly string[] = [
  'rate-limited',
  'rate-limit-banned',
  'rate-limit-unavailable',
  'rate-limit-error',
]

/** RFC 9457 problem details whose `type` is one of `slugs` (any type when none are listed). */
export function problemSchema(status: number | null, slugs: ProblemSlug[], extra: TProperties = {}) {
  const policy = slugs.some((s) => WITH_POLICY.includes(s))
  return Type.Object(
    {
      type: Type.Unsafe<string>({
        type: 'string',
        ...(slugs.length ? { enum: slugs.map(problemUri) } : {}),
        description:
          'The problem type: a URI reference relative to the gateway (`/problems/<slug>`); it resolves to a page that documents it.',
      }),
      title: Type.String({ description: 'A short summary of the problem type.' }),
      status: status
        ? Type.Unsafe<number>({ type: 'integer', enum: [status], description: 'The HTTP status.' })
        : Type.Integer({ minimum: 400, maximum: 599, description: 'The HTTP status.' }),
      detail: Type.String({ description: 'What went wrong with this request.' }),
      ...(policy
        ? { policy: Type.Optional(Type.String({ description: 'The rate-limit policy concerned.' })) }
        : {}),
      ...extra,
    },
    { additionalProperties: true, description: 'RFC 9457 problem details' },
  )
}

function describeTypes(slugs: ProblemSlug[]): string {
  return slugs
    .map((slug) => `- [\`${problemUri(slug)}\`](${problemUri(slug)}): ${problemType(slug)!.when}`)
    .join('\n')
}

export interface ProblemOptions {
  /** Statuses a replay of a kept response can answer with (they may carry Idempotent-Replayed). */
  replayable?: number[]
  /** Extension members of one status's problems. */
  extra?: Record<number, TProperties>
}

/**
 * Problem responses per status, `application/problem+json`, each listing the `type`s it can be.
 * Retry-After on 409, 429 and 503 (every such problem of the gateway carries it).
 */
export function problems<S extends number>(
  byStatus: Record<S, ProblemSlug[]>,
  options: ProblemOptions = {},
): Record<S, ResponseDoc> {
  const responses: Record<number, ResponseDoc> = {}
  for (const [key, slugs] of Object.entries<ProblemSlug[]>(byStatus)) {
    const status = Number(key)
    for (const slug of slugs) {
      const documented = problemType(slug)!.status
      if (documented !== status)
        throw new Error(`problem ${slug} is answered with ${documented}, not ${status}`)
    }
    const headers: Headers = {}
    if ([409, 429, 503].includes(status)) headers['Retry-After'] = HEADERS['Retry-After']
    if (options.replayable?.includes(status)) headers['Idempotent-Replayed'] = HEADERS['Idempotent-Replayed']
    responses[status] = {
      description: `${REASONS[status] ?? 'Error'}: problem details, \`type\` one of\n\n${describeTypes(slugs)}`,
      ...(Object.keys(headers).length ? { headers } : {}),
      content: { [PROBLEM_JSON]: { schema: problemSchema(status, slugs, options.extra?.[status]) } },
    }
  }
  return responses as Record<S, ResponseDoc>
}

const DEFAULT_PROBLEM: ResponseDoc = {
  description:
    'Any other error, as problem details: 500 [`/problems/internal`](/problems/internal) (the details go ' +
    'to the log only) or [`/problems/rate-limit-error`](/problems/rate-limit-error), and the client errors ' +
    'a route rarely answers (405, 406, 413 or 415 for a body where none is expected, ' +
    '[`/problems/client-error`](/problems/client-error)). Every `type` is listed at [/problems](/problems).',
  content: { [PROBLEM_JSON]: { schema: problemSchema(null, []) } },
}

const RATE_LIMIT_HEADERS = { 'RateLimit-Policy': HEADERS['RateLimit-Policy'], RateLimit: HEADERS.RateLimit }

/** The transform of @fastify/swagger: adds what follows from each route's config (see the top). */
export const documentRoute: SwaggerTransform = ({ schema, url, route }) => {
  if (!schema || schema.hide) return { schema, url }
  const config = route.config ?? {}
  const doc: FastifySchema = { ...schema }
  doc.security = config.session === 'required' ? [{ [SESSION_SCHEME]: [] }] : []
  const idempotency = config.idempotency as { required?: boolean } | undefined
  if (idempotency) {
    // Documented only: the plugin checks the header (its own problem types), not Fastify's validation.
    const own = (schema.headers ?? {}) as { properties?: object; required?: string[] }
    doc.headers = {
      type: 'object',
      properties: { ...own.properties, 'Idempotency-Key': IdempotencyKey },
      required: [...(own.required ?? []), ...(idempotency.required ? ['Idempotency-Key'] : [])],
    }
  }
  const response: Record<string, ResponseDoc> = { ...(schema.response as Record<string, ResponseDoc>) }
  response.default ??= DEFAULT_PROBLEM
  if (config.rateLimits !== false) {
    response[429] ??= problems({ 429: ['rate-limited'] })[429]
    for (const [status, entry] of Object.entries(response)) {
      response[status] = { ...entry, headers: { ...entry.headers, ...RATE_LIMIT_HEADERS } }
    }
  }
  doc.response = response
  return { schema: doc, url }
}

type HeaderObject = { $ref?: string; description?: string; schema?: object }
type DocumentWithHeaders = {
  paths?: Record<
    string,
    Record<string, { responses?: Record<string, { headers?: Record<string, HeaderObject> }> }>
  >
  components?: { headers?: Record<string, HeaderObject> }
}

/**
 * The transformObject of @fastify/swagger: the response headers every operation shares (HEADERS) are
 * declared once under `components.headers` and referenced, instead of repeated on every response.
 */
export function shareHeaders<T>(document: T): T {
  const doc = document as DocumentWithHeaders
  const shared: Record<string, HeaderObject> = {}
  for (const item of Object.values(doc.paths ?? {})) {
    for (const operation of Object.values(item)) {
      for (const response of Object.values(operation.responses ?? {})) {
        for (const name of Object.keys(response.headers ?? {})) {
          if (!(name in HEADERS)) continue
          shared[name] ??= response.headers![name]!
          response.headers![name] = { $ref: `#/components/headers/${name}` }
        }
      }
    }
  }
  doc.components = { ...doc.components, headers: { ...doc.components?.headers, ...shared } }
  return document
}

export const sessionCookieName = (config: Config) => (config.session.secure ? '__Host-sid' : 'sid')

/** The options of @fastify/swagger for the gateway. */
export function openapiOptions(config: Config): FastifyDynamicSwaggerOptions {
  const cookie = sessionCookieName(config)
  return {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'Demo banking gateway',
        version: '0.1.0',
        description:
          'The demo gateway of fastify-redis-gateway: log in, read your accounts and balances, and move money ' +
          'with an `Idempotency-Key`.\n\n' +
          '- **Sessions**: `POST /session` sets a signed cookie (`sid`; `__Host-sid` in production, where it is ' +
          '`Secure`); the routes with the `session` security requirement need it.\n' +
          '- **Errors** are RFC 9457 problem details (`application/problem+json`); each `type` is a relative ' +
          'URI that resolves to its documentation ([/problems](/problems)).\n' +
          '- **Rate limits** (draft-ietf-httpapi-ratelimit-headers): `RateLimit` and `RateLimit-Policy` on ' +
          'every limited response; a 429 carries `Retry-After` and names the `policy`.\n' +
          '- **Idempotency** (draft-ietf-httpapi-idempotency-key-header): `POST /transfers` requires an ' +
          '`Idempotency-Key`; a retry with the same key and body replays the first response ' +
          '(`Idempotent-Replayed: true`).',
        license: { name: 'MIT', url: 'https://opensource.org/license/mit' },
      },
      servers: [
        {
          url: config.publicUrl,
          description: 'This gateway (PUBLIC_URL; by default the local demo that `npm start` runs)',
        },
      ],
      tags: [
        { name: 'session', description: 'Log in and out; the session cookie' },
        { name: 'accounts', description: "The customer's accounts and balances" },
        { name: 'transfers', description: 'Moving money, exactly once per Idempotency-Key' },
        { name: 'notifications', description: 'Live notifications of transfers (Server-Sent Events)' },
        { name: 'campaigns', description: "The week's leaderboard of senders and today's totals" },
        { name: 'problems', description: 'The documentation of each problem `type`' },
        { name: 'operations', description: 'Liveness and readiness probes' },
      ],
      components: {
        securitySchemes: {
          [SESSION_SCHEME]: {
            type: 'apiKey',
            in: 'cookie',
            name: cookie,
            description:
              `The session cookie, as this gateway sends it: \`${cookie}\`. Its name depends on the environment: ` +
              '`sid` in development and test, `__Host-sid` where sessions are secure (production; then also ' +
              '`Secure`, with `Path=/` and no `Domain`). Set by `POST /session` (signed: `<id>.<signature>`), ' +
              '`HttpOnly`, `SameSite=Lax`, `Max-Age` the absolute session lifetime; cleared by `DELETE /session`. ' +
              'A cookie signed with a retired secret is accepted and re-signed in a `Set-Cookie` of that response.',
          },
        },
      },
    },
    transform: documentRoute,
    transformObject: (document) =>
      'openapiObject' in document ? shareHeaders(document.openapiObject) : document.swaggerObject,
  }
}
