import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import type { FastifyInstance } from 'fastify'
import { executeTransfer } from '../../src/ledger/ledger.ts'
import { buildTestApp, createCustomer, login, type TestApp, type TestCustomer } from '../helpers/gateway.ts'
import { listen, TEST_SECRET } from '../helpers/index.ts'

// GET /accounts/:accountId/transactions (docs/demo/history.md): keyset pages that hold still while
// transfers arrive, signed cursors bound to their account, limits, directions, ownership.

interface Item {
  transferId: number
  direction: 'debit' | 'credit'
  amount: number
  currency: string
  counterpartyAccountId: number
  createdAt: string
}
interface Page {
  items: Item[]
  nextCursor: string | null
}

let t: TestApp
before(async () => {
  t = await buildTestApp()
})
after(() => t.close())

let customers = 0
/** A customer of its own per test, logged in: tests share the database, never an account. */
async function customer(balances: Array<number | [number, string]> = [1_000_000_000]) {
  const c = await createCustomer(t.db, `history-${++customers}`, balances)
  return { ...c, cookie: await login(t.app, c) }
}
type Customer = TestCustomer & { cookie: string }

function history(app: FastifyInstance, cookie: string, accountId: number | string, query = '') {
  return app.inject({ url: `/accounts/${accountId}/transactions${query}`, headers: { cookie } })
}

async function page(cookie: string, accountId: number, query = ''): Promise<Page> {
  const res = await history(t.app, cookie, accountId, query)
  assert.equal(res.statusCode, 200, res.body)
  return res.json() as Page
}

/** Every page from the newest, following nextCursor. */
async function allPages(cookie: string, accountId: number, limit: number): Promise<Page[]> {
  const pages: Page[] = []
  let cursor: string | null = null
  do {
    const next = await page(
      cookie,
      accountId,
      `?limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`,
    )
    pages.push(next)
    cursor = next.nextCursor
  } while (cursor)
  return pages
}

/** Postgres's own list: the account's transfers, newest first. */
async function transferIds(accountId: number): Promise<number[]> {
  const rows = await t.db.query<{ id: string | bigint }>(
    `SELECT id FROM transfers WHERE from_account_id = $1 OR to_account_id = $1
     ORDER BY created_at DESC, id DESC`,
    [accountId],
  )
  return rows.map((r) => Number(r.id))
}

function move(from: TestCustomer, fromAccountId: number, toAccountId: number, amount = 1) {
  return executeTransfer(t.db, {
    customerId: from.customerId,
    fromAccountId,
    toAccountId,
    amount,
    currency: 'VND',
  })
}

async function expectProblem(
  res: { statusCode: number; headers: object; json(): unknown },
  status: number,
  type: string,
) {
  assert.equal(res.statusCode, status)
  assert.match(
    String((res.headers as Record<string, unknown>)['content-type']),
    /^application\/problem\+json/,
  )
  assert.equal((res.json() as { type: string }).type, type)
}

