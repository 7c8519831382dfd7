// One instance for load/accuracy.ts: the rate-limit plugin on its own ioredis client with ONE
// policy, configured from env, every request on one key. GET /leases answers `app.rateLimiter.leases()`. GET /hit?k=<key> consumes one unit of
// <key> (one key for a whole run) with `app.rateLimiter.consume` (the engine path a route's hook
// takes: over-limit cache, then a lease or the exact script call) and answers 200 or 429 with:
//   x-window-end  this process's Date.now() + the decision's resetMs: when the window the unit was
//                 counted in ends (a fixed window's lease: its own end), to group admissions by window
//   x-decided-at  this process's Date.now() when the decision was made
//   x-reset-ms    the decision's resetMs (0 on an admission: its window had ended, a defect)
// (the RateLimit header's `t` is in whole seconds: too coarse for 1 s windows).
// Env: REDIS_URL, ACC_KEY_PREFIX (shared by the instances of one run), ACC_ALGORITHM (fixed-window,
// token-bucket, gcra), ACC_LIMIT, ACC_WINDOW_MS (the token bucket refills limit per window),
// ACC_SYNC ('off' for exact, or '<intervalMs>:<batch>').
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import rateLimit, { type RateLimitPolicy } from '../../src/plugins/rate-limit/index.ts'

const algorithm = process.env.ACC_ALGORITHM ?? 'fixed-window'
const limit = Number(process.env.ACC_LIMIT ?? 200)
const windowMs = Number(process.env.ACC_WINDOW_MS ?? 1000)
const syncSpec = process.env.ACC_SYNC ?? 'off'
const sync =
  syncSpec === 'off'
    ? {}
    : {
        sync: {
          intervalMs: Number(syncSpec.split(':')[0]),
          batch: Number(syncSpec.split(':')[1]),
        },
      }

const policy: RateLimitPolicy =
  algorithm === 'token-bucket'
    ? { name: 'acc', algorithm, limit, refillPerSecond: limit / (windowMs / 1000), ...sync }
    : algorithm === 'gcra'
      ? { name: 'acc', algorithm, limit, windowMs, ...sync }
      : { name: 'acc', algorithm: 'fixed-window', limit, windowMs, ...sync }

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
const app = Fastify({ logger: false })
await app.register(rateLimit, {
  redis,
  keyPrefix: process.env.ACC_KEY_PREFIX ?? 'acc:',
  namedPolicies: [policy],
})
app.get<{ Querystring: { k?: string } }>('/hit', async (request, reply) => {
  const result = await app.rateLimiter.consume('acc', request.query.k ?? 'k')
  const now = Date.now()
  reply.header('x-window-end', String(now + result.resetMs))
  reply.header('x-decided-at', String(now))
  reply.header('x-reset-ms', String(result.resetMs))
  return reply.code(result.allowed ? 200 : 429).send(result.degraded ? 'degraded' : '')
})
// What this instance holds and how many instances it counts (the driver waits for every heartbeat).
app.get('/leases', async () => app.rateLimiter.leases())
await app.ready()
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () =>
  app
    .close()
    .then(() => redis.quit())
    .finally(() => process.exit(0)),
)
console.log(`LISTENING ${url}`)
