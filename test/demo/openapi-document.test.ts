import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, test } from 'node:test'
import fc from 'fast-check'
import * as Schema from 'typebox/schema'
import { IDEMPOTENCY_KEY_PATTERN } from '../../src/routes/openapi.ts'
import { PROBLEM_TYPES } from '../../src/routes/problem-types.ts'
import { buildTestApp, createCustomer, login } from '../helpers/gateway.ts'
import { cookieHeader, startTcpProxy, TEST_REDIS_URL } from '../helpers/index.ts'
import { type OpenApiDocument, operations, type RunningDemo, startDemo } from '../openapi/demo.ts'

// What the served document says about each operation, and that real responses (problems
// included, now typed application/problem+json) are what it says, serialized as before.

let demo: RunningDemo
before(async () => {
  demo = await startDemo()
})
after(() => demo?.close())

const SESSION_ROUTES = [
  'GET /session',
  'DELETE /session',
  'GET /accounts',
  'GET /accounts/{accountId}/balance',
  'GET /accounts/{accountId}/transactions',
  'GET /accounts/{accountId}/statement.csv',
  'POST /transfers',
  'POST /scheduled-transfers',
  'GET /scheduled-transfers',
  'GET /scheduled-transfers/{scheduleId}',
  'DELETE /scheduled-transfers/{scheduleId}',
  'GET /notifications',
  'GET /leaderboard',
  'GET /leaderboard/me',
  'GET /stats/today',
  'GET /public-accounts',
  'PUT /public-accounts/{accountId}/follow',
  'DELETE /public-accounts/{accountId}/follow',
  'GET /feed',
]

test('every route is documented, with an operationId, a summary, a description and described responses', () => {
  const documented = operations(demo.document).map(({ method, path }) => `${method} ${path}`)
  assert.deepEqual(documented.sort(), [
    'DELETE /public-accounts/{accountId}/follow',
    'DELETE /scheduled-transfers/{scheduleId}',
    'DELETE /session',
    'GET /accounts',
    'GET /accounts/{accountId}/balance',
    'GET /accounts/{accountId}/statement.csv',
    'GET /accounts/{accountId}/transactions',
    'GET /feed',
    'GET /health',
    'GET /leaderboard',
    'GET /leaderboard/me',
    'GET /notifications',
    'GET /problems',
    'GET /problems/{slug}',
    'GET /public-accounts',
    'GET /ready',
    'GET /scheduled-transfers',
    'GET /scheduled-transfers/{scheduleId}',
    'GET /session',
    'GET /stats/today',
    'POST /scheduled-transfers',
    'POST /session',
    'POST /transfers',
    'PUT /public-accounts/{accountId}/follow',
  ])
  const ids = new Set<string>()
  for (const { method, path, op } of operations(demo.document)) {
    const where = `${method} ${path}`
    assert.match(op.operationId ?? '', /^[a-z][A-Za-z]+$/, where)
    assert.ok(!ids.has(op.operationId), `${where}: operationId ${op.operationId} is unique`)
    ids.add(op.operationId)
    assert.ok(op.summary?.length > 3, `${where}: summary`)
    assert.ok(op.description?.length > 10, `${where}: description`)
    for (const [status, response] of Object.entries(op.responses)) {
      assert.ok(response.description && response.description !== 'Default Response', `${where} ${status}`)
    }
  }
  // The operator endpoints: /metrics stays out (Prometheus text, not an API), /docs is the document itself.
  assert.ok(!Object.keys(demo.document.paths).some((p) => p.startsWith('/metrics') || p.startsWith('/docs')))
})

test('`servers` names the local demo; PUBLIC_URL replaces it', async (t) => {
  assert.deepEqual(
    demo.document.servers.map((s) => s.url),
    ['http://127.0.0.1:3000'],
  )
  const other = await buildTestApp({ PUBLIC_URL: 'https://bank.example.org/gateway/', PORT: '8080' })
  t.after(() => other.close())
  const document = other.app.swagger() as unknown as OpenApiDocument
  assert.deepEqual(
    document.servers.map((s) => s.url),
    ['https://bank.example.org/gateway'],
  )
})