describe('paging while transfers arrive', () => {
  test('250 transfers in pages of 20, 30 more made over HTTP while paging: each of the 250 once, in order', async () => {
    const payer = await customer([1_000_000_000, 1_000_000_000])
    const payee = await customer()
    const [mine, savings] = payer.accountIds as [number, number]
    const theirs = payee.accountIds[0]!
    // Both sides of the account: sent, received, and to the customer's own second account.
    for (let i = 0; i < 250; i++) {
      if (i % 3 === 0) await move(payee, theirs, mine, 1 + i)
      else if (i % 3 === 1) await move(payer, mine, theirs, 1 + i)
      else await move(payer, mine, savings, 1 + i)
    }
    const expected = await transferIds(mine)
    assert.equal(expected.length, 250)

    const url = await listen(t.app)
    const post = async (who: Customer, from: number, to: number): Promise<number> => {
      const res = await fetch(`${url}/transfers`, {
        method: 'POST',
        headers: { cookie: who.cookie, 'content-type': 'application/json', 'idempotency-key': randomUUID() },
        body: JSON.stringify({ fromAccountId: from, toAccountId: to, amount: 7, currency: 'VND' }),
      })
      const body = await res.text()
      assert.equal(res.status, 201, body)
      return (JSON.parse(body) as { transferId: number }).transferId
    }
    const fetchPage = async (cursor: string | null): Promise<Page> => {
      const query = `?limit=20${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`
      const res = await fetch(`${url}/accounts/${mine}/transactions${query}`, {
        headers: { cookie: payer.cookie },
      })
      assert.equal(res.status, 200)
      return (await res.json()) as Page
    }
    // Three transfers race each page request (both directions), until 30 are made.
    const pages: Page[] = []
    const made: number[] = []
    let cursor: string | null = null
    do {
      const racing = Array.from({ length: Math.min(3, 30 - made.length) }, (_, j) =>
        j % 2 === 0 ? post(payee, theirs, mine) : post(payer, mine, theirs),
      )
      const [next, ...ids]: [Page, ...number[]] = await Promise.all([fetchPage(cursor), ...racing])
      pages.push(next)
      made.push(...ids)
      cursor = next.nextCursor
    } while (cursor)
    while (made.length < 30) made.push(await post(payer, mine, theirs))

    const seen = pages.flatMap((p) => p.items.map((item) => item.transferId))
    assert.equal(new Set(seen).size, seen.length, 'no transfer on two pages')
    // A transfer made while paging can only be newer than the first page's read: it may head the
    // first page (it committed before that read), never any later one.
    const late = seen.filter((id) => !expected.includes(id))
    assert.deepEqual(seen.slice(0, late.length), late)
    assert.ok(late.every((id) => made.includes(id)))
    assert.ok(pages[0]!.items.length === 20 && late.length <= 3)
    assert.deepEqual(seen.slice(late.length), expected)
    assert.equal(pages.length, 13)
    assert.ok(pages.slice(0, -1).every((p) => p.items.length === 20))
    // All 30 committed, and Postgres's list is the 30 new ones on top of the 250.
    assert.equal(made.length, 30)
    const now = await transferIds(mine)
    assert.equal(now.length, 280)
    assert.deepEqual(now.slice(30), expected)
    assert.deepEqual(new Set(now.slice(0, 30)), new Set(made))
    // A new first page shows them.
    const first = await allPages(payer.cookie, mine, 100)
    assert.deepEqual(
      first.flatMap((p) => p.items.map((item) => item.transferId)),
      now,
    )
  })

  test('transfers of one millisecond and of one instant page in (created_at, id) order, none lost', async () => {
    const a = await customer()
    const b = await customer()
    const [mine, theirs] = [a.accountIds[0]!, b.accountIds[0]!]
    // Written directly: equal times, and times apart by microseconds within one millisecond (a
    // cursor cut to milliseconds would repeat or lose some of these).
    const times = [
      '2026-01-01T10:00:00.000100Z',
      '2026-01-01T10:00:00.000100Z',
      '2026-01-01T10:00:00.000100Z',
      '2026-01-01T10:00:00.000200Z',
      '2026-01-01T10:00:00.000900Z',
      '2026-01-01T10:00:00.000900Z',
      '2026-01-01T10:00:00.001000Z',
    ]
    for (const [i, at] of times.entries()) {
      const [from, to] = i % 2 ? [theirs, mine] : [mine, theirs]
      await t.db.query(
        `INSERT INTO transfers (customer_id, from_account_id, to_account_id, amount, currency, created_at)
         VALUES ($1, $2, $3, $4, 'VND', $5)`,
        [i % 2 ? b.customerId : a.customerId, from, to, 100 + i, at],
      )
    }
    const expected = await transferIds(mine)
    assert.equal(expected.length, times.length)
    for (const limit of [1, 2, 3]) {
      const pages = await allPages(a.cookie, mine, limit)
      assert.deepEqual(
        pages.flatMap((p) => p.items.map((item) => item.transferId)),
        expected,
        `limit ${limit}`,
      )
    }
  })
})

