import { subscribe } from 'node:diagnostics_channel'
import type { FastifyInstance, RouteOptions } from 'fastify'
import { RouteNotProtectedError } from './errors.ts'

// A route whose config asks for a plugin's protection (`idempotency`, `rateLimits`, `session`,
// `cache`) but is declared where that plugin never sees it (before the plugin, in a sibling
// context, or with no such plugin at all) would run unprotected in silence. So every Fastify
// instance created after this module loads gets a root-level route collector (through Fastify's
// `fastify.initialization` diagnostics channel), and the app refuses to become ready while such a
// route exists, with an error naming the route and the fix.

export type ProtectionKind = 'idempotency' | 'rateLimits' | 'session' | 'cache'

interface Coverage {
  routes: Array<{ route: RouteOptions; instance: FastifyInstance }>
  /** The kinds each route was taken for by a plugin's onRoute hook. */
  covered: WeakMap<RouteOptions, Set<ProtectionKind>>
  /** Contexts whose instance hooks give a kind to every route in them, whenever declared. */
  contexts: Map<ProtectionKind, Set<FastifyInstance>>
  /** Kinds some plugin was registered for, anywhere in the app. */
  registered: Set<ProtectionKind>
}

const kCoverage = Symbol('fastify-redis-gateway.routeCoverage')

const PLUGIN: Record<ProtectionKind, string> = {
  idempotency: 'idempotency',
  rateLimits: 'rate-limit',
  session: 'session',
  cache: 'cache',
}

/**
 * What a route's config asks for. `session` and `cache` are common words, so another library's
 * config of those names is left alone unless a plugin of ours for them is registered in the app.
 */
function asks(route: RouteOptions, kind: ProtectionKind, coverage: Coverage): boolean {
  const value = (route.config as Record<string, unknown> | undefined)?.[kind]
  if (value === undefined || value === false) return false
  return kind === 'idempotency' || kind === 'rateLimits' || coverage.registered.has(kind)
}

function check(coverage: Coverage): void {
  for (const { route, instance } of coverage.routes) {
    for (const kind of Object.keys(PLUGIN) as ProtectionKind[]) {
      if (!asks(route, kind, coverage)) continue
      if (coverage.covered.get(route)?.has(kind)) continue
      if (coverage.contexts.get(kind)?.has(instance)) continue
      const method = [route.method].flat().join(',')
      throw new RouteNotProtectedError(
        `route ${method} ${route.url} has \`config.${kind}\` but no ${PLUGIN[kind]} plugin covers it: register the ${PLUGIN[kind]} plugin before the route, in the same context or a parent of it`,
        method,
        route.url,
      )
    }
  }
}

function install(app: FastifyInstance): void {
  const coverage: Coverage = {
    routes: [],
    covered: new WeakMap(),
    contexts: new Map(),
    registered: new Set(),
  }
  Object.defineProperty(app, kCoverage, { value: coverage })
  app.addHook('onRoute', function collectRoute(this: FastifyInstance, route) {
    coverage.routes.push({ route, instance: this })
  })
  app.addHook('onReady', async () => {
    check(coverage)
    coverage.routes = []
  })
}

subscribe('fastify.initialization', (message) => install((message as { fastify: FastifyInstance }).fastify))

/** The app's coverage record (children see the root's through their prototype), if it has one. */
const coverageOf = (app: FastifyInstance) => (app as unknown as { [kCoverage]?: Coverage })[kCoverage]

/** A plugin of `kind` is registered in this app (anywhere). */
export function pluginRegistered(app: FastifyInstance, kind: ProtectionKind): void {
  coverageOf(app)?.registered.add(kind)
}

/** Called from a plugin's onRoute hook for each route it protects. */
export function routeCovered(app: FastifyInstance, kind: ProtectionKind, route: RouteOptions): void {
  const coverage = coverageOf(app)
  if (!coverage) return
  const kinds = coverage.covered.get(route) ?? new Set()
  coverage.covered.set(route, kinds.add(kind))
}

/** A plugin whose instance hooks protect every route of its context, declared before it or after. */
export function contextCovered(app: FastifyInstance, kind: ProtectionKind): void {
  const coverage = coverageOf(app)
  if (!coverage) return
  const contexts = coverage.contexts.get(kind) ?? new Set()
  coverage.contexts.set(kind, contexts.add(app))
}
