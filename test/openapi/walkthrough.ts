// The README's walk-through, written against the client generated from the served OpenAPI document
// (openapi-typescript types + openapi-fetch) and nothing else: no hand-written request, no path, header
// or body the document does not declare. test/demo/openapi-client.test.ts generates the types, type-checks
// this file against them and runs it against a real server. By hand, against `npm start`:
//   npx tsx test/openapi/walkthrough.ts http://127.0.0.1:3000
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { pathToFileURL } from 'node:url'
// The generated types: a temporary file in test/demo/openapi-client.test.ts (see generated-client.d.ts).
import type { paths } from 'gateway-openapi-client'
import createClient, { type Middleware } from 'openapi-fetch'

export interface WalkThroughOptions {
  baseUrl: string
  username: string
  password: string
  /** Where the money goes: an account of another customer, in the same currency. */
  toAccountId: number
  amount?: number
  /** Each call as it was made, for the log. */
  log?: (line: string) => void
}

/** Keeps the cookies the gateway sets and sends them back, like a browser or a REST client does. */
function cookieJar(): Middleware {
  const cookies = new Map<string, string>()
  return {
    onRequest({ request }) {
      if (cookies.size) request.headers.set('cookie', [...cookies].map(([k, v]) => `${k}=${v}`).join('; '))
      return request
    },
    onResponse({ response }) {
      for (const line of response.headers.getSetCookie()) {
        const pair = line.split(';', 1)[0]!
        const name = pair.slice(0, pair.indexOf('=')).trim()
        const value = pair.slice(pair.indexOf('=') + 1).trim()
        if (value === '' || /;\s*max-age=0\b/i.test(line)) cookies.delete(name)
        else cookies.set(name, value)
      }
      return response
    },
  }
}

/** Log in, list accounts, read a balance, transfer with a key, replay it, reuse the key (422), log out. */
export async function walkThrough(options: WalkThroughOptions) {
  const { log = () => {}, amount = 50_000 } = options
  const client = createClient<paths>({ baseUrl: options.baseUrl })
  client.use(cookieJar())
  const call = (line: string, response: Response) => log(`${line} -> ${response.status}`)
  // Every call fails within 10 s rather than hanging the run.
  const signal = () => AbortSignal.timeout(10_000)

  const login = await client.POST('/session', {
    body: { username: options.username, password: options.password },
    signal: signal(),
  })
  call(`client.POST('/session', { body: { username, password } })`, login.response)
  assert.equal(login.response.status, 200, JSON.stringify(login.error))
  assert.ok(login.data)
  assert.match(login.response.headers.get('set-cookie') ?? '', /^(__Host-)?sid=/)

  const accounts = await client.GET('/accounts', { signal: signal() })
  call(`client.GET('/accounts')`, accounts.response)
  assert.ok(accounts.data, JSON.stringify(accounts.error))
  const from = accounts.data.accounts[0]
  assert.ok(from, 'the customer has an account')
  assert.ok(from.balance > amount, 'with enough money for the walk-through')

  const balance = await client.GET('/accounts/{accountId}/balance', {
    params: { path: { accountId: from.accountId } },
    signal: signal(),
  })
  call(`client.GET('/accounts/{accountId}/balance', { params: { path: { accountId } } })`, balance.response)
  assert.ok(balance.data, JSON.stringify(balance.error))
  assert.equal(balance.data.balance, from.balance)

  const key = `walkthrough-${randomUUID()}`
  const body = {
    fromAccountId: from.accountId,
    toAccountId: options.toAccountId,
    amount,
    currency: from.currency,
  }
  const params = { header: { 'Idempotency-Key': key } }
  const transfer = await client.POST('/transfers', { params, body, signal: signal() })
  call(
    `client.POST('/transfers', { params: { header: { 'Idempotency-Key': key } }, body })`,
    transfer.response,
  )
  assert.equal(transfer.response.status, 201, JSON.stringify(transfer.error))
  assert.ok(transfer.data)
  assert.equal(transfer.response.headers.get('idempotent-replayed'), null)

  const replay = await client.POST('/transfers', { params, body, signal: signal() })
  call(`client.POST('/transfers', ...the same key and body)`, replay.response)
  assert.equal(replay.response.status, 201)
  assert.equal(replay.response.headers.get('idempotent-replayed'), 'true')
  assert.deepEqual(replay.data, transfer.data)

  const reused = await client.POST('/transfers', {
    params,
    body: { ...body, amount: amount + 1 },
    signal: signal(),
  })
  call(`client.POST('/transfers', ...the same key, amount + 1)`, reused.response)
  assert.equal(reused.response.status, 422)
  assert.match(reused.response.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(reused.error?.type, '/problems/idempotency-key-mismatch')

  const after = await client.GET('/accounts/{accountId}/balance', {
    params: { path: { accountId: from.accountId } },
    signal: signal(),
  })
  call(`client.GET('/accounts/{accountId}/balance', ...)`, after.response)
  assert.equal(after.data?.balance, from.balance - amount, 'debited once')

  const logout = await client.DELETE('/session', { signal: signal() })
  call(`client.DELETE('/session')`, logout.response)
  assert.equal(logout.response.status, 204)

  const refused = await client.GET('/accounts', { signal: signal() })
  call(`client.GET('/accounts')`, refused.response)
  assert.equal(refused.response.status, 401)
  assert.equal(refused.error?.type, '/problems/unauthenticated')

  return { customerId: login.data.customerId, transfer: transfer.data, balanceAfter: after.data?.balance }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  // The seeded demo: alice (account 1) pays bob (account 2) on a fresh `npm start`.
  await walkThrough({
    baseUrl: process.argv[2] ?? 'http://127.0.0.1:3000',
    username: 'alice',
    password: 'demo-password',
    toAccountId: 2,
    log: console.log,
  })
  console.log('walk-through passed')
}
