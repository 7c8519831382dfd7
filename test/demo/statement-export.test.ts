import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { accessSync, constants, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import http from 'node:http'
import { tmpdir } from 'node:os'
import { delimiter, join } from 'node:path'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import pg from 'pg'
import { chromium } from 'playwright-core'
import { executeTransfer } from '../../src/ledger/ledger.ts'
import { EXPORT_ESTIMATE_BYTES } from '../../src/rate-limits.ts'
import { CSV_HEADER } from '../../src/routes/statement.ts'
import {
  buildTestApp,
  createCustomer,
  createTestDatabase,
  login,
  type TestApp,
  type TestDatabase,
  USE_PGLITE,
} from '../helpers/gateway.ts'
import { keysWithoutTtl, listen } from '../helpers/index.ts'

// GET /accounts/:accountId/statement.csv end to end (docs/demo/http-api.md): downloaded with curl
// and in Chromium, the CSV is every transfer of the account; an export in flight holds one of the
// customer's export slots (a second is refused while the first runs); the daily byte budget is
// charged what each export sent, an export cut short included.

const run = promisify(execFile)
const BUDGET = 1_000_000

let database: TestDatabase
let t: TestApp
let url: string
before(async () => {
  database = await createTestDatabase()
  t = await buildTestApp(
    { RATE_LIMIT_IP: '100000,100000', RATE_LIMIT_EXPORTS: '1', RATE_LIMIT_EXPORT_BYTES: String(BUDGET) },
    { testDatabase: database, rateLimits: 'on' },
  )
  url = await listen(t.app)
})
after(async () => {
  assert.deepEqual(await keysWithoutTtl(t.redis, `${t.prefix}rl:`), [], 'every rate-limit key has a TTL')
  await t.close()
  await database.drop()
})

/** What is left of the customer's daily byte budget (a peek). */
const budgetLeft = async (customerId: number) =>
  (await t.app.rateLimiter.consume('export-bytes', `customer:${customerId}`, 0)).remaining

async function until(what: string, check: () => Promise<boolean>) {
  const deadline = Date.now() + 10_000
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}

/** A customer with two accounts and `n` transfers between them; the expected CSV, newest first. */
async function customerWithHistory(name: string, n: number) {
  const customer = await createCustomer(t.db, name, [1_000_000, 1_000_000])
  const [from, to] = customer.accountIds as [number, number]
  const lines: string[] = []
  for (let i = 1; i <= n; i++) {
    const transfer = await executeTransfer(t.db, {
      customerId: customer.customerId,
      fromAccountId: from,
      toAccountId: to,
      amount: i,
      currency: 'VND',
    })
    const [row] = await t.db.query<{ created_at: Date }>('SELECT created_at FROM transfers WHERE id = $1', [
      transfer.transferId,
    ])
    lines.unshift(`${transfer.transferId},${row!.created_at.toISOString()},debit,${i},VND,${to}\n`)
  }
  return { customer, account: from, csv: CSV_HEADER + lines.join(''), cookie: await login(t.app, customer) }
}

test('curl downloads the statement: every transfer, newest first, as an attachment; the budget is charged its bytes', {
  skip: USE_PGLITE && 'needs the gateway listening on a database shared with the test',
}, async () => {
  const { customer, account, csv, cookie } = await customerWithHistory('csv-curl', 3)
  const dir = mkdtempSync(join(tmpdir(), 'statement-'))
  try {
    const file = join(dir, 'statement.csv')
    const { stdout } = await run('curl', [
      '-sS',
      '-D',
      '-',
      '-o',
      file,
      '-H',
      `cookie: ${cookie}`,
      `${url}/accounts/${account}/statement.csv`,
    ])
    assert.match(stdout, /^HTTP\/1\.1 200/)
    assert.match(stdout, /content-type: text\/csv; charset=utf-8/i)
    assert.match(
      stdout,
      new RegExp(`content-disposition: attachment; filename="statement-${account}.csv"`, 'i'),
    )
    assert.match(stdout, /ratelimit-policy: .*"exports";q=1;qu="concurrent-requests"/i)
    assert.match(stdout, new RegExp(`"export-bytes";q=${BUDGET};w=86400;qu="bytes"`))
    assert.equal(readFileSync(file, 'utf8'), csv)
    // Reserved as an estimate, settled with the bytes sent once the response ended.
    const bytes = Buffer.byteLength(csv)
    await until('the budget settled', async () => (await budgetLeft(customer.customerId)) === BUDGET - bytes)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  const other = await createCustomer(t.db, 'csv-other')
  const refused = await fetch(`${url}/accounts/${other.accountIds[0]}/statement.csv`, { headers: { cookie } })
  assert.equal(refused.status, 404)
  assert.equal((await refused.json()).type, '/problems/account-not-found')
})

test('an export in flight holds the customer’s slot; one cut short is charged only what it sent', {
  skip: USE_PGLITE && 'needs a second connection to hold the transfers table',
}, async () => {
  const { customer, account, csv, cookie } = await customerWithHistory('csv-held', 2)
  // The transfers table locked: the export sends its header line, then waits for its first page.
  const locker = new pg.Client({ connectionString: database.url })
  await locker.connect()
  await locker.query('BEGIN')
  await locker.query('LOCK TABLE transfers IN ACCESS EXCLUSIVE MODE')
  const first = http.get(`${url}/accounts/${account}/statement.csv`, { headers: { cookie } })
  const started = await new Promise<http.IncomingMessage>((resolve) => first.on('response', resolve))
  assert.equal(started.statusCode, 200)
  await new Promise((resolve) => started.once('data', resolve))
  const second = await fetch(`${url}/accounts/${account}/statement.csv`, { headers: { cookie } })
  assert.equal(second.status, 429, 'the customer’s one export slot is taken')
  const problem = await second.json()
  assert.equal(problem.policy, 'exports')
  assert.equal(second.headers.get('retry-after'), '1')
  // Cut short: only the header line was produced.
  first.destroy()
  await locker.query('ROLLBACK')
  await locker.end()
  const header = Buffer.byteLength(CSV_HEADER)
  await until(
    'the cut export settled',
    async () => (await budgetLeft(customer.customerId)) === BUDGET - header,
  )
  assert.ok(header < EXPORT_ESTIMATE_BYTES, 'the estimate was given back but for what was sent')
  // The slot came back with it.
  const third = await fetch(`${url}/accounts/${account}/statement.csv`, { headers: { cookie } })
  assert.equal(third.status, 200)
  assert.equal(await third.text(), csv)
})

const executable = (path: string) => {
  try {
    accessSync(path, constants.X_OK)
    return true
  } catch {
    return false
  }
}
const chromiumPath =
  process.env.CHROMIUM_PATH ??
  ['/usr/bin/chromium', ...(process.env.PATH ?? '').split(delimiter).map((d) => join(d, 'chromium'))].find(
    (path) => path && executable(path),
  ) ??
  null

test('Chromium downloads the statement from a link, with the session cookie', {
  skip:
    (USE_PGLITE && 'needs the gateway listening on a database shared with the test') ||
    (!chromiumPath && 'no chromium executable (apt-get install chromium, or set CHROMIUM_PATH)'),
  timeout: 120_000,
}, async (context) => {
  const { customer, account, csv } = await customerWithHistory('csv-browser', 4)
  const browser = await chromium.launch({
    executablePath: chromiumPath!,
    headless: true,
    args: ['--no-sandbox'],
  })
  context.after(() => browser.close())
  const page = await browser.newPage({ acceptDownloads: true })
  page.setDefaultTimeout(30_000)
  assert.equal((await page.goto(`${url}/health`))?.status(), 200)
  // Logged in from the page (the cookie is the browser's), then a plain link to the statement.
  const status = await page.evaluate(`(async () => {
    const response = await fetch('/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: ${JSON.stringify(customer.username)}, password: ${JSON.stringify(customer.password)} }),
    })
    const link = document.createElement('a')
    link.href = '/accounts/${account}/statement.csv'
    link.textContent = 'statement'
    document.body.append(link)
    return response.status
  })()`)
  assert.equal(status, 200)
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('a')])
  assert.equal(download.suggestedFilename(), `statement-${account}.csv`)
  assert.equal(readFileSync((await download.path())!, 'utf8'), csv)
})
