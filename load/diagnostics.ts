// What the tracing channels cost (src/plugins/common/diagnostics.ts): `npm run bench:diagnostics
// [-- --quick]`. The claim: with nobody subscribed, a traced operation costs one `hasSubscribers`
// check, no measurable cost.
//
// (A) End to end: the chain server (load/servers/chain.ts, the balance read through IP rate limit,
// session and cache, configured as the chain scenario's "gateway chain") twice, side by side in
// alternating rounds (load/lib/runner.ts `interleave`, autocannon, CPU placement of load/run.ts):
// as is, nobody subscribed, and with DIAGNOSTICS_SUBSCRIBER=noop, a subscriber that does nothing on
// every event of every channel of CHANNELS, so that each traced operation takes its publishing path.
// req/s and the server's and redis-server's CPU µs per request (/proc, INFO cpu), medians over
// rounds, and the per-round ratios. That is the price of a listener; the path nobody subscribed is
// too cheap to show end to end, hence (B).
//
// (B) In this process, before the servers start: `traced()` as the session hook calls it (on the
// real `channels.session`), and the cache read's inline `hasSubscribers` check, nobody subscribed,
// against calling the operation directly, ns per call over millions of calls in rounds of
// alternating order, medians; then traced() with a no-op subscriber. A third chain server
// (DIAGNOSTICS_SUBSCRIBER=count) counts the traced operations one balance read starts, per channel;
// ns per call x operations per request is set against the chain's server CPU per request of (A)
// and against that figure's spread over (A)'s rounds: a cost below that spread cannot be measured
// end to end.
//
// Writes load/results/diagnostics.{json,md} (--quick: 2 short rounds and fewer calls, to
// load/results/quick/, in about 20 s). Exits 1 on any non-2xx answer or error in a load
// run, or when a server's subscription state is not the one asked for.
import { parseArgs } from 'node:util'
import type { FastifyRequest } from 'fastify'
import { channels, traced } from '../src/plugins/common/diagnostics.ts'
import { placement } from './lib/cpus.ts'
import {
  type Contender,
  CPU_PER_REQUEST_NOTE,
  cpuCell,
  formatTable,
  interleave,
  type ServerHandle,
  type Spread,
  type Summary,
  spread,
  startServer,
  writeResults,
} from './lib/runner.ts'
import { placeBenchProcess, startBenchServices } from './lib/services.ts'
import { chainEnv } from './scenarios/chain.ts'

const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false } } })
const quick = values.quick

const ROUNDS = quick ? 2 : 10
const DURATION_SEC = quick ? 1 : 5
const WARMUP_SEC = quick ? 1 : 5
/** Balance reads counted one at a time on the counting server. */
const COUNTED_REQUESTS = quick ? 50 : 500
/** Calls per micro run, rounds of each variant (alternating), and warm-up rounds. */
const MICRO_CALLS = quick ? 1_000_000 : 10_000_000
const MICRO_ROUNDS = quick ? 3 : 15
const MICRO_WARMUP = 2
/** Calls between two turns of the event loop, so that a subscriber's promises settle as they go. */
const CHUNK = 10_000
const NOBODY = 'chain, nobody subscribed'
const NOOP = 'chain, no-op subscriber on every channel'

const entry = (path: string) => new URL(path, import.meta.url).pathname
const fixed = (s: Spread, digits = 0) =>
  `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})`

// ---- (B) traced() in this process ----------------------------------------------------------------

/** What a request is to the operation: one field it bumps, so no call can be optimized away. */
interface Subject {
  decisions: number
  sessionDecision: string
}
const SETTLED = Promise.resolve(0)
/** The traced operation: a hook's Redis call is awaited by its caller; here it has already settled. */
function decide(subject: Subject): Promise<number> {
  subject.decisions++
  return SETTLED
}
/** The operation called directly, as a hook would without tracing. */
function direct(subject: Subject): Promise<number> {
  return decide(subject)
}
/** The session hook's call site (src/plugins/session/hooks.ts): context, operation and fill as closures. */
function viaTraced(subject: Subject): Promise<number> {
  const request = subject as unknown as FastifyRequest
  return traced(
    channels.session,
    () => ({ request, decision: null }),
    () => decide(subject),
    (context) => {
      context.decision = subject.sessionDecision
    },
  )
}
/** The cache read's form (src/plugins/cache/read.ts): the check inline, no closure when nobody listens. */
function checked(subject: Subject): Promise<number> {
  if (!channels.session.hasSubscribers) return decide(subject)
  return viaTraced(subject)
}

