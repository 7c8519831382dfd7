import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { accessSync, constants } from 'node:fs'
import { delimiter, join } from 'node:path'
import { test } from 'node:test'
import type { FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import { chromium } from 'playwright-core'
import { buildApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { notificationKeys } from '../../src/events/notifier.ts'
import { createCustomer, createTestDatabase, login } from '../helpers/gateway.ts'
import { listen, scanKeys, TEST_REDIS_URL, TEST_SECRET, uniquePrefix } from '../helpers/index.ts'

// GET /notifications in a real browser: Chromium (Debian's `chromium`, driven by playwright-core)
// logs in with fetch, opens an EventSource, and gets a transfer live. The server then ends the
// stream; the browser reconnects by itself with Last-Event-ID and gets the transfer made while it
// was away exactly once, then live ones again, and nothing it already showed.

const executable = (path: string) => {
  try {
    accessSync(path, constants.X_OK)
    return true
  } catch {
    return false
  }
}

/** CHROMIUM_PATH, else /usr/bin/chromium, else `chromium` on PATH; null when there is none. */
function findChromium(): string | null {
  if (process.env.CHROMIUM_PATH) return process.env.CHROMIUM_PATH
  const candidates = [
    '/usr/bin/chromium',
    ...(process.env.PATH ?? '').split(delimiter).map((d) => join(d, 'chromium')),
  ]
  return candidates.find((path) => path && executable(path)) ?? null
}

const chromiumPath = findChromium()

/** What the page records for each message its EventSource dispatches. */
interface Recorded {
  type: string
  lastEventId: string
  data: string
}

/**
 * The page's client, plain JavaScript (tsx compiles this file with esbuild's keepNames, which wraps
 * named functions in `__name()` calls that a function handed to page.evaluate cannot resolve in the
 * page): logs in with fetch, opens the EventSource and records on `globalThis.notifications` every
 * message it dispatches. Resolves to the login's status.
 */
const pageClient = (username: string, password: string) => `(async () => {
  const s = { recorded: [], opens: 0, errors: [] }
  globalThis.notifications = s
  const response = await fetch('/session', {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: ${JSON.stringify(username)}, password: ${JSON.stringify(password)} }),
  })
  if (!response.ok) return response.status
  const source = new EventSource('/notifications')
  const record = (e) => s.recorded.push({ type: e.type, lastEventId: e.lastEventId, data: e.data })
  for (const type of ['message', 'transfer.sent', 'transfer.received']) source.addEventListener(type, record)
  source.addEventListener('open', () => s.opens++)
  source.addEventListener('error', () => s.errors.push(source.readyState))
  return response.status
})()`

/** The page's state, `globalThis.notifications`. */
interface PageState {
  recorded: Recorded[]
  opens: number
  /** readyState at each `error` event (0: CONNECTING, the browser is going to reconnect). */
  errors: number[]
}

test('a browser gets transfers live over EventSource, reconnects by itself with Last-Event-ID after the server ends the stream, and misses nothing', {
  skip: chromiumPath
    ? false
    : 'no chromium executable (apt-get install chromium, or set CHROMIUM_PATH): the browser test needs one',
  timeout: 120_000,
}, async (t) => {
  // Undone last first (node:test runs t.after hooks in the order they were added): the browser,
  // then the app, then its keys and the database.
  const cleanup: Array<() => Promise<unknown>> = []
  t.after(async () => {
    const failures: unknown[] = []
    for (const step of cleanup.reverse()) await step().catch((err: unknown) => failures.push(err))
    if (failures.length > 0) throw failures[0]
  })
  const database = await createTestDatabase()
  cleanup.push(() => database.drop())
  const prefix = uniquePrefix('br')
  const config = loadConfig({
    NODE_ENV: 'test',
    REDIS_URL: TEST_REDIS_URL,
    SESSION_SECRET: TEST_SECRET,
    EVENT_WORKERS: 'relay,notifier',
    OUTBOX_RELAY_INTERVAL: '200ms',
  })
  const app: FastifyInstance = await buildApp(config, {
    database: database.db,
    keyPrefix: prefix,
    eventWorkers: 'on',
  })
  cleanup.push(async () => {
    await app.close()
    const redis = new Redis(TEST_REDIS_URL)
    const keys = await scanKeys(redis, prefix)
    if (keys.length > 0) await redis.del(...keys)
    await redis.quit()
  })

  // Each stream request's Last-Event-ID, as the server got it. A reconnect is held until the
  // test lets it through: the transfer made meanwhile is then on the notification stream before
  // the reconnect reads it, so it comes from the replay, not live, however fast the browser is.
  const streamRequests: Array<string | string[] | null> = []
  let releaseReconnect = () => {}
  const reconnectHeld = new Promise<void>((resolve) => {
    releaseReconnect = resolve
  })
  app.addHook('onRequest', async (request) => {
    if (request.method !== 'GET' || request.url !== '/notifications') return
    streamRequests.push(request.headers['last-event-id'] ?? null)
    if (streamRequests.length > 1) await reconnectHeld
  })
  await app.ready()
  const url = await listen(app)

  const alice = await createCustomer(database.db, 'alice', [1_000_000])
  const bob = await createCustomer(database.db, 'bob', [1_000_000])
  const bobCookie = await login(app, bob)

  /** bob sends alice `amount` over HTTP from Node: she gets `transfer.received`. */
  async function bobPaysAlice(amount: number): Promise<number> {
    const response = await fetch(`${url}/transfers`, {
      method: 'POST',
      headers: { cookie: bobCookie, 'idempotency-key': randomUUID(), 'content-type': 'application/json' },
      body: JSON.stringify({
        fromAccountId: bob.accountIds[0],
        toAccountId: alice.accountIds[0],
        amount,
        currency: 'VND',
      }),
    })
    assert.equal(response.status, 201, await response.clone().text())
    return ((await response.json()) as { transferId: number }).transferId
  }

  const browser = await chromium.launch({
    executablePath: chromiumPath!,
    headless: true,
    args: ['--no-sandbox'],
  })
  // Closed before the app: no reconnect into a closing server.
  cleanup.push(() => browser.close())
  const page = await browser.newPage()
  page.setDefaultTimeout(30_000)
  // A document of the gateway's origin: fetch and EventSource are same-origin, the cookie applies.
  const health = await page.goto(`${url}/health`)
  assert.equal(health?.status(), 200)

  const loggedIn = await page.evaluate(pageClient(alice.username, alice.password))
  assert.equal(loggedIn, 200, 'the page logged in')
  const state = () => page.evaluate('globalThis.notifications') as Promise<PageState>
  const recorded = async () => (await state()).recorded
  /** Waits until `condition` (JavaScript on the page's state `s`) holds, polled in the page. */
  const waitFor = (condition: string) =>
    page.waitForFunction(`((s) => ${condition})(globalThis.notifications)`, undefined, { polling: 50 })

  // Open once the response started: the server has subscribed alice's channel by then.
  await waitFor('s.opens === 1')
  const first = await bobPaysAlice(101)
  await waitFor('s.recorded.length >= 1')
  const [live] = await recorded()
  assert.equal(live!.type, 'transfer.received')
  assert.equal((JSON.parse(live!.data) as { transferId: number }).transferId, first)

  // The server ends alice's stream (her only one) while her session stays valid.
  const clients = [...(app.events.hub.clients.get(alice.customerId) ?? [])]
  assert.equal(clients.length, 1, "alice's one stream is open on the hub")
  for (const client of clients) app.events.hub.close(client)
  // The browser saw the end and is reconnecting (readyState CONNECTING), not giving up (CLOSED).
  await waitFor('s.errors.length >= 1')
  assert.deepEqual((await state()).errors, [0])

  const missed = await bobPaysAlice(102)
  const key = notificationKeys(app.keyPrefix, alice.customerId).stream
  const transferIdOf = (fields: string[]) =>
    (JSON.parse(fields[fields.indexOf('data') + 1]!) as { transferId: number }).transferId
  for (;;) {
    const entries = (await app.redis.xrange(key, '-', '+')) as Array<[string, string[]]>
    if (entries.some(([, fields]) => transferIdOf(fields) === missed)) break
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  assert.equal((await state()).opens, 1, 'not reconnected yet: the missed transfer is not live')
  releaseReconnect()

  await waitFor('s.opens === 2 && s.recorded.length >= 2')
  const latest = await bobPaysAlice(103)
  await waitFor('s.recorded.length >= 3')

  // Everything alice's notification stream holds, each once, in its order, with its id; a
  // duplicate from the replay would have come before the live one.
  const messages = await recorded()
  const stored = (await app.redis.xrange(key, '-', '+')) as Array<[string, string[]]>
  assert.deepEqual(
    messages.map((m) => (JSON.parse(m.data) as { transferId: number }).transferId),
    [first, missed, latest],
  )
  assert.deepEqual(
    messages.map((m) => m.lastEventId),
    stored.map(([id]) => id),
  )
  assert.deepEqual(
    stored.map(([, fields]) => transferIdOf(fields)),
    [first, missed, latest],
  )
  assert.ok(messages.every((m) => m.type === 'transfer.received'))
  // The first request had no Last-Event-ID; the browser's reconnect sent the id of what it showed last.
  assert.deepEqual(streamRequests, [null, live!.lastEventId])
  const final = await state()
  assert.equal(final.opens, 2)
  assert.deepEqual(final.errors, [0])
})