test('session routes require the session cookie, named as this environment sends it', async (t) => {
  for (const { method, path, op } of operations(demo.document)) {
    const expected = SESSION_ROUTES.includes(`${method} ${path}`) ? [{ session: [] }] : []
    assert.deepEqual(op.security, expected, `${method} ${path}`)
  }
  const production = await startDemo({ NODE_ENV: 'production', LOG_LEVEL: 'silent' })
  t.after(() => production.close())
  for (const [env, running] of [
    ['development', demo],
    ['production', production],
  ] as const) {
    const scheme = running.document.components.securitySchemes.session!
    assert.equal(scheme.type, 'apiKey')
    assert.equal(scheme.in, 'cookie')
    const response = await fetch(`${running.url}/session`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'alice', password: 'demo-password' }),
    })
    assert.equal(response.status, 200)
    const sent = response.headers.get('set-cookie')!.split('=', 1)[0]
    assert.equal(scheme.name, sent, env)
    assert.equal(sent, env === 'production' ? '__Host-sid' : 'sid')
  }
})

test('POST /transfers declares the required Idempotency-Key header with its syntax and size', () => {
  const op = demo.document.paths['/transfers']!.post!
  const key = op.parameters?.find((p) => p.in === 'header' && p.name === 'Idempotency-Key')
  assert.ok(key)
  assert.equal(key.required, true)
  assert.equal(key.schema.pattern, IDEMPOTENCY_KEY_PATTERN)
  assert.equal(key.schema.minLength, 1)
  assert.equal(key.schema.maxLength, 512)
  // Every other operation takes no header parameter: the session cookie is its security scheme.
  // POST /scheduled-transfers declares the same Idempotency-Key.
  const scheduled = demo.document.paths['/scheduled-transfers']!.post!
  assert.deepEqual(
    scheduled.parameters?.filter((p) => p.in === 'header'),
    op.parameters?.filter((p) => p.in === 'header'),
  )
  for (const { method, path, op: other } of operations(demo.document)) {
    if (other === op || other === scheduled) continue
    // GET /notifications takes the reconnection header of Server-Sent Events, optional.
    const allowed = path === '/notifications' ? ['last-event-id'] : []
    const extra = (p: { in: string; name: string }) =>
      (p.in === 'header' && !allowed.includes(p.name.toLowerCase())) || p.in === 'cookie'
    assert.ok(!other.parameters?.some(extra), `${method} ${path}`)
  }
})

test('an id has one JSON Schema type, integer, in paths, bodies and responses alike', () => {
  const seen = new Set<string>()
  const note = (name: string, schema: Record<string, unknown> | undefined, where: string) => {
    seen.add(name)
    assert.equal(schema?.type, 'integer', `${where}: ${name}`)
  }
  // Arrays are walked like objects (their items are their values).
  const walk = (node: unknown, where: string): void => {
    if (node === null || typeof node !== 'object') return
    const object = node as Record<string, unknown>
    if (typeof object.in === 'string' && typeof object.name === 'string' && object.name.endsWith('Id'))
      note(object.name, object.schema as Record<string, unknown>, `${where} ${object.in} parameter`)
    const properties = object.properties as Record<string, Record<string, unknown>> | undefined
    if (properties && typeof properties === 'object')
      for (const [name, schema] of Object.entries(properties))
        if (name.endsWith('Id')) note(name, schema, `${where} property`)
    for (const value of Object.values(object)) walk(value, where)
  }
  for (const { method, path, op } of operations(demo.document)) walk(op, `${method} ${path}`)
  walk(demo.document.components ?? {}, 'components')
  // The ids a client passes from one call to the next, in a path and in a body.
  for (const name of ['accountId', 'fromAccountId', 'toAccountId', 'scheduleId', 'transferId'])
    assert.ok(seen.has(name), name)
})

