import type { RouteOptions } from 'fastify'

type RouteHookName =
  | 'onRequest'
  | 'preParsing'
  | 'preValidation'
  | 'preHandler'
  | 'preSerialization'
  | 'onSend'
  | 'onResponse'
  | 'onError'

/** One handler of a route's hooks of `name` (a route holds one or an array). */
type RouteHook<N extends RouteHookName> = Exclude<NonNullable<RouteOptions[N]>, readonly unknown[]>

/**
 * Adds `hook` to a route's own hooks of `name`, from a plugin's onRoute hook: after the ones the
 * route has, or before them with `first` (a hook whose work the route's own hooks should overlap).
 * The route's array is replaced, never changed in place: routes may share the array they were given.
 */
export function addRouteHook<N extends RouteHookName>(
  route: RouteOptions,
  name: N,
  hook: RouteHook<N>,
  position: 'last' | 'first' = 'last',
): void {
  const existing = (route[name] === undefined ? [] : [route[name]].flat()) as RouteHook<N>[]
  route[name] = (position === 'first' ? [hook, ...existing] : [...existing, hook]) as RouteOptions[N]
}

/** A route as messages name it: `GET /accounts/:id`, `GET,HEAD /` for several methods. */
export const routeName = (route: RouteOptions) => `${[route.method].flat().join(',')} ${route.url}`
