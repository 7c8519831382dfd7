// An app that imports only the compat entry, without @fastify/rate-limit in its program:
// test/compat/typed.test.ts type-checks it alone. `config.rateLimit` type-checks as it did with
// upstream's types, where route options are typed apart from the route (RouteShorthandOptions)
// and where a hook reads the route's config.
import Fastify, { type RouteShorthandOptions } from 'fastify'
import rateLimit, { type RateLimitDecorators } from '../../../src/compat/fastify-rate-limit.ts'
// The suite's other plugins declare route configs of their own (`rateLimits`, `session`, ...), so
// a route config none declares is an excess property.
import { type RateLimitPolicy, session } from '../../../src/index.ts'

declare module 'fastify' {
  interface FastifyInstance extends RateLimitDecorators {}
}

const app = Fastify()
await app.register(rateLimit, { max: 100, timeWindow: '1 minute', connectTimeoutMs: 500 })
const weekly: RouteShorthandOptions = {
  config: { rateLimit: { max: 3, timeWindow: '1 week', groupId: 'reports' } },
}
const open: RouteShorthandOptions = { config: { rateLimit: false } }
// @ts-expect-error `max` is a number or a function, as upstream types it
const wrong: RouteShorthandOptions = { config: { rateLimit: { max: 'three' } } }
app.get('/weekly', weekly, async () => 'ok')
app.get('/open', open, async () => 'ok')
app.get('/inline', { config: { rateLimit: { max: 3, timeWindow: 60_000 } } }, async () => 'ok')
app.get('/hooked', { onRequest: app.rateLimit({ max: 1 }) }, async () => 'ok')
app.addHook('onRequest', async (request) => {
  const config = request.routeOptions.config.rateLimit
  if (config) request.log.info({ max: config.max }, 'limited route')
})

const policy: RateLimitPolicy = { name: 'native', algorithm: 'fixed-window', limit: 1, windowMs: 1000 }

export { app, policy, session, wrong }