describe('cursors', () => {
  let owner: Customer
  let other: Customer
  let first: string
  before(async () => {
    owner = await customer([1_000_000, 1_000_000])
    other = await customer()
    for (let i = 0; i < 3; i++) await move(owner, owner.accountIds[0]!, other.accountIds[0]!)
    await move(owner, owner.accountIds[1]!, other.accountIds[0]!)
    first = (await page(owner.cookie, owner.accountIds[0]!, '?limit=1')).nextCursor!
    assert.ok(first)
  })

  const use = (cursor: string, accountId = owner.accountIds[0]!, cookie = owner.cookie) =>
    history(t.app, cookie, accountId, `?limit=1&cursor=${encodeURIComponent(cursor)}`)

  test('a cursor is opaque, URL-safe and bounded, and leads to the next page', async () => {
    assert.match(first, /^[A-Za-z0-9_.-]+$/)
    assert.ok(first.length < 200)
    const second = await use(first)
    assert.equal(second.statusCode, 200)
    const expected = await transferIds(owner.accountIds[0]!)
    assert.deepEqual(
      (second.json() as Page).items.map((i) => i.transferId),
      [expected[1]],
    )
  })

  test('tampered cursors: 400 invalid-cursor', async () => {
    const [payload, mac] = first.split('.') as [string, string]
    const flip = (text: string, at: number) =>
      text.slice(0, at) + (text[at] === 'A' ? 'B' : 'A') + text.slice(at + 1)
    const decoded = Buffer.from(payload, 'base64url').toString()
    const forged = (text: string) => `${Buffer.from(text).toString('base64url')}.${mac}`
    const tampered = [
      `${flip(payload, 0)}.${mac}`,
      `${flip(payload, payload.length - 1)}.${mac}`,
      `${payload}.${flip(mac, 0)}`,
      // Another spelling of the same MAC bytes (the last character's unused bits) is refused too.
      `${payload}.${mac.slice(0, -1)}${String.fromCharCode(mac.charCodeAt(mac.length - 1) ^ 1)}`,
      `${payload}.${mac}A`,
      `${payload}A.${mac}`,
      // The position moved, the account changed: the MAC no longer fits.
      forged(decoded.replace(/\|([0-9]+)$/, (_, id: string) => `|${Number(id) + 1}`)),
      forged(decoded.replace(/^[0-9]+/, String(owner.accountIds[1]))),
      forged(decoded.replace(/\.[0-9]{6}Z/, '.999999Z')),
    ]
    for (const cursor of tampered) {
      assert.notEqual(cursor, first)
      await expectProblem(await use(cursor), 400, '/problems/invalid-cursor')
    }
  })

  test("another account's cursor, the customer's own included: 400 invalid-cursor", async () => {
    // The same customer's second account: signed, but bound to the first.
    await expectProblem(await use(first, owner.accountIds[1]!), 400, '/problems/invalid-cursor')
    const theirs = (await page(other.cookie, other.accountIds[0]!, '?limit=1')).nextCursor!
    await expectProblem(await use(theirs), 400, '/problems/invalid-cursor')
    // The owner's own cursor sent by another customer for that account: invalid before anything is read.
    await expectProblem(await use(first, other.accountIds[0]!, other.cookie), 400, '/problems/invalid-cursor')
  })

  test('malformed cursors: 400 invalid-cursor; longer than 256 characters: 400 validation', async () => {
    for (const cursor of [
      '',
      'abc',
      '.',
      'a.b',
      `${first}.x`,
      first.replace('.', ''),
      first.replace('.', '..'),
      ` ${first}`,
      first.replace(/[A-Za-z]/, 'é'),
      `${Buffer.from('1|x|1').toString('base64url')}.${'A'.repeat(43)}`,
      'x'.repeat(256),
    ]) {
      await expectProblem(await use(cursor), 400, '/problems/invalid-cursor')
    }
    await expectProblem(await use('x'.repeat(257)), 400, '/problems/validation')
    const twice = await history(
      t.app,
      owner.cookie,
      owner.accountIds[0]!,
      `?cursor=${encodeURIComponent(first)}&cursor=${encodeURIComponent(first)}`,
    )
    await expectProblem(twice, 400, '/problems/validation')
  })

  test('a cursor signed under another secret is refused; after a rotation the old one still works', async (context) => {
    const secret = 'another-secret-0123456789-abcdefghijkl'
    const elsewhere = await buildTestApp(
      { SESSION_SECRET: secret },
      { testDatabase: { db: t.db, drop: async () => {} } },
    )
    const rotated = await buildTestApp(
      { SESSION_SECRET: `${secret},${TEST_SECRET}` },
      { testDatabase: { db: t.db, drop: async () => {} } },
    )
    context.after(async () => {
      await elsewhere.close()
      await rotated.close()
    })
    const accountId = owner.accountIds[0]!
    const signedElsewhere = await history(
      elsewhere.app,
      await login(elsewhere.app, owner),
      accountId,
      '?limit=1',
    )
    const foreign = (signedElsewhere.json() as Page).nextCursor!
    assert.notEqual(foreign, first)
    await expectProblem(await use(foreign), 400, '/problems/invalid-cursor')
    // The new secret signs, the old one still verifies: the cursor from before the rotation pages on.
    const cookie = await login(rotated.app, owner)
    const res = await history(rotated.app, cookie, accountId, `?limit=1&cursor=${encodeURIComponent(first)}`)
    assert.equal(res.statusCode, 200)
    assert.deepEqual((res.json() as Page).items, ((await use(first)).json() as Page).items)
    // Its next cursor is signed with the new secret: this instance takes it, one without that secret not.
    const next = (res.json() as Page).nextCursor!
    const after = await history(rotated.app, cookie, accountId, `?cursor=${encodeURIComponent(next)}`)
    assert.equal(after.statusCode, 200)
    await expectProblem(await use(next), 400, '/problems/invalid-cursor')
  })
})

