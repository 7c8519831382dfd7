import Fastify from 'fastify'
import session, { requireSession, type Session } from '../../../src/plugins/session/index.ts'

// Type-level test, checked by `npx tsc --noEmit` under the root tsconfig's strict settings (never
// run): the README's route that reads a required session compiles as written there.

export async function readmeSnippet(redis: import('ioredis').Redis, secret: string) {
  const app = Fastify()
  await app.register(session, { redis, secrets: [secret] })
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    user: requireSession(request).principal,
  }))
  app.get('/prefs', { config: { session: 'required' } }, async (request) => {
    const current: Session = requireSession(request)
    current.set('theme', 'dark')
    return { theme: current.get<string>('theme') }
  })
  app.get('/who', async (request) => ({
    // `request.session` stays nullable: a route without `session: 'required'` may have none.
    // @ts-expect-error possibly null
    user: request.session.principal,
  }))
  return app
}