// One loop per variant, so that each is optimized for its own callee.
function loopDirect(subject: Subject, calls: number): Promise<number> {
  let last = SETTLED
  for (let i = 0; i < calls; i++) last = direct(subject)
  return last
}
function loopTraced(subject: Subject, calls: number): Promise<number> {
  let last = SETTLED
  for (let i = 0; i < calls; i++) last = viaTraced(subject)
  return last
}
function loopChecked(subject: Subject, calls: number): Promise<number> {
  let last = SETTLED
  for (let i = 0; i < calls; i++) last = checked(subject)
  return last
}
type Loop = typeof loopDirect

const turn = () => new Promise<void>((resolve) => setImmediate(resolve))

/** ns per call of `calls` calls, in chunks with a turn of the event loop between them. */
async function nsPerCall(loop: Loop, calls: number): Promise<number> {
  const subject: Subject = { decisions: 0, sessionDecision: 'found' }
  const started = process.hrtime.bigint()
  for (let done = 0; done < calls; done += CHUNK) {
    loop(subject, Math.min(CHUNK, calls - done))
    await turn()
  }
  const ns = Number(process.hrtime.bigint() - started)
  if (subject.decisions !== calls) throw new Error(`${subject.decisions} of ${calls} calls ran`)
  return ns / calls
}

/** Per variant: ns per call of each round, and its excess over the direct call of the same round. */
type MicroRounds = Record<string, { ns: number[]; overhead: number[] }>

/** The variants in rounds of alternating order (A B C, then C B A, ...); the first is the direct call. */
async function microRounds(label: string, calls: number, variants: Array<[string, Loop]>) {
  const rounds: MicroRounds = Object.fromEntries(variants.map(([name]) => [name, { ns: [], overhead: [] }]))
  for (let i = 0; i < MICRO_WARMUP; i++) for (const [, loop] of variants) await nsPerCall(loop, calls)
  for (let round = 0; round < MICRO_ROUNDS; round++) {
    const measured = new Map<string, number>()
    for (const [name, loop] of round % 2 ? [...variants].reverse() : variants)
      measured.set(name, await nsPerCall(loop, calls))
    const base = measured.get(variants[0]![0])!
    for (const [name, ns] of measured) {
      rounds[name]!.ns.push(ns)
      rounds[name]!.overhead.push(ns - base)
    }
    console.error(
      `micro, ${label}, round ${round + 1}/${MICRO_ROUNDS}: ${[...measured].map(([name, ns]) => `${name} ${ns.toFixed(2)}`).join(', ')} ns per call`,
    )
  }
  return Object.fromEntries(
    Object.entries(rounds).map(([name, r]) => [
      name,
      { ns: spread(r.ns), overhead: spread(r.overhead), rounds: r },
    ]),
  )
}

// ---- (A) the chain, end to end -------------------------------------------------------------------