test('an integer path id is read only when written plainly', async (t) => {
  const { app, db, close } = await buildTestApp()
  t.after(close)
  const customer = await createCustomer(db, 'ids', [1000])
  const cookie = await login(app, customer)
  const [accountId] = customer.accountIds
  const balance = (id: string) => app.inject({ url: `/accounts/${id}/balance`, headers: { cookie } })
  const ok = await balance(String(accountId))
  assert.equal(ok.statusCode, 200)
  assert.equal(ok.json().accountId, accountId)
  assert.equal((await balance('2147483648')).statusCode, 404, 'beyond Postgres integer: no such account')
  for (const spelling of [
    `0${accountId}`,
    `${accountId}.0`,
    `+${accountId}`,
    '1e0',
    '0x1',
    '0',
    '-1',
    '12345678901',
  ]) {
    const response = await balance(encodeURIComponent(spelling))
    assert.equal(response.statusCode, 400, spelling)
    assert.equal(response.json().type, '/problems/validation', spelling)
  }
  const schedule = await app.inject({ url: '/scheduled-transfers/1', headers: { cookie } })
  assert.equal(schedule.json().type, '/problems/schedule-not-found')
  assert.equal((await app.inject({ url: '/scheduled-transfers/01', headers: { cookie } })).statusCode, 400)
})

test('the Idempotency-Key pattern accepts exactly the keys the gateway accepts', async (t) => {
  // Rate limits off (the test default): hundreds of keys for one customer.
  const gateway = await buildTestApp()
  t.after(() => gateway.close())
  const customer = await createCustomer(gateway.db, `key-${randomUUID()}`, [1_000])
  const cookie = await login(gateway.app, customer)
  const pattern = new RegExp(IDEMPOTENCY_KEY_PATTERN)
  // Accepted keys reach the transfer: a transfer to the same account answers 400 same-account.
  const refusedAsInvalid = async (key: string) => {
    const response = await gateway.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': key },
      payload: {
        fromAccountId: customer.accountIds[0],
        toAccountId: customer.accountIds[0],
        amount: 1,
        currency: 'VND',
      },
    })
    const { type } = response.json() as { type: string }
    assert.ok(
      ['/problems/idempotency-key-invalid', '/problems/same-account'].includes(type),
      `${key}: ${type}`,
    )
    return type === '/problems/idempotency-key-invalid'
  }
  const samples = [
    'a',
    '7f3c1e2a-demo',
    '"7f3c1e2a-demo"',
    '"a\\"b"',
    '"a\\\\b"',
    '"a\\b"',
    '""',
    '"',
    '"abc',
    'abc"',
    '"ab"c"',
    '"a b"',
    'a b',
    '"a";p=1',
    'k'.repeat(255),
    'k'.repeat(256),
    `"${'k'.repeat(255)}"`,
    `"${'k'.repeat(256)}"`,
    `"${'\\"'.repeat(255)}"`,
    `"${'\\"'.repeat(256)}"`,
    '~!#$%&*+-.^_`|',
  ]
  for (const key of samples) assert.equal(await refusedAsInvalid(key), !pattern.test(key), key)
  // Printable ASCII with the characters that matter; HTTP trims spaces around a field value.
  const keyText = fc
    .array(fc.constantFrom('a', 'Z', '0', '-', '"', '\\', ' ', ';', '=', '~', '!'), {
      minLength: 1,
      maxLength: 8,
    })
    .map((chars) => chars.join('').trim())
    .filter((key) => key.length > 0)
  await fc.assert(
    fc.asyncProperty(keyText, async (key) => {
      assert.equal(await refusedAsInvalid(key), !pattern.test(key), key)
    }),
    { numRuns: 150 },
  )
})

