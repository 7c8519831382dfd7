// Several gateway processes on one Redis and one Postgres, and a stampede on one cold key across
// all of them. Used by test/demo/cache-stampede.test.ts and the `cache` benchmark scenario.
import { startServer } from '../lib/runner.ts'

export const GATEWAY_ENTRY = new URL('./gateway.ts', import.meta.url).pathname
export const BENCH_SECRET = 'bench-secret-0123456789-abcdefghijklmnop'

export interface Gateways {
  urls: string[]
  stop(): Promise<void>
}

/** Starts `count` gateway processes; the first alone, so migrations and the seed run once. */
export async function startGateways(count: number, env: Record<string, string>): Promise<Gateways> {
  const full = { SESSION_SECRET: BENCH_SECRET, RATE_LIMITS: 'off', ...env }
  const first = await startServer(GATEWAY_ENTRY, full)
  const rest = await Promise.all(Array.from({ length: count - 1 }, () => startServer(GATEWAY_ENTRY, full)))
  const all = [first, ...rest]
  return { urls: all.map((s) => s.url), stop: async () => void (await Promise.all(all.map((s) => s.stop()))) }
}

/** Logs in as the seeded demo customer; the cookie works on every process (shared Redis). */
export async function loginDemo(
  url: string,
  username = 'alice',
): Promise<{ cookie: string; accountId: number }> {
  const res = await fetch(`${url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username, password: 'demo-password' }),
  })
  if (res.status !== 200) throw new Error(`login failed: ${res.status} ${await res.text()}`)
  const cookie = res.headers.getSetCookie()[0]!.split(';')[0]!
  const accounts = await fetch(`${url}/accounts`, { headers: { cookie } })
  const body = (await accounts.json()) as { accounts: Array<{ accountId: number }> }
  return { cookie, accountId: body.accounts[0]!.accountId }
}

/** Sum over processes of a counter sample from /metrics, e.g. cache_loads_total{name="account"}. */
export async function sumMetric(urls: string[], sample: string): Promise<number> {
  let total = 0
  for (const url of urls) {
    const text = await (await fetch(`${url}/metrics`)).text()
    for (const line of text.split('\n'))
      if (line.startsWith(`${sample} `)) total += Number(line.split(' ')[1])
  }
  return total
}

export interface StampedeResult {
  requests: number
  failed: number
  statuses: Record<string, number>
  balances: number[]
  p99Ms: number
  /** The problem titles of the failed reads, counted: what a failure was. */
  problems: Record<string, number>
  /** Loader calls for account entries across all processes: Postgres reads of balances. */
  loads: number
}

/**
 * `perProcess` simultaneous reads of one balance on every process at once. Connections are opened
 * first, so the reads leave together; `whileInFlight` runs once they are all sent.
 */
export async function stampede(
  urls: string[],
  cookie: string,
  accountId: number,
  perProcess: number,
  whileInFlight?: () => Promise<void>,
): Promise<StampedeResult> {
  const rounds = Array.from({ length: perProcess }, () => urls)
  await Promise.all(rounds.flat().map((url) => fetch(`${url}/health`).then((r) => r.arrayBuffer())))
  const loadsBefore = await sumMetric(urls, 'cache_loads_total{name="account"}')
  const latencies: number[] = []
  const statuses: Record<string, number> = {}
  const balances = new Set<number>()
  const problems: Record<string, number> = {}
  // Interleaved (one request per process in turn), so no process gets its share late.
  const reads = rounds.flat().map(async (url) => {
    const started = performance.now()
    try {
      const res = await fetch(`${url}/accounts/${accountId}/balance`, { headers: { cookie } })
      const body = (await res.json()) as { balance?: number; title?: string; detail?: string }
      statuses[res.status] = (statuses[res.status] ?? 0) + 1
      if (body.balance !== undefined) balances.add(body.balance)
      if (res.status !== 200) count(problems, `${body.title}: ${body.detail}`)
    } catch (err) {
      statuses.error = (statuses.error ?? 0) + 1
      count(problems, String(err))
    }
    latencies.push(performance.now() - started)
  })
  await whileInFlight?.()
  await Promise.all(reads)
  latencies.sort((a, b) => a - b)
  const requests = latencies.length
  return {
    requests,
    failed: requests - (statuses[200] ?? 0),
    statuses,
    balances: [...balances],
    problems,
    p99Ms: Math.round(latencies[Math.min(requests - 1, Math.floor(requests * 0.99))]! * 10) / 10,
    loads: (await sumMetric(urls, 'cache_loads_total{name="account"}')) - loadsBefore,
  }
}

function count(tally: Record<string, number>, what: string): void {
  tally[what] = (tally[what] ?? 0) + 1
}
