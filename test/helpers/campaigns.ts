import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { Cluster, Redis } from 'ioredis'
import { LEADERBOARD_GROUP } from '../../src/campaigns/leaderboard.ts'
import { STATS_GROUP } from '../../src/campaigns/stats.ts'
import type { TestApp } from './gateway.ts'
import { scanKeys, testRedisConnection } from './index.ts'

// Shared by test/demo/campaigns-leaderboard.test.ts and test/demo/campaigns-stats-today.test.ts: transfers over real HTTP and
// waiting (by polling outcomes, never by sleeping a fixed time) for the campaign groups to catch up.

export async function until(check: () => Promise<boolean>, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** The group has read every entry of the stream and acknowledged it (XINFO GROUPS: lag and pending 0). */
export async function groupDone(t: TestApp, group: string): Promise<boolean> {
  const stream = t.app.events.stream
  if (!(await t.redis.exists(stream))) return false
  const groups = (await t.redis.xinfo('GROUPS', stream)) as unknown[][]
  for (const info of groups) {
    const fields = new Map<string, unknown>()
    for (let i = 0; i + 1 < info.length; i += 2) fields.set(String(info[i]), info[i + 1])
    if (fields.get('name') === group) return fields.get('lag') === 0 && fields.get('pending') === 0
  }
  return false
}

/** Every committed transfer's event is on the stream, and both campaign groups have handled all of them. */
export async function campaignsCaughtUp(t: TestApp): Promise<void> {
  await until(async () => {
    const [row] = await t.db.query<{ n: number }>('SELECT count(*)::int AS n FROM outbox_events')
    if (row!.n > 0) return false
    return (await groupDone(t, LEADERBOARD_GROUP)) && (await groupDone(t, STATS_GROUP))
  }, 'the outbox relay and the leaderboard and daily-stats groups')
}

export interface Transfer {
  cookie: string
  fromAccountId: number
  toAccountId: number
  amount: number
  currency: string
}

/** POST /transfers over HTTP; asserts the 201. */
export async function transfer(url: string, t: Transfer): Promise<void> {
  const response = await fetch(`${url}/transfers`, {
    method: 'POST',
    headers: { cookie: t.cookie, 'idempotency-key': randomUUID(), 'content-type': 'application/json' },
    body: JSON.stringify({
      fromAccountId: t.fromAccountId,
      toAccountId: t.toAccountId,
      amount: t.amount,
      currency: t.currency,
    }),
  })
  assert.equal(response.status, 201, await response.text())
}

/** Appends every entry of the transfer events stream to it once more: each event is delivered twice. */
export async function duplicateEveryEvent(t: TestApp): Promise<number> {
  const stream = t.app.events.stream
  const entries = (await t.redis.xrange(stream, '-', '+')) as Array<[string, string[]]>
  for (const [, fields] of entries) await t.redis.xadd(stream, '*', ...fields)
  return entries.length
}

/** Closes the app, then deletes its keys (the suites share one Redis) with a client of its own. */
export async function closeAndClean(t: TestApp): Promise<void> {
  await t.close()
  const { url, clusterNodes } = testRedisConnection()
  const redis = clusterNodes ? new Cluster(clusterNodes) : new Redis(url!)
  try {
    for (const key of await scanKeys(redis, t.prefix)) await redis.del(key)
  } finally {
    await redis.quit()
  }
}