test('response headers: rate limits everywhere, Retry-After, Idempotent-Replayed, Set-Cookie', () => {
  for (const { method, path, op } of operations(demo.document)) {
    for (const [status, response] of Object.entries(op.responses)) {
      const where = `${method} ${path} ${status}`
      const headers = Object.keys(response.headers ?? {})
      assert.ok(headers.includes('RateLimit') && headers.includes('RateLimit-Policy'), where)
      if (['409', '429', '503'].includes(status)) assert.ok(headers.includes('Retry-After'), where)
    }
    assert.ok(op.responses['429'], `${method} ${path} can answer 429`)
  }
  const transfer = demo.document.paths['/transfers']!.post!.responses
  for (const status of ['201', '400', '404', '422'])
    assert.ok(transfer[status]!.headers!['Idempotent-Replayed'])
  assert.ok(demo.document.paths['/session']!.post!.responses['200']!.headers!['Set-Cookie'])
  assert.ok(demo.document.paths['/session']!.delete!.responses['204']!.headers!['Set-Cookie'])
})

test('problem responses are application/problem+json and list documented types of their status', () => {
  const documented = new Map<string, number | string>(
    PROBLEM_TYPES.map((p) => [`/problems/${p.slug}`, p.status]),
  )
  for (const { method, path, op } of operations(demo.document)) {
    for (const [status, response] of Object.entries(op.responses)) {
      if (/^[23]/.test(status)) continue
      const where = `${method} ${path} ${status}`
      assert.deepEqual(Object.keys(response.content ?? {}), ['application/problem+json'], where)
      const schema = response.content!['application/problem+json']!.schema as {
        properties: { type: { enum?: string[] } }
      }
      if (status === 'default') continue
      assert.ok(schema.properties.type.enum?.length, where)
      for (const type of schema.properties.type.enum!) {
        assert.equal(documented.get(type), Number(status), `${where}: ${type}`)
        assert.ok(response.description.includes(type), `${where} describes ${type}`)
      }
    }
  }
})

/** Checks a real response against the document: status declared, media type, body schema, headers. */
async function assertDocumented(
  document: OpenApiDocument,
  operation: { method: string; path: string },
  response: Response,
  expected: { status: number; type?: string },
): Promise<Record<string, unknown>> {
  const where = `${operation.method} ${operation.path} ${response.status}`
  assert.equal(response.status, expected.status, where)
  const op = document.paths[operation.path]![operation.method.toLowerCase()]!
  const declared = op.responses[String(response.status)]
  assert.ok(declared, `${where} is declared`)
  const mediaType = (response.headers.get('content-type') ?? '').split(';')[0]!
  const body = await response.text()
  if (response.status === 204) {
    assert.equal(body, '')
    return {}
  }
  assert.ok(
    declared.content?.[mediaType],
    `${where}: ${mediaType} is declared (${Object.keys(declared.content ?? {})})`,
  )
  const json = JSON.parse(body) as Record<string, unknown>
  const schema = declared.content[mediaType]!.schema
  assert.ok(
    Schema.Check(schema, JSON.parse(body)),
    `${where}: ${body} fits ${JSON.stringify(Schema.Errors(schema, json))}`,
  )
  if (expected.type) {
    assert.equal(mediaType, 'application/problem+json', where)
    assert.equal(json.type, expected.type, where)
    assert.equal(json.status, expected.status, where)
  }
  // Rate limits are on in these demos: every limited response carries both headers.
  for (const name of ['RateLimit-Policy', 'RateLimit']) {
    assert.ok(declared.headers?.[name], `${where}: ${name} is declared`)
    assert.ok(response.headers.get(name), `${where}: ${name} is sent`)
  }
  if ([409, 429, 503].includes(response.status)) {
    assert.ok(declared.headers?.['Retry-After'], `${where}: Retry-After is declared`)
    assert.match(response.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/, `${where}: Retry-After is sent`)
  }
  return json
}

