// A gateway-like instance for load/session-revocation.ts: the session plugin (its L1 on, as by
// default) on its own ioredis client, REDIS_URL and SESSION_KEY_PREFIX shared by every instance.
// POST /login starts a session, GET /me answers 200 with it and 401 without, POST /logout ends it.
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import sessionPlugin from '../../src/plugins/session/index.ts'

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
const app = Fastify({ logger: false })
app.addHook('onClose', async () => void (await redis.quit()))
await app.register(sessionPlugin, {
  redis,
  secrets: ['session-revocation-benchmark-secret-0123456789'],
  keyPrefix: process.env.SESSION_KEY_PREFIX ?? 'bench:sess:',
})
app.post<{ Body: { user: string } }>('/login', async (request, reply) => {
  await reply.regenerateSession(request.body.user)
  return { ok: true }
})
app.get('/me', { config: { session: 'required' } }, async (request) => ({
  principal: request.session!.principal,
}))
app.post('/logout', async (_request, reply) => {
  await reply.destroySession()
  return reply.code(204).send()
})
await app.ready()
await app.sessions.l1!.whenSubscribed()
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)
