// How long a revoked session is still served by the other instances: `npm run
// bench:session-revocation [-- --quick]` (docs/session.md, "L1"). On a private redis-server, 4
// instances (load/servers/session-l1.ts, each its own process, client and L1, one key prefix). Per
// trial: a login on one instance, the session loaded on every instance (twice: each L1 holds it),
// then a logout on one instance while each other instance is polled (GET /me, one request at a
// time) until it answers 401. The time to that 401 is the revocation bound as a client sees it (it
// includes one HTTP round trip of the poll); a poll sent after the logout was answered and still
// served is counted (the L1's promise is that there are none, up to the message's delivery). Prints p50/p99/max in ms; writes
// load/results/session-revocation.{json,md} (--quick: 20 trials, to load/results/quick/).
import { parseArgs } from 'node:util'
import { startRedisServer } from '../src/embedded/redis-server.ts'
import { type ServerHandle, startServer, stopAllServers, writeResults } from './lib/runner.ts'

const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false } } })
const INSTANCES = 4
const TRIALS = values.quick ? 20 : 500
/** A poll that never sees a 401 in this long fails the run: the invalidation was lost. */
const GIVE_UP_MS = 10_000

async function login(server: ServerHandle, user: string): Promise<string> {
  const res = await fetch(`${server.url}/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ user }),
  })
  if (res.status !== 200) throw new Error(`login answered ${res.status}`)
  const cookie = res.headers.getSetCookie().find((c) => c.startsWith('sid='))
  if (!cookie) throw new Error('login set no session cookie')
  return cookie.split(';')[0]!
}

const me = async (server: ServerHandle, cookie: string) => {
  const res = await fetch(`${server.url}/me`, { headers: { cookie } })
  await res.arrayBuffer()
  return res.status
}

/** One GET /me: when it was sent, and what it answered. */
interface Poll {
  sentAt: number
  status: number
}

/** Polls `server` with the session, one request at a time, until it answers 401. */
async function pollUntilRefused(server: ServerHandle, cookie: string, from: number): Promise<Poll[]> {
  const polls: Poll[] = []
  for (;;) {
    const sentAt = performance.now()
    const status = await me(server, cookie)
    polls.push({ sentAt, status })
    if (status === 401) return polls
    if (status !== 200) throw new Error(`GET /me answered ${status}`)
    if (sentAt - from > GIVE_UP_MS) throw new Error(`still served ${GIVE_UP_MS} ms after the logout`)
  }
}

interface Measured {
  /** Per other instance and trial: ms from the logout sent to the answer of its first 401. */
  fromSent: number[]
  /** The same from the logout's answer (0 when refused by then). */
  fromAnswered: number[]
  /** Per trial: the slowest of the other instances, from the logout sent. */
  lastFromSent: number[]
  /** Polls sent after the logout was answered that were still served (200). */
  servedAfterAnswer: number
  pollsAfterAnswer: number
}

async function measure(servers: ServerHandle[]): Promise<Measured> {
  const m: Measured = {
    fromSent: [],
    fromAnswered: [],
    lastFromSent: [],
    servedAfterAnswer: 0,
    pollsAfterAnswer: 0,
  }
  for (let trial = 0; trial < TRIALS; trial++) {
    const revoker = servers[trial % servers.length]!
    const cookie = await login(servers[(trial + 1) % servers.length]!, `user${trial}`)
    for (const server of servers)
      for (let i = 0; i < 2; i++)
        if ((await me(server, cookie)) !== 200) throw new Error('a fresh session was refused')
    // The other instances are polled from the moment the logout is sent.
    const sentAt = performance.now()
    const others = servers.filter((server) => server !== revoker)
    const polling = others.map((server) =>
      pollUntilRefused(server, cookie, sentAt).then((polls) => ({ polls, refusedAt: performance.now() })),
    )
    const logout = await fetch(`${revoker.url}/logout`, { method: 'POST', headers: { cookie } })
    const answeredAt = performance.now()
    if (logout.status !== 204) throw new Error(`logout answered ${logout.status}`)
    const refused = await Promise.all(polling)
    for (const { polls, refusedAt } of refused) {
      m.fromSent.push(refusedAt - sentAt)
      m.fromAnswered.push(Math.max(0, refusedAt - answeredAt))
      for (const poll of polls)
        if (poll.sentAt > answeredAt) {
          m.pollsAfterAnswer++
          if (poll.status === 200) m.servedAfterAnswer++
        }
    }
    m.lastFromSent.push(Math.max(...refused.map(({ refusedAt }) => refusedAt - sentAt)))
  }
  return m
}

function quantile(values: number[], q: number): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!
}

function stats(values: number[]) {
  const round = (ms: number) => Math.round(ms * 1000) / 1000
  return {
    p50: round(quantile(values, 0.5)),
    p99: round(quantile(values, 0.99)),
    max: round(Math.max(...values)),
  }
}

function report(m: Measured): void {
  const fromSent = stats(m.fromSent)
  const fromAnswered = stats(m.fromAnswered)
  const last = stats(m.lastFromSent)
  const line = (what: string, x: ReturnType<typeof stats>) =>
    `${what}: p50 ${x.p50} ms, p99 ${x.p99} ms, max ${x.max} ms`
  console.log(`${TRIALS} revocations on ${INSTANCES} instances`)
  console.log(line('logout sent to 401, each other instance', fromSent))
  console.log(line('logout sent to 401, the last other instance', last))
  console.log(line('logout answered to 401, each other instance', fromAnswered))
  console.log(
    `polls sent after the logout's answer and still served: ${m.servedAfterAnswer} of ${m.pollsAfterAnswer}`,
  )
  const row = (what: string, x: ReturnType<typeof stats>) => `| ${what} | ${x.p50} | ${x.p99} | ${x.max} |`
  const markdown = [
    '## Session revocation across instances',
    '',
    `${TRIALS} logouts, each on one of ${INSTANCES} instances (separate processes, each with its own client and L1, one private redis-server), after the session was loaded twice on every instance (each L1 holds it). The other instances are polled with GET /me, one request at a time each, from the moment the logout is sent until each answers 401; the times are to the answer of that 401, so they include one HTTP round trip of the poll.`,
    '',
    '| revocation | p50 (ms) | p99 (ms) | max (ms) |',
    '|---|---|---|---|',
    row('logout sent to 401, each other instance', fromSent),
    row('logout sent to 401, the last other instance', last),
    row('logout answered to 401, each other instance (0: refused by then)', fromAnswered),
    '',
    `Polls sent after the logout was answered and still served (200): ${m.servedAfterAnswer} of ${m.pollsAfterAnswer}.`,
    '',
    'Command: `npm run bench:session-revocation`.',
  ].join('\n')
  const paths = writeResults(
    'session-revocation',
    {
      instances: INSTANCES,
      trials: TRIALS,
      fromSent,
      lastFromSent: last,
      fromAnswered,
      servedAfterAnswer: m.servedAfterAnswer,
      pollsAfterAnswer: m.pollsAfterAnswer,
    },
    markdown,
    { quick: values.quick },
  )
  console.log(`wrote ${paths.md}`)
}

const redisServer = await startRedisServer()
const env = { REDIS_URL: redisServer.url, SESSION_KEY_PREFIX: 'bench:sess:' }
const servers: ServerHandle[] = []
try {
  for (let i = 0; i < INSTANCES; i++) servers.push(await startServer('load/servers/session-l1.ts', env))
  const result = await measure(servers)
  report(result)
} finally {
  await stopAllServers()
  await redisServer.stop()
}