test('401, 404, 422 and 429 problems keep their body and content type, as documented', async () => {
  const { url, document } = demo
  const unauthenticated = await fetch(`${url}/accounts`)
  await assertDocumented(document, { method: 'GET', path: '/accounts' }, unauthenticated, {
    status: 401,
    type: '/problems/unauthenticated',
  })

  const loggedIn = await fetch(`${url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'alice', password: 'demo-password' }),
  })
  const cookie = cookieHeader(loggedIn.headers.getSetCookie())
  await assertDocumented(document, { method: 'POST', path: '/session' }, loggedIn, { status: 200 })

  const missing = await fetch(`${url}/accounts/999/balance`, { headers: { cookie } })
  await assertDocumented(document, { method: 'GET', path: '/accounts/{accountId}/balance' }, missing, {
    status: 404,
    type: '/problems/account-not-found',
  })
  const invalid = await fetch(`${url}/accounts/01/balance`, { headers: { cookie } })
  await assertDocumented(document, { method: 'GET', path: '/accounts/{accountId}/balance' }, invalid, {
    status: 400,
    type: '/problems/validation',
  })

  const poor = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { cookie, 'content-type': 'application/json', 'idempotency-key': randomUUID() },
    body: JSON.stringify({ fromAccountId: 1, toAccountId: 2, amount: 100_000_001, currency: 'VND' }),
  })
  const problem = await assertDocumented(document, { method: 'POST', path: '/transfers' }, poor, {
    status: 422,
    type: '/problems/insufficient-funds',
  })
  assert.deepEqual(Object.keys(problem).sort(), ['detail', 'status', 'title', 'type'])
  assert.equal(problem.detail, 'Account 1 does not hold 100000001 VND.')

  const statuses: number[] = []
  let limited: Response | undefined
  for (let attempt = 0; attempt < 6 && !limited; attempt++) {
    const response = await fetch(`${url}/session`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'bob', password: 'wrong password' }),
    })
    statuses.push(response.status)
    if (response.status === 429) limited = response
    else
      await assertDocumented(document, { method: 'POST', path: '/session' }, response, {
        status: 401,
        type: '/problems/bad-credentials',
      })
  }
  assert.deepEqual(statuses, [401, 401, 401, 401, 401, 429])
  const tooMany = await assertDocumented(document, { method: 'POST', path: '/session' }, limited!, {
    status: 429,
    type: '/problems/rate-limited',
  })
  assert.equal(tooMany.policy, 'login')
  assert.match(limited!.headers.get('ratelimit-policy')!, /"login";q=5;w=60/)

  const unknown = await fetch(`${url}/no/such/route`)
  assert.equal(unknown.status, 404)
  assert.equal(unknown.headers.get('content-type'), 'application/problem+json; charset=utf-8')
  assert.equal(((await unknown.json()) as { type: string }).type, '/problems/not-found')
})

test('503 problems keep their extension members and Retry-After, as documented', async (t) => {
  const proxy = await startTcpProxy(
    Number(new URL(TEST_REDIS_URL).port || 6379),
    new URL(TEST_REDIS_URL).hostname,
  )
  const cut = await startDemo({
    REDIS_URL: `redis://127.0.0.1:${proxy.port}`,
    REDIS_COMMAND_TIMEOUT_MS: '200',
  })
  t.after(async () => {
    proxy.restore()
    await cut.close()
    await proxy.close()
  })
  const loggedIn = await fetch(`${cut.url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'alice', password: 'demo-password' }),
  })
  const cookie = cookieHeader(loggedIn.headers.getSetCookie())
  proxy.cut()
  const ready = await fetch(`${cut.url}/ready`)
  const notReady = await assertDocumented(cut.document, { method: 'GET', path: '/ready' }, ready, {
    status: 503,
    type: '/problems/not-ready',
  })
  assert.deepEqual({ redis: notReady.redis, postgres: notReady.postgres }, { redis: 'down', postgres: 'ok' })
  assert.equal(ready.headers.get('retry-after'), '1')

  const accounts = await fetch(`${cut.url}/accounts`, { headers: { cookie } })
  await assertDocumented(cut.document, { method: 'GET', path: '/accounts' }, accounts, {
    status: 503,
    type: '/problems/session-store-unavailable',
  })
  assert.equal(accounts.headers.get('retry-after'), '1')
})
