/**
 * Every problem `type` the gateway answers with: the one table behind docs/demo/problems.md (checked by
 * test/demo/openapi-problems.test.ts), the pages served at `/problems/<slug>` (the `type` URIs resolve
 * there) and the problem responses of the OpenAPI document.
 */
export interface ProblemType {
  slug: string
  /** The HTTP status it is answered with ('4xx': whichever client error Fastify raised). */
  status: number | '4xx'
  title: string
  /** When it is answered; Markdown with `code` spans only. */
  when: string
  /** Who answers it: the demo, one of the plugins, or Fastify's own errors in problem form. */
  source: 'demo' | 'fastify' | 'session' | 'rate-limit' | 'idempotency'
}

export const PROBLEM_TYPES = [
  {
    slug: 'validation',
    status: 400,
    title: 'Invalid request',
    when: 'a body, path parameter or query string fails its schema (the `detail` names the field), or a string in one of them (value or field name) holds a NUL character or an unpaired UTF-16 surrogate',
    source: 'demo',
  },
  {
    slug: 'bad-request',
    status: 400,
    title: 'Bad request',
    when: 'the body is not well-formed JSON',
    source: 'fastify',
  },
  {
    slug: 'same-account',
    status: 400,
    title: 'Same account',
    when: 'a transfer names its source account as its destination',
    source: 'demo',
  },
  {
    slug: 'invalid-cursor',
    status: 400,
    title: 'Invalid cursor',
    when: 'a `cursor` of `GET /accounts/:accountId/transactions` that the gateway did not issue for that account (malformed, altered, another account’s, or signed with a secret no longer configured), or of `GET /feed` that the feed cannot read; page again from the start, without it',
    source: 'demo',
  },
  {
    slug: 'idempotency-key-missing',
    status: 400,
    title: 'Idempotency key required',
    when: '`POST /transfers` or `POST /scheduled-transfers` without an `Idempotency-Key` header',
    source: 'idempotency',
  },
  {
    slug: 'idempotency-key-invalid',
    status: 400,
    title: 'Invalid idempotency key',
    when: 'an `Idempotency-Key` that is not 1 to 255 characters, bare (visible ASCII) or as a structured-field string (printable ASCII, spaces allowed inside the quotes): empty, too long, a bare space, non-ASCII, sent twice, parameters',
    source: 'idempotency',
  },
  {
    slug: 'unauthenticated',
    status: 401,
    title: 'Authentication required',
    when: 'a session route without a valid session: the cookie is missing, expired, logged out, forged or tampered with',
    source: 'session',
  },
  {
    slug: 'bad-credentials',
    status: 401,
    title: 'Bad credentials',
    when: 'a login with an unknown username or a wrong password (indistinguishable, and equally slow)',
    source: 'demo',
  },
  {
    slug: 'idempotency-principal-required',
    status: 401,
    title: 'Authentication required',
    when: 'an `Idempotency-Key` on a route that keeps keys per caller, from a caller without a session (on `POST /transfers` the session check answers `unauthenticated` first)',
    source: 'idempotency',
  },
  {
    slug: 'rate-limit-banned',
    status: 403,
    title: 'Forbidden',
    when: 'a rate limit with `ban` was exceeded too many times in its window: `policy` names it, `Retry-After` says when the window (and the ban) ends',
    source: 'rate-limit',
  },
  {
    slug: 'account-not-found',
    status: 404,
    title: 'Account not found',
    when: 'an account that does not exist, or belongs to another customer (indistinguishable)',
    source: 'demo',
  },
  {
    slug: 'not-found',
    status: 404,
    title: 'Not found',
    when: 'no route for this method and path, or no problem type of this name under `/problems/`',
    source: 'demo',
  },
  {
    slug: 'method-not-allowed',
    status: 405,
    title: 'Method not allowed',
    when: "Fastify's own 405 error, in problem form",
    source: 'fastify',
  },
  {
    slug: 'not-acceptable',
    status: 406,
    title: 'Not acceptable',
    when: "Fastify's own 406 error, in problem form",
    source: 'fastify',
  },
  {
    slug: 'idempotency-key-in-flight',
    status: 409,
    title: 'Request in progress',
    when: 'the same request with this `Idempotency-Key` is still running; retry after `Retry-After` seconds (at most 10: the first request’s lease)',
    source: 'idempotency',
  },
  {
    slug: 'idempotency-response-not-kept',
    status: 410,
    title: 'Response not kept',
    when: 'the request with this key was processed but its response was too large to keep for replays (`originalStatus` names its status; not reachable with the demo’s responses)',
    source: 'idempotency',
  },
  {
    slug: 'payload-too-large',
    status: 413,
    title: 'Payload too large',
    when: 'a body over 16 KiB',
    source: 'fastify',
  },
  {
    slug: 'unsupported-media-type',
    status: 415,
    title: 'Unsupported media type',
    when: 'a body that is not `application/json`',
    source: 'fastify',
  },
  {
    slug: 'currency-mismatch',
    status: 422,
    title: 'Currency mismatch',
    when: 'the transfer’s currency differs from an account’s (the detail never names another customer’s currency)',
    source: 'demo',
  },
  {
    slug: 'insufficient-funds',
    status: 422,
    title: 'Insufficient funds',
    when: 'the source account does not hold the amount',
    source: 'demo',
  },
  {
    slug: 'run-at-out-of-range',
    status: 400,
    title: 'Run time out of range',
    when: 'a scheduled transfer whose `runAt` is not in the future, or more than one year ahead',
    source: 'demo',
  },
  {
    slug: 'schedule-not-found',
    status: 404,
    title: 'Schedule not found',
    when: 'a scheduled transfer that does not exist, or belongs to another customer (indistinguishable)',
    source: 'demo',
  },
  {
    slug: 'schedule-not-cancellable',
    status: 409,
    title: 'Schedule not cancellable',
    when: 'cancelling a scheduled transfer that is already running or finished (`Retry-After: 1`; a running one is finished by then, and cancelling stays refused)',
    source: 'demo',
  },
  {
    slug: 'too-many-pending-schedules',
    status: 409,
    title: 'Too many pending schedules',
    when: 'a scheduled transfer from a customer who already has `SCHEDULED_TRANSFERS_MAX_PENDING` schedules `scheduled` or `running` (`Retry-After`: until the earliest of them is due); cancel one or retry once one has run',
    source: 'demo',
  },
  {
    slug: 'idempotency-key-mismatch',
    status: 422,
    title: 'Idempotency key reused',
    when: 'the `Idempotency-Key` was already used with a different request; use a new key for a new request',
    source: 'idempotency',
  },
  {
    slug: 'rate-limited',
    status: 429,
    title: 'Too many requests',
    when: 'a rate limit is exceeded: `policy` names it, `Retry-After` says when to retry',
    source: 'rate-limit',
  },
  {
    slug: 'too-many-notification-streams',
    status: 429,
    title: 'Too many notification streams',
    when: '`GET /notifications` while this customer already has the maximum of open streams on this instance (`SSE_MAX_STREAMS`, `Retry-After: 5`); close one first',
    source: 'demo',
  },
  {
    slug: 'headers-too-large',
    status: 431,
    title: 'Request header fields too large',
    when: "Fastify's own 431 error, in problem form (a header block over Node's limit is refused before routing, with Fastify's own JSON body)",
    source: 'fastify',
  },
  {
    slug: 'client-error',
    status: '4xx',
    title: 'Client error',
    when: 'any other client error Fastify raises',
    source: 'fastify',
  },
  {
    slug: 'internal',
    status: 500,
    title: 'Internal server error',
    when: 'anything else that failed; the details go to the log only',
    source: 'demo',
  },
  {
    slug: 'rate-limit-error',
    status: 500,
    title: 'Internal server error',
    when: 'a rate-limit policy could not be applied to this request (its key function threw, a bad cost); `policy` names it',
    source: 'rate-limit',
  },
  {
    slug: 'session-store-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: 'Redis cannot be asked whether the session exists, or cannot store a new one (`Retry-After: 1`); nobody is let in unchecked',
    source: 'session',
  },
  {
    slug: 'database-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: "Postgres is not answering, or rolled the request's transaction back to break a deadlock or a serialization conflict; nothing was changed (`Retry-After: 2`)",
    source: 'demo',
  },
  {
    slug: 'notifications-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: '`GET /notifications` while Redis cannot be subscribed to or read (`Retry-After: 1`)',
    source: 'demo',
  },
  {
    slug: 'leaderboard-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: '`GET /leaderboard` or `GET /leaderboard/me` while Redis cannot be read (`Retry-After: 1`)',
    source: 'demo',
  },
  {
    slug: 'feed-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: '`GET /feed`, or following or unfollowing a public account, while Redis cannot be used (`Retry-After: 1`; a follow already stored is kept, and the retry completes it)',
    source: 'demo',
  },
  {
    slug: 'stats-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: '`GET /stats/today` while Redis cannot be read (`Retry-After: 1`)',
    source: 'demo',
  },
  {
    slug: 'not-ready',
    status: 503,
    title: 'Not ready',
    when: '`GET /ready` while Redis or Postgres does not answer (`redis` and `postgres` say which), or once the instance is shutting down (`Retry-After: 1`)',
    source: 'demo',
  },
  {
    slug: 'rate-limit-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: 'a `closed` rate-limit policy cannot be checked (`Retry-After: 1`, `policy`); the demo’s policies fall back to in-process limits instead',
    source: 'rate-limit',
  },
  {
    slug: 'idempotency-store-unavailable',
    status: 503,
    title: 'Service unavailable',
    when: 'the idempotency store cannot be asked on a `closed` route (`Retry-After: 1`); `POST /transfers` runs on its Postgres guard instead',
    source: 'idempotency',
  },
] as const satisfies readonly ProblemType[]

