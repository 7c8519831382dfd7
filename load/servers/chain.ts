// The demo gateway with its whole chain (rate limit, session, cache, idempotency), configured by the
// environment like `npm start`, plus GET /__bench/counters: the database statement and transaction
// counts and the Redis round trips, so a scenario can report work per request. Seeds the demo customers.
import { tracingChannel } from 'node:diagnostics_channel'
import { Redis } from 'ioredis'
import { buildApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { seedDemo } from '../../src/ledger/seed.ts'
import { CHANNELS } from '../../src/plugins/common/diagnostics.ts'

// A Redis round trip starts whenever a command leaves while none is in flight, on any client of the
// process (main and cache). Only a run with one connection attributes them to single requests.
// The event consumers' blocking reads wait for seconds on their own connections, serve no request,
// and would hold the count still: they are left out. Counting costs a promise reaction per
// command, which the peer stack does not pay: it runs only between `?roundTrips=on` and `=off`.
const BLOCKING = new Set(['xreadgroup', 'xread', 'blpop', 'brpop', 'blmove', 'brpoplpush', 'bzpopmin'])
let countRoundTrips = false
let redisRoundTrips = 0
let inFlight = 0
type SendCommand = (
  this: Redis,
  command: { name: string; promise: Promise<unknown> },
  ...rest: unknown[]
) => unknown
const send = Redis.prototype.sendCommand as unknown as SendCommand
;(Redis.prototype as unknown as { sendCommand: SendCommand }).sendCommand = function (command, ...rest) {
  if (!countRoundTrips || BLOCKING.has(command.name)) return send.call(this, command, ...rest)
  if (inFlight++ === 0) redisRoundTrips++
  const settled = () => void inFlight--
  command.promise.then(settled, settled)
  return send.call(this, command, ...rest)
}

// OTEL_SDK=on: the OpenTelemetry SDK and @fastify/otel, registered before the app (load/lib/otel-sdk.ts).
if (process.env.OTEL_SDK === 'on') await import('../lib/otel-sdk.ts')
// DIAGNOSTICS_SUBSCRIBER=noop: a subscriber that does nothing on every event of every tracing
// channel, so that each traced operation takes its publishing path (load/diagnostics.ts);
// =count: one that counts the operations started on each channel, reported by GET /__bench/counters.
const subscriber = process.env.DIAGNOSTICS_SUBSCRIBER
const tracedOperations: Record<string, number> = {}
if (subscriber === 'noop' || subscriber === 'count') {
  const noop = () => {}
  for (const name of Object.values(CHANNELS)) {
    tracedOperations[name] = 0
    tracingChannel(name).subscribe({
      start: subscriber === 'count' ? () => void tracedOperations[name]!++ : noop,
      end: noop,
      asyncStart: noop,
      asyncEnd: noop,
      error: noop,
    })
  }
}
const app = await buildApp(loadConfig({ ...process.env, PORT: '0' }))
let transactions = 0
// Requests received, counted here: autocannon drops the connections still waiting when its run
// ends, yet those requests did their work, and per-request figures must divide by what ran.
// Counted on the HTTP server, not in a Fastify hook: a hook would add its own CPU to the chain's,
// which the bare and one-GET routes it is compared with do not pay.
let requests = 0
app.server.prependListener('request', (req: { url?: string }) => {
  if (!req.url?.startsWith('/__bench/counters')) requests++
})
app.db.observe?.({ transaction: () => void transactions++ })
// No rate limit: its reads must cost no Redis round trip, or the count would include them.
app.get('/__bench/counters', { schema: { hide: true }, config: { rateLimits: false } }, async (request) => {
  const { roundTrips } = request.query as { roundTrips?: string }
  if (roundTrips) countRoundTrips = roundTrips === 'on'
  return counters()
})
const counters = () => ({
  dbQueries: app.db.queryCount,
  dbTransactions: transactions,
  redisRoundTrips,
  requests,
  // Whether anything listens on the tracing channels, and (DIAGNOSTICS_SUBSCRIBER=count) what.
  diagnosticsSubscribed: Object.values(CHANNELS).some((name) => tracingChannel(name).hasSubscribers),
  ...(subscriber === 'count' ? { tracedOperations } : {}),
})
await seedDemo(app.db)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)
