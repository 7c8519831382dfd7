import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Database } from '../../src/db/database.ts'
import { ledgerInvariants } from './gateway.ts'

/** A logged-in customer whose first account sends money. */
export interface Actor {
  cookie: string
  accountId: number
}

export interface TransferAttempt {
  key: string
  actor: Actor
  body: string
  statuses: Array<number | 'network' | 'timeout'>
}

// Answers after which the transfer's fate is known: it ran (201) or it never will (4xx of its own).
const DEFINITIVE = new Set([201, 400, 404, 422])
export const isSettled = (a: TransferAttempt) => DEFINITIVE.has(a.statuses.at(-1) as number)

export interface LoadReport {
  statuses: Map<number | 'network' | 'timeout', number>
  attempts: TransferAttempt[]
}

async function send(url: string, path: string, init: RequestInit, timeoutMs: number) {
  try {
    const res = await fetch(url + path, { ...init, signal: AbortSignal.timeout(timeoutMs) })
    await res.arrayBuffer()
    return {
      status: res.status as number | 'network' | 'timeout',
      retryAfter: Number(res.headers.get('retry-after')),
    }
  } catch (err) {
    return {
      status: (err as Error).name === 'TimeoutError' ? ('timeout' as const) : ('network' as const),
      retryAfter: 0,
    }
  }
}

export function transferOnce(url: () => string, attempt: TransferAttempt, timeoutMs: number) {
  return send(
    url(),
    '/transfers',
    {
      method: 'POST',
      headers: {
        cookie: attempt.actor.cookie,
        'content-type': 'application/json',
        'idempotency-key': attempt.key,
      },
      body: attempt.body,
    },
    timeoutMs,
  )
}

/**
 * A bounded mix over real HTTP: new transfers (each with its own key), duplicates of earlier keys,
 * balance reads and account lists. `onProgress` sees the count of finished requests, for faults.
 */
export async function mixedLoad(
  url: () => string,
  actors: Actor[],
  options: { requests: number; inFlight: number; timeoutMs?: number; onProgress?: (done: number) => unknown },
): Promise<LoadReport> {
  // Far above any bound the gateway sets (500 ms per Redis command, 2 s to get a Postgres
  // connection): only a request that truly hangs reaches it, even on a loaded two-core machine.
  const timeoutMs = options.timeoutMs ?? 10_000
  const statuses = new Map<number | 'network' | 'timeout', number>()
  const attempts: TransferAttempt[] = []
  let started = 0
  let done = 0
  const worker = async () => {
    while (started < options.requests) {
      const i = started++
      const actor = actors[i % actors.length]!
      const target = actors[(i + 1) % actors.length]!
      let status: number | 'network' | 'timeout'
      if (i % 4 === 0 || (i % 4 === 1 && attempts.length === 0)) {
        const attempt: TransferAttempt = {
          key: randomUUID(),
          actor,
          body: JSON.stringify({
            fromAccountId: actor.accountId,
            toAccountId: target.accountId,
            amount: 1 + (i % 97),
            currency: 'VND',
          }),
          statuses: [],
        }
        attempts.push(attempt)
        status = (await transferOnce(url, attempt, timeoutMs)).status
        attempt.statuses.push(status)
      } else if (i % 4 === 1) {
        const attempt = attempts[i % attempts.length]!
        status = (await transferOnce(url, attempt, timeoutMs)).status
        attempt.statuses.push(status)
      } else {
        const path = i % 4 === 2 ? `/accounts/${actor.accountId}/balance` : '/accounts'
        status = (await send(url(), path, { headers: { cookie: actor.cookie } }, timeoutMs)).status
      }
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
      await options.onProgress?.(++done)
    }
  }
  await Promise.all(Array.from({ length: options.inFlight }, worker))
  return { statuses, attempts }
}

/** Retries every unsettled transfer with its own key and body until it settles, as a client would. */
export async function settle(url: () => string, attempts: TransferAttempt[], timeoutMs = 10_000) {
  const retries: Array<number | 'network' | 'timeout'> = []
  for (const attempt of attempts) {
    for (let i = 0; i < 60 && !isSettled(attempt); i++) {
      const { status, retryAfter } = await transferOnce(url, attempt, timeoutMs)
      attempt.statuses.push(status)
      retries.push(status)
      if (!isSettled(attempt)) await sleep(Math.min(Math.max(retryAfter, 0.2), 2) * 1000)
    }
    if (!isSettled(attempt))
      throw new Error(`transfer ${attempt.key} never settled: ${attempt.statuses.join(',')}`)
  }
  return retries
}

/** The money invariants plus "one transfer per key", with the keys that ran named. */
export async function moneyAndKeyInvariants(db: Database, attempts: TransferAttempt[]) {
  const rows = await db.query<{ idempotency_key: string; n: string }>(
    'SELECT idempotency_key, count(*)::text AS n FROM transfers GROUP BY customer_id, idempotency_key',
  )
  const byKey = new Map(rows.map((r) => [r.idempotency_key, Number(r.n)]))
  const ran = attempts.filter((a) => a.statuses.includes(201))
  return {
    ...(await ledgerInvariants(db)),
    keysRunTwice: rows.filter((r) => Number(r.n) > 1).length,
    keysAnswered201WithoutRow: ran.filter((a) => byKey.get(a.key) !== 1).length,
    rowsWithoutA201: rows.filter((r) => !ran.some((a) => a.key === r.idempotency_key)).length,
  }
}