describe('limit', () => {
  let owner: Customer
  before(async () => {
    owner = await customer()
    const other = await customer()
    for (let i = 0; i < 40; i++) await move(owner, owner.accountIds[0]!, other.accountIds[0]!)
  })

  test('default 20; 1 to 100; the last page has nextCursor null', async () => {
    const accountId = owner.accountIds[0]!
    const expected = await transferIds(accountId)
    const byDefault = await page(owner.cookie, accountId)
    assert.equal(byDefault.items.length, 20)
    assert.ok(byDefault.nextCursor)
    assert.deepEqual(
      byDefault.items.map((i) => i.transferId),
      expected.slice(0, 20),
    )
    // Exactly two pages of 20: the second is the last, with nothing after it.
    const last = await page(owner.cookie, accountId, `?cursor=${encodeURIComponent(byDefault.nextCursor!)}`)
    assert.deepEqual(
      last.items.map((i) => i.transferId),
      expected.slice(20),
    )
    assert.equal(last.nextCursor, null)
    const one = await page(owner.cookie, accountId, '?limit=1')
    assert.deepEqual(
      one.items.map((i) => i.transferId),
      expected.slice(0, 1),
    )
    const hundred = await page(owner.cookie, accountId, '?limit=100')
    assert.equal(hundred.items.length, 40)
    assert.equal(hundred.nextCursor, null)
    const forty = await page(owner.cookie, accountId, '?limit=39')
    assert.equal(forty.items.length, 39)
    assert.ok(forty.nextCursor)
    const empty = await customer()
    assert.deepEqual(await page(empty.cookie, empty.accountIds[0]!), { items: [], nextCursor: null })
  })

  test('out of range or not an integer: 400 validation; so is an unknown parameter', async () => {
    for (const query of [
      '?limit=0',
      '?limit=101',
      '?limit=-1',
      '?limit=1.5',
      '?limit=abc',
      '?limit=01',
      '?limit=',
      '?limit=1e2',
      '?limit=1&limit=2',
      '?offset=20',
    ]) {
      await expectProblem(
        await history(t.app, owner.cookie, owner.accountIds[0]!, query),
        400,
        '/problems/validation',
      )
    }
  })
})

describe('directions and counterparties', () => {
  test('each side sees its own direction, the other account and the transfer as POST /transfers answered it', async () => {
    const a = await customer([10_000, 10_000])
    const b = await customer()
    const [a1, a2] = a.accountIds as [number, number]
    const b1 = b.accountIds[0]!
    const transfer = async (who: Customer, fromAccountId: number, toAccountId: number, amount: number) => {
      const res = await t.app.inject({
        method: 'POST',
        url: '/transfers',
        headers: { cookie: who.cookie, 'idempotency-key': randomUUID() },
        payload: { fromAccountId, toAccountId, amount, currency: 'VND' },
      })
      assert.equal(res.statusCode, 201, res.body)
      return res.json() as { transferId: number; createdAt: string }
    }
    const sent = await transfer(a, a1, b1, 700)
    const received = await transfer(b, b1, a1, 300)
    const own = await transfer(a, a1, a2, 50)
    const item = (
      made: { transferId: number; createdAt: string },
      direction: string,
      amount: number,
      counterpartyAccountId: number,
    ) => ({
      transferId: made.transferId,
      direction,
      amount,
      currency: 'VND',
      counterpartyAccountId,
      createdAt: made.createdAt,
    })
    assert.deepEqual((await page(a.cookie, a1)).items, [
      item(own, 'debit', 50, a2),
      item(received, 'credit', 300, b1),
      item(sent, 'debit', 700, b1),
    ])
    assert.deepEqual((await page(a.cookie, a2)).items, [item(own, 'credit', 50, a1)])
    assert.deepEqual((await page(b.cookie, b1)).items, [
      item(received, 'debit', 300, a1),
      item(sent, 'credit', 700, a1),
    ])
  })
})

describe('ownership', () => {
  test("another customer's account, a missing one and one beyond integer: 404 exactly like the balance", async () => {
    const a = await customer()
    const b = await customer()
    await move(b, b.accountIds[0]!, a.accountIds[0]!)
    for (const accountId of [b.accountIds[0]!, 999_999_999, 2_147_483_648, 9_999_999_999]) {
      const res = await history(t.app, a.cookie, accountId)
      await expectProblem(res, 404, '/problems/account-not-found')
      const balance = await t.app.inject({
        url: `/accounts/${accountId}/balance`,
        headers: { cookie: a.cookie },
      })
      assert.equal(balance.statusCode, 404)
      assert.deepEqual(res.json(), balance.json())
    }
    await expectProblem(await history(t.app, a.cookie, '01'), 400, '/problems/validation')
    await expectProblem(await history(t.app, '', a.accountIds[0]!), 401, '/problems/unauthenticated')
  })
})