export type ProblemSlug = (typeof PROBLEM_TYPES)[number]['slug']

const BY_SLUG = new Map<string, ProblemType>(PROBLEM_TYPES.map((p) => [p.slug, p]))

export function problemType(slug: string): ProblemType | undefined {
  return BY_SLUG.get(slug)
}

/** The `type` member of a problem: a URI relative to the gateway, resolving to its page. */
export const problemUri = (slug: ProblemSlug) => `/problems/${slug}`

const SOURCES: Record<ProblemType['source'], string> = {
  demo: 'the demo',
  fastify: 'Fastify, in problem form',
  session: 'session plugin',
  'rate-limit': 'rate-limit plugin',
  idempotency: 'idempotency plugin',
}

/** The table of docs/demo/problems.md, exactly (the test compares the file with it). */
export function problemTableMarkdown(): string {
  const rows = PROBLEM_TYPES.map(
    (p) => `| \`/problems/${p.slug}\` | ${p.status} | ${p.title} | ${p.when} | ${SOURCES[p.source]} |`,
  )
  return ['| type | status | title | when | answered by |', '|---|---|---|---|---|', ...rows].join('\n')
}

const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`).replace(/`([^`]+)`/g, '<code>$1</code>')

function page(title: string, body: string): string {
  return `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>${escapeHtml(title)}</title>
<style>body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;line-height:1.5}
code{background:#f2f2f2;padding:0 .2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}</style>
</head>
<body>
${body}
<p><a href="/problems">All problem types</a> · <a href="/docs">API reference</a></p>
</body>
</html>
`
}

/** The page a `type` URI resolves to. */
export function problemPageHtml(p: ProblemType): string {
  return page(
    p.title,
    `<h1>${escapeHtml(p.title)}</h1>
<p><code>type</code>: <code>/problems/${p.slug}</code> · status <strong>${p.status}</strong> · answered by ${SOURCES[p.source]}</p>
<p>When: ${escapeHtml(p.when)}.</p>
<p>The body is <code>application/problem+json</code> (RFC 9457): <code>type</code>, <code>title</code>, <code>status</code>, <code>detail</code>.</p>`,
  )
}

export function problemIndexHtml(): string {
  const rows = PROBLEM_TYPES.map(
    (p) =>
      `<tr><td><a href="/problems/${p.slug}"><code>/problems/${p.slug}</code></a></td><td>${p.status}</td><td>${escapeHtml(p.title)}</td><td>${escapeHtml(p.when)}</td></tr>`,
  ).join('\n')
  return page(
    'Problem types',
    `<h1>Problem types</h1>
<p>Every error of the gateway is an RFC 9457 problem document (<code>application/problem+json</code>); its <code>type</code> is one of these.</p>
<table><thead><tr><th>type</th><th>status</th><th>title</th><th>when</th></tr></thead><tbody>
${rows}
</tbody></table>`,
  )
}
