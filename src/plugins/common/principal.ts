import type { FastifyInstance, FastifyRequest } from 'fastify'
import { option } from './options.ts'

/** Who the caller is (a customer id, a user name); null or undefined for an anonymous request. */
export type PrincipalFunction = (request: FastifyRequest) => string | null | undefined

declare module 'fastify' {
  interface FastifyInstance {
    /** Set by this suite's session plugin: the principal of the request's session, if any. */
    sessionPrincipal: PrincipalFunction
  }
}

const nobody: PrincipalFunction = () => null

/**
 * The principal function a plugin uses: its own `principal` option, else this suite's session
 * plugin when it is registered (asked once the app is ready, so registration order does not matter),
 * else nobody. Call it from onReady or later.
 */
export function resolvePrincipal(
  app: FastifyInstance,
  option: PrincipalFunction | undefined,
): PrincipalFunction {
  if (option) return option
  return app.hasDecorator('sessionPrincipal') ? app.sessionPrincipal : nobody
}

/**
 * A plugin's `principal` option, declared: `principal: principalOption('who the caller is, for ...')`.
 * Its setting goes to the plugin context (`pluginContext(app, name, { principal })`).
 */
export const principalOption = (doc: string) =>
  option.function<PrincipalFunction>({ type: 'a function of the request returning who the caller is', doc })