async function login(url: string): Promise<string> {
  const response = await fetch(`${url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'alice', password: 'demo-password' }),
  })
  const cookie = response.headers.getSetCookie()[0]?.split(';')[0]
  if (response.status !== 200 || !cookie) throw new Error(`login to ${url} failed: ${response.status}`)
  return cookie
}

async function balancePath(url: string, cookie: string): Promise<string> {
  const response = await fetch(`${url}/accounts`, { headers: { cookie } })
  const body = (await response.json()) as { accounts?: Array<{ accountId: number }> }
  const id = body.accounts?.[0]?.accountId
  if (!id) throw new Error(`GET /accounts answered ${response.status}: ${JSON.stringify(body)}`)
  return `/accounts/${id}/balance`
}

interface Counters {
  requests: number
  diagnosticsSubscribed?: boolean
  tracedOperations?: Record<string, number>
}
const counters = async (url: string) => (await (await fetch(`${url}/__bench/counters`)).json()) as Counters

/** Traced operations started per channel between two reads of the counters. */
const startedBetween = (before: Counters, after: Counters) =>
  Object.fromEntries(
    Object.entries(after.tracedOperations ?? {}).map(([name, n]) => [
      name,
      n - (before.tracedOperations?.[name] ?? 0),
    ]),
  )

/**
 * Balance reads one at a time on the counting server: traced operations started per request, per
 * channel. A read of the counters is a request too (its session is traced): what one costs, from
 * two reads in a row, is taken off.
 */
async function countPerRequest(url: string, path: string, cookie: string) {
  const before = await counters(url)
  for (let i = 0; i < COUNTED_REQUESTS; i++) {
    const response = await fetch(url + path, { headers: { cookie } })
    await response.arrayBuffer()
    if (response.status !== 200) throw new Error(`counting: GET ${path} answered ${response.status}`)
  }
  const after = await counters(url)
  const ownRead = startedBetween(after, await counters(url))
  const requests = after.requests - before.requests
  const perChannel: Record<string, number> = {}
  for (const [name, n] of Object.entries(startedBetween(before, after))) {
    const started = n - (ownRead[name] ?? 0)
    if (started) perChannel[name] = started / requests
  }
  const total = Object.values(perChannel).reduce((sum, n) => sum + n, 0)
  if (!total) throw new Error('the counting subscriber saw no traced operation')
  return { requests, perChannel, total }
}

await placeBenchProcess()

const started = performance.now()
// (B) first, with nothing else running; the subscribed rounds last, since a subscription stays.
const DIRECT = 'direct'
const TRACED = 'traced()'
const CHECKED = 'hasSubscribers inline'
const unsubscribed = await microRounds('nobody subscribed', MICRO_CALLS, [
  [DIRECT, loopDirect],
  [TRACED, loopTraced],
  [CHECKED, loopChecked],
])
const noop = () => {}
const noopHandlers = { start: noop, end: noop, asyncStart: noop, asyncEnd: noop, error: noop }
channels.session.subscribe(noopHandlers)
// The publishing path makes promises at each call: fewer calls keep the heap small.
const SUBSCRIBED_CALLS = MICRO_CALLS / 50
const subscribed = await microRounds('no-op subscriber', SUBSCRIBED_CALLS, [
  [DIRECT, loopDirect],
  [TRACED, loopTraced],
])
channels.session.unsubscribe(noopHandlers)

const services = await startBenchServices()
const servers: ServerHandle[] = []
let summaries: Summary[]
let counted: Awaited<ReturnType<typeof countPerRequest>>
try {
  // As the chain scenario's "gateway chain": every limit active, none rejecting, no background work.
  const common = { ...chainEnv(services), CACHE: 'on' }
  // The counting server migrates and seeds; the two measured ones start after it, alike.
  const counting = await startServer(entry('servers/chain.ts'), {
    ...common,
    DIAGNOSTICS_SUBSCRIBER: 'count',
  })
  servers.push(counting)
  const [nobody, listened] = await Promise.all([
    startServer(entry('servers/chain.ts'), common),
    startServer(entry('servers/chain.ts'), { ...common, DIAGNOSTICS_SUBSCRIBER: 'noop' }),
  ])
  servers.push(nobody, listened)
  if ((await counters(nobody.url)).diagnosticsSubscribed !== false)
    throw new Error('the chain server without a subscriber has one')
  if ((await counters(listened.url)).diagnosticsSubscribed !== true)
    throw new Error('the chain server with DIAGNOSTICS_SUBSCRIBER=noop has no subscriber')

  const countingCookie = await login(counting.url)
  const path = await balancePath(counting.url, countingCookie)
  counted = await countPerRequest(counting.url, path, countingCookie)
  console.error(
    `traced operations per balance read: ${counted.total} (${Object.entries(counted.perChannel)
      .map(([name, n]) => `${name} ${n}`)
      .join(', ')})`,
  )
  await counting.stop()
  const contenders: Contender[] = []
  for (const [name, server] of [
    [NOBODY, nobody],
    [NOOP, listened],
  ] as const) {
    const headers = { cookie: await login(server.url) }
    const response = await fetch(server.url + path, { headers })
    if (response.status !== 200) throw new Error(`${name} answered ${response.status} on ${path}`)
    contenders.push({
      name,
      url: server.url,
      pid: server.pid,
      spec: { path, headers, durationSec: DURATION_SEC },
    })
  }
  summaries = await interleave(contenders, {
    rounds: ROUNDS,
    warmupSec: WARMUP_SEC,
    label: 'diagnostics',
    redisUrl: services.redisUrl,
  })
} finally {
  await Promise.allSettled(servers.map((s) => s.stop()))
  await services.stop()
}

const [none, listening] = [NOBODY, NOOP].map((name) => summaries.find((s) => s.name === name)!) as [
  Summary,
  Summary,
]
const failures = summaries.flatMap((s) =>
  s.samples.some((x) => x.non2xx + x.errors + x.timeouts) ? [s.name] : [],
)
const serverCpu = (s: Summary, i: number) => s.samples[i]!.serverCpuMicros ?? 0
const rounds = none.samples.map((_, i) => i)
/** Per round: the subscribed server over the other, req/s and server CPU µs per request. */
const rpsRatio = spread(rounds.map((i) => listening.samples[i]!.rps / none.samples[i]!.rps))
const cpuRatio = spread(rounds.map((i) => serverCpu(listening, i) / Math.max(1e-9, serverCpu(none, i))))
const cpuDifference = spread(rounds.map((i) => serverCpu(listening, i) - serverCpu(none, i)))
const costlierRounds = rounds.filter((i) => serverCpu(listening, i) > serverCpu(none, i)).length
const slowerRounds = rounds.filter((i) => listening.samples[i]!.rps < none.samples[i]!.rps).length
/**
 * Two-sided sign test: the chance that, with no difference between the servers, `against` of `n`
 * rounds or as lopsided a split in either direction would come out (each round a fair coin).
 */
function signTest(against: number, n: number): number {
  const choose = (k: number) => {
    let c = 1
    for (let i = 1; i <= k; i++) c = (c * (n - k + i)) / i
    return c
  }
  let tail = 0
  for (let k = Math.max(against, n - against); k <= n; k++) tail += choose(k)
  return Math.min(1, (2 * tail) / 2 ** n)
}
/** A difference beyond the run-to-run noise: its sign test below 5 % (at least 6 rounds for that). */
const SIGNIFICANCE = 0.05
const cpuSignTest = signTest(costlierRounds, rounds.length)
const rpsSignTest = signTest(slowerRounds, rounds.length)
const cpuBeyondNoise = cpuSignTest < SIGNIFICANCE
const rpsBeyondNoise = rpsSignTest < SIGNIFICANCE

const tracedCall = unsubscribed[TRACED]!
const checkedCall = unsubscribed[CHECKED]!
const publishingCall = subscribed[TRACED]!
const chainCpuMicros = none.serverCpuMicros!.median
/** What the chain's server CPU per request moved by over (A)'s rounds with nothing changed. */
const chainCpuNoise = none.serverCpuMicros!.max - none.serverCpuMicros!.min
// traced() for every operation (the cache's inline check costs less): an upper bound. A negative
// excess (measured faster than the direct call) is noise, and counts as nothing.
const nsPerRequest = Math.max(0, tracedCall.overhead.median) * counted.total
const shareOfRequest = nsPerRequest / (chainCpuMicros * 1000)
const predictedPublishing = (publishingCall.overhead.median * counted.total) / 1000
const measurable = nsPerRequest >= chainCpuNoise * 1000

const pct = (x: number) => `${(x * 100).toFixed(x < 0.001 ? 4 : 2)} %`
const conclusion = `Nobody subscribed, the ${counted.total} traced operations of a chain request cost at most ${nsPerRequest.toFixed(1)} ns (traced() ${tracedCall.overhead.median.toFixed(2)} ns over a direct call), ${pct(shareOfRequest)} of its ${chainCpuMicros.toFixed(0)} µs of server CPU, ${measurable ? 'NOT ' : ''}below the ${chainCpuNoise.toFixed(1)} µs that figure moved by between rounds: ${measurable ? 'a measurable cost' : 'no measurable cost'}.`

const chainTable = formatTable(
  [
    'chain server',
    'req/s median (min-max)',
    'server CPU µs/req',
    'Redis CPU µs/req',
    'p99 ms median (min-max)',
  ],
  summaries.map((s) => [
    s.name,
    fixed(s.rps),
    cpuCell(s.serverCpuMicros, 1),
    cpuCell(s.redisCpuMicros, 1),
    fixed(s.p99, 1),
  ]),
)
const ratioTable = formatTable(
  [
    'per round: no-op subscriber / nobody subscribed',
    'median',
    'min',
    'max',
    'rounds against the subscriber',
  ],
  [
    [
      'req/s',
      `${rpsRatio.median.toFixed(3)}x`,
      `${rpsRatio.min.toFixed(3)}x`,
      `${rpsRatio.max.toFixed(3)}x`,
      `slower in ${slowerRounds} of ${rounds.length}`,
    ],
    [
      'server CPU µs/req',
      `${cpuRatio.median.toFixed(3)}x`,
      `${cpuRatio.min.toFixed(3)}x`,
      `${cpuRatio.max.toFixed(3)}x`,
      `costlier in ${costlierRounds} of ${rounds.length}`,
    ],
  ],
)
const microTable = formatTable(
  ['in process, per call', 'ns median (min-max)', 'over the direct call of the same round, ns'],
  [
    ['nobody subscribed: the operation called directly', fixed(unsubscribed[DIRECT]!.ns, 2), ''],
    [
      "nobody subscribed: traced() (the plugins' hooks)",
      fixed(tracedCall.ns, 2),
      fixed(tracedCall.overhead, 2),
    ],
    [
      'nobody subscribed: hasSubscribers inline (the cache read)',
      fixed(checkedCall.ns, 2),
      fixed(checkedCall.overhead, 2),
    ],
    ['no-op subscriber: the operation called directly', fixed(subscribed[DIRECT]!.ns, 2), ''],
    ['no-op subscriber: traced()', fixed(publishingCall.ns, 1), fixed(publishingCall.overhead, 1)],
  ],
)
const countTable = formatTable(
  ['channel', 'traced operations per balance read'],
  [
    ...Object.entries(counted.perChannel).map(([name, n]) => [name, n.toFixed(2)]),
    ['total', counted.total.toFixed(2)],
  ],
)
const verdict = (beyond: boolean, p: number, what: string) =>
  rounds.length < 6
    ? `too few rounds (${rounds.length}) to tell a difference in ${what} from the noise`
    : beyond
      ? `${what} differs beyond the run-to-run noise (sign test p = ${p.toFixed(3)})`
      : `${what} does not differ beyond the run-to-run noise (sign test p = ${p.toFixed(2)})`

const markdown = [
  `## Tracing channels with and without a subscriber${quick ? ' (quick)' : ''}`,
  '',
  `**(A) End to end.** The chain server (\`load/servers/chain.ts\`: IP rate limit, session, cache hit on \`GET /accounts/:id/balance\`, configured as the chain scenario's "gateway chain"), as is and with \`DIAGNOSTICS_SUBSCRIBER=noop\` (a subscriber that does nothing on every event of every channel of \`CHANNELS\`, so that each traced operation publishes), in ${ROUNDS} alternating rounds of ${DURATION_SEC} s after a warm-up of ${WARMUP_SEC} s, autocannon at 50 connections.`,
  '',
  chainTable,
  '',
  CPU_PER_REQUEST_NOTE,
  '',
  ratioTable,
  '',
  `Server CPU per request, subscriber minus nobody, per round: median ${cpuDifference.median.toFixed(2)} µs (from ${cpuDifference.min.toFixed(2)} to ${cpuDifference.max.toFixed(2)}); ${verdict(cpuBeyondNoise, cpuSignTest, 'server CPU per request')}; ${verdict(rpsBeyondNoise, rpsSignTest, 'req/s')}. That is the price of a listener; the path nobody subscribed is (B)'s.`,
  failures.length ? `Non-2xx responses or errors in: ${failures.join(', ')}.` : '',
  '',
  `**(B) In process.** \`traced()\` as the session hook calls it (on \`channels.session\`, the context, operation and fill as closures), and the cache read's inline \`hasSubscribers\` check, against the operation called directly (it bumps a field and returns a settled promise): ${MICRO_CALLS.toLocaleString('en-US')} calls per run, ${MICRO_ROUNDS} rounds in alternating order after ${MICRO_WARMUP} of warm-up, medians; then with a no-op subscriber on that channel (${SUBSCRIBED_CALLS.toLocaleString('en-US')} calls per run, the promises it makes settling as they go). In the benchmark's process on CPU 0, before the servers start.`,
  '',
  microTable,
  '',
  `Traced operations one balance read starts, counted by a third chain server (\`DIAGNOSTICS_SUBSCRIBER=count\`) over ${counted.requests} reads one at a time:`,
  '',
  countTable,
  '',
  `Nobody subscribed: ${tracedCall.overhead.median.toFixed(2)} ns x ${counted.total} = ${nsPerRequest.toFixed(1)} ns per request, counting every operation at traced()'s price (the cache read's check costs less), ${pct(shareOfRequest)} of the chain's ${chainCpuMicros.toFixed(1)} µs of server CPU per request in (A), whose rounds spread over ${chainCpuNoise.toFixed(1)} µs. With a no-op subscriber the same arithmetic predicts ${predictedPublishing.toFixed(2)} µs per request; (A) measured ${cpuDifference.median.toFixed(2)} µs.`,
  '',
  `**Conclusion.** ${conclusion}`,
  '',
  `Command: \`npm run bench:diagnostics${quick ? ' -- --quick' : ''}\`. CPU placement: ${placement()}.`,
]
  .filter((line, i, all) => line !== '' || all[i - 1] !== '')
  .join('\n')

const paths = writeResults(
  'diagnostics',
  {
    quick,
    placement: placement(),
    chain: {
      rounds: ROUNDS,
      durationSec: DURATION_SEC,
      summaries,
      ratios: { rps: rpsRatio, serverCpu: cpuRatio },
      serverCpuDifferenceMicros: cpuDifference,
      costlierRounds,
      slowerRounds,
      cpuSignTest,
      rpsSignTest,
      cpuBeyondNoise,
      rpsBeyondNoise,
    },
    micro: {
      nobodySubscribed: { calls: MICRO_CALLS, rounds: MICRO_ROUNDS, ...unsubscribed },
      noopSubscriber: { calls: SUBSCRIBED_CALLS, rounds: MICRO_ROUNDS, ...subscribed },
    },
    tracedPerRequest: counted,
    nsPerRequestNobodySubscribed: nsPerRequest,
    shareOfServerCpu: shareOfRequest,
    serverCpuSpreadMicros: chainCpuNoise,
    predictedPublishingMicros: predictedPublishing,
    measurable,
    conclusion,
  },
  markdown,
  { quick },
)
console.log(`\n${markdown}\n\n(${paths.md}, ${((performance.now() - started) / 1000).toFixed(0)} s)`)
if (failures.length) {
  console.error(`non-2xx answers or errors in: ${failures.join(', ')}`)
  process.exitCode = 1
}
