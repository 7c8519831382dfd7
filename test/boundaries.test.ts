import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

// The library (src/index.ts, src/plugins, src/primitives, src/redis, src/compat) stands without the
// demo. src/redis is its floor (clients, server checks, command bounds, batching, scripts, keys,
// errors) and imports nothing above it. Each plugin stands on its own folder, the common one and the
// floor; the primitives on their own folder, the common one and the floor; each compat module
// (another package's API on one of our plugins) on that plugin, the common one and the floor. The
// demo imports the library only by the package's name (`fastify-redis-gateway`), as an application
// would: never by a relative path, not even to src/index.ts.
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const src = join(root, 'src')

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return sourceFiles(path)
    return entry.name.endsWith('.ts') ? [path] : []
  })
}

/** Every relative module a file imports or re-exports, resolved to a path under src/. */
export function relativeImports(file: string, text = readFileSync(file, 'utf8')): string[] {
  const specifiers = [
    ...text.matchAll(/(?:^|\s)(?:import|export)\s[^'"]*?from\s+'(\.[^']+)'|import\s+'(\.[^']+)'/g),
  ]
  return specifiers.map((m) => relative(src, resolve(dirname(file), (m[1] ?? m[2])!)))
}

const isLibrary = (path: string) =>
  path === 'index.ts' ||
  path.startsWith('plugins/') ||
  path.startsWith('primitives/') ||
  path.startsWith('redis/') ||
  path.startsWith('compat/')

/** Each compat module and the one plugin it is built on. */
const COMPAT_PLUGINS: Record<string, string> = {
  'compat/fastify-rate-limit.ts': 'rate-limit',
}

/** What `file` (relative to src/) may import, or null when it may import anything. */
function allowed(file: string): ((target: string) => boolean) | null {
  const plugin = /^plugins\/([^/]+)\//.exec(file)?.[1]
  if (plugin === 'common') return (t) => t.startsWith('plugins/common/') || t.startsWith('redis/')
  if (plugin)
    return (t) =>
      t.startsWith(`plugins/${plugin}/`) || t.startsWith('plugins/common/') || t.startsWith('redis/')
  if (file.startsWith('primitives/'))
    return (t) => t.startsWith('primitives/') || t.startsWith('redis/') || t.startsWith('plugins/common/')
  if (file.startsWith('redis/')) return (t) => t.startsWith('redis/')
  // A compat module stands on the plugin whose API it translates: src/compat/<plugin>-*.ts or a
  // module named after another package, mapped below.
  if (file.startsWith('compat/')) {
    // A module's parts live in the folder of its name: compat/<module>.ts and compat/<module>/*.ts.
    const module = /^compat\/([^/]+?)(?:\.ts$|\/)/.exec(file)?.[1] ?? ''
    const plugin = COMPAT_PLUGINS[`compat/${module}.ts`]
    return (t) =>
      (plugin !== undefined && t.startsWith(`plugins/${plugin}/`)) ||
      (plugin !== undefined && t.startsWith(`compat/${module}/`)) ||
      t.startsWith('plugins/common/') ||
      t.startsWith('redis/')
  }
  if (file === 'index.ts') return (t) => isLibrary(t)
  // The demo: anything of its own by path; the library only by the package's name.
  return (t) => !isLibrary(t)
}

export function violations(files: string[]): string[] {
  const found: string[] = []
  for (const path of files) {
    const file = relative(src, path)
    const may = allowed(file)
    for (const target of relativeImports(path)) {
      if (target.startsWith('..')) found.push(`${file} imports ${target}, outside src/`)
      else if (may && !may(target)) found.push(`${file} imports ${target}`)
    }
  }
  return found
}

test('the library imports nothing of the demo, each plugin only its folder, shared and lua, each primitive only primitives, shared and lua', () => {
  assert.deepEqual(violations(sourceFiles(src)), [])
})

test('the check catches a plugin importing the demo or another plugin, and the demo importing the library by path', () => {
  const probe = (file: string, line: string) => {
    const path = join(src, file)
    const found: string[] = []
    for (const target of relativeImports(path, line)) {
      const may = allowed(file)
      if (may && !may(target)) found.push(target)
    }
    return found
  }
  assert.deepEqual(probe('plugins/rate-limit/index.ts', "import { buildApp } from '../../app.ts'"), [
    'app.ts',
  ])
  assert.deepEqual(probe('plugins/cache/index.ts', "import { x } from '../redis/index.ts'"), [
    'plugins/redis/index.ts',
  ])
  assert.deepEqual(probe('plugins/common/problem.ts', "import type { Config } from '../../config.ts'"), [
    'config.ts',
  ])
  assert.deepEqual(probe('redis/scripts.ts', "export { y } from '../db/database.ts'"), ['db/database.ts'])
  assert.deepEqual(probe('redis/client.ts', "import { x } from '../plugins/common/errors.ts'"), [
    'plugins/common/errors.ts',
  ])
  assert.deepEqual(
    probe('ledger/ledger.ts', "import { keyMismatch } from '../plugins/idempotency/problems.ts'"),
    ['plugins/idempotency/problems.ts'],
  )
  assert.deepEqual(probe('ledger/ledger.ts', "import { idempotencyKeyMismatch } from '../index.ts'"), [
    'index.ts',
  ])
  assert.deepEqual(probe('app.ts', "import { session } from './index.ts'"), ['index.ts'])
  assert.deepEqual(
    probe('ledger/ledger.ts', "import { idempotencyKeyMismatch } from 'fastify-redis-gateway'"),
    [],
  )
  assert.deepEqual(probe('plugins/session/index.ts', "import '../common/principal.ts'"), [])
})

test('the check catches a primitive importing the demo or a plugin, and the demo reaching inside a primitive', () => {
  const probe = (file: string, line: string) =>
    relativeImports(join(src, file), line).filter((target) => {
      const may = allowed(file)
      return may && !may(target)
    })
  assert.deepEqual(probe('primitives/lock.ts', "import { buildApp } from '../app.ts'"), ['app.ts'])
  assert.deepEqual(
    probe('primitives/delayed-queue.ts', "import type { Database } from '../db/database.ts'"),
    ['db/database.ts'],
  )
  assert.deepEqual(probe('primitives/lock.ts', "import { keyBy } from '../plugins/rate-limit/index.ts'"), [
    'plugins/rate-limit/index.ts',
  ])
  assert.deepEqual(probe('ledger/ledger.ts', "import { createLock } from '../primitives/lock.ts'"), [
    'primitives/lock.ts',
  ])
  assert.deepEqual(
    probe('primitives/delayed-queue.ts', "import { callScript } from '../redis/scripts.ts'"),
    [],
  )
  assert.deepEqual(probe('primitives/lock.ts', "import type { RedisClient } from '../redis/client.ts'"), [])
  assert.deepEqual(probe('primitives/delayed-queue.ts', "import { createLock } from './lock.ts'"), [])
  assert.deepEqual(probe('index.ts', "export { createLock } from './primitives/lock.ts'"), [])
})

test('the check lets a compat module use its plugin, common and lua only, and keeps the demo out of it', () => {
  const probe = (file: string, line: string) =>
    relativeImports(join(src, file), line).filter((target) => {
      const may = allowed(file)
      return may && !may(target)
    })
  const compat = 'compat/fastify-rate-limit.ts'
  assert.deepEqual(probe(compat, "import { RateLimitEngine } from '../plugins/rate-limit/engine.ts'"), [])
  assert.deepEqual(probe(compat, "import { bootPluginRedis } from '../redis/server.ts'"), [])
  assert.deepEqual(probe(compat, "import { check } from './fastify-rate-limit/params.ts'"), [])
  assert.deepEqual(
    probe(
      'compat/fastify-rate-limit/params.ts',
      "import { parseDuration } from '../../plugins/rate-limit/duration.ts'",
    ),
    [],
  )
  assert.deepEqual(
    probe('compat/fastify-rate-limit/params.ts', "import { x } from '../../plugins/cache/index.ts'"),
    ['plugins/cache/index.ts'],
  )
  assert.deepEqual(probe(compat, "import { x } from '../plugins/cache/index.ts'"), ['plugins/cache/index.ts'])
  assert.deepEqual(probe(compat, "import { buildApp } from '../app.ts'"), ['app.ts'])
  assert.deepEqual(probe(compat, "import { createLock } from '../primitives/lock.ts'"), [
    'primitives/lock.ts',
  ])
  assert.deepEqual(probe('compat/other.ts', "import { x } from '../plugins/rate-limit/index.ts'"), [
    'plugins/rate-limit/index.ts',
  ])
  assert.deepEqual(probe('app.ts', "import plugin from './compat/fastify-rate-limit.ts'"), [
    'compat/fastify-rate-limit.ts',
  ])
})

// The demo's layers, from the top: a file may import its own layer and those below it, never one
// above. The process entry starts the app; the app composes the plugins, the services and the
// routes; the HTTP layer (routes, and the one mapping of domain errors to problems) consumes the
// domain modules; those use the foundation (Postgres, configuration, the domain error, the
// embedded Redis for development). The library is below them all (checked above).
const DEMO_LAYERS: ReadonlyArray<{ name: string; holds: (file: string) => boolean }> = [
  {
    name: 'process',
    holds: (f) => f === 'server.ts' || f === 'shutdown.ts' || f === 'limits-cli.ts' || f === 'otel-export.ts',
  },
  { name: 'app', holds: (f) => f === 'app.ts' || f === 'rate-limits.ts' },
  { name: 'http', holds: (f) => f.startsWith('routes/') || f === 'errors.ts' },
  { name: 'domain', holds: (f) => domainModule(f) !== undefined },
  {
    name: 'foundation',
    holds: (f) =>
      f.startsWith('db/') || f.startsWith('embedded/') || f === 'config.ts' || f === 'domain-error.ts',
  },
]

/** The domain modules: each a folder of src/, the services the routes consume. */
const DOMAIN_MODULES = ['ledger', 'scheduler', 'events', 'campaigns', 'public-accounts']

function domainModule(file: string): string | undefined {
  const folder = file.split('/')[0]!
  return file.includes('/') && DOMAIN_MODULES.includes(folder) ? folder : undefined
}

const layerOf = (file: string) => DEMO_LAYERS.findIndex((layer) => layer.holds(file))

/** Demo files in no layer, and imports from a lower layer to a higher one. */
export function upwardImports(imports: ReadonlyArray<readonly [file: string, target: string]>): string[] {
  const found = new Set<string>()
  for (const [file, target] of imports) {
    if (isLibrary(file) || isLibrary(target) || target.startsWith('..')) continue
    const from = layerOf(file)
    const to = layerOf(target)
    if (from < 0) found.add(`${file} belongs to no layer`)
    else if (to < 0) found.add(`${target} belongs to no layer`)
    else if (to < from)
      found.add(`${file} (${DEMO_LAYERS[from]!.name}) imports ${target} (${DEMO_LAYERS[to]!.name})`)
  }
  return [...found]
}

/** Pairs of domain modules that reach each other through their imports (a cycle), as "a <-> b". */
export function domainCycles(imports: ReadonlyArray<readonly [file: string, target: string]>): string[] {
  const edges = new Map<string, Set<string>>(DOMAIN_MODULES.map((m) => [m, new Set()]))
  for (const [file, target] of imports) {
    const from = domainModule(file)
    const to = domainModule(target)
    if (from && to && from !== to) edges.get(from)!.add(to)
  }
  const reachable = (start: string) => {
    const seen = new Set<string>()
    const visit = (module: string) => {
      for (const next of edges.get(module)!) {
        if (seen.has(next)) continue
        seen.add(next)
        visit(next)
      }
    }
    visit(start)
    return seen
  }
  const reach = new Map(DOMAIN_MODULES.map((m) => [m, reachable(m)]))
  return DOMAIN_MODULES.flatMap((a, i) =>
    DOMAIN_MODULES.slice(i + 1)
      .filter((b) => reach.get(a)!.has(b) && reach.get(b)!.has(a))
      .map((b) => `${a} <-> ${b}`),
  )
}

/** Every import of the demo and library source, as [importer, imported] relative to src/. */
const sourceImports = () =>
  sourceFiles(src).flatMap((path) =>
    relativeImports(path).map((target) => [relative(src, path), target] as const),
  )

test('the demo imports only downwards: process, app, http, domain modules, foundation', () => {
  assert.deepEqual(upwardImports(sourceImports()), [])
})

test('no two domain modules import each other, directly or through others', () => {
  assert.deepEqual(domainCycles(sourceImports()), [])
})

test('the layer check catches an import up the layers, a file in no layer and a cycle of domain modules', () => {
  const imports = (file: string, line: string) =>
    relativeImports(join(src, file), line).map((target) => [file, target] as const)
  assert.deepEqual(
    upwardImports(imports('scheduler/service.ts', "import routes from '../routes/accounts.ts'")),
    ['scheduler/service.ts (domain) imports routes/accounts.ts (http)'],
  )
  assert.deepEqual(upwardImports(imports('db/database.ts', "import { HttpProblem } from '../errors.ts'")), [
    'db/database.ts (foundation) imports errors.ts (http)',
  ])
  assert.deepEqual(upwardImports(imports('routes/transfers.ts', "import { buildApp } from '../app.ts'")), [
    'routes/transfers.ts (http) imports app.ts (app)',
  ])
  assert.deepEqual(upwardImports(imports('wallet/store.ts', "import { x } from '../db/database.ts'")), [
    'wallet/store.ts belongs to no layer',
  ])
  assert.deepEqual(
    upwardImports(imports('routes/transfers.ts', "import { x } from '../ledger/ledger.ts'")),
    [],
  )
  assert.deepEqual(upwardImports(imports('ledger/ledger.ts', "import { x } from '../index.ts'")), [])
  assert.deepEqual(
    domainCycles([
      ...imports('events/plugin.ts', "import { LEADERBOARD_GROUP } from '../campaigns/leaderboard.ts'"),
      ...imports('campaigns/stats.ts', "import { x } from '../events/consumer.ts'"),
    ]),
    ['events <-> campaigns'],
  )
  assert.deepEqual(
    domainCycles([
      ...imports('scheduler/service.ts', "import { x } from '../ledger/ledger.ts'"),
      ...imports('ledger/ledger.ts', "import { x } from '../events/consumer.ts'"),
      ...imports('events/plugin.ts', "import { x } from '../scheduler/store.ts'"),
    ]),
    ['ledger <-> scheduler', 'ledger <-> events', 'scheduler <-> events'],
  )
  assert.deepEqual(
    domainCycles(imports('scheduler/service.ts', "import { x } from '../ledger/ledger.ts'")),
    [],
  )
})

/**
 * The circles of imports inside a folder of src/: the strongly connected components (Tarjan's
 * algorithm) of the graph of imports between files of one folder, each as its files, sorted. A
 * file that imports itself is a circle of one. A folder's parts import one way, so that each can
 * be read, tested and changed from the bottom up; imports across folders are the rules above's.
 */
export function importCircles(imports: ReadonlyArray<readonly [file: string, target: string]>): string[][] {
  const edges = new Map<string, string[]>()
  for (const [file, target] of imports) {
    if (dirname(file) !== dirname(target)) continue
    edges.set(file, [...(edges.get(file) ?? []), target])
    if (!edges.has(target)) edges.set(target, [])
  }
  const index = new Map<string, number>()
  const lowest = new Map<string, number>()
  const stack: string[] = []
  const onStack = new Set<string>()
  const circles: string[][] = []
  const visit = (file: string) => {
    index.set(file, index.size)
    lowest.set(file, index.get(file)!)
    stack.push(file)
    onStack.add(file)
    for (const target of edges.get(file)!) {
      if (!index.has(target)) {
        visit(target)
        lowest.set(file, Math.min(lowest.get(file)!, lowest.get(target)!))
      } else if (onStack.has(target)) lowest.set(file, Math.min(lowest.get(file)!, index.get(target)!))
    }
    if (lowest.get(file) !== index.get(file)) return
    const component: string[] = []
    let member: string
    do {
      member = stack.pop()!
      onStack.delete(member)
      component.push(member)
    } while (member !== file)
    if (component.length > 1 || edges.get(file)!.includes(file)) circles.push(component.sort())
  }
  for (const file of [...edges.keys()].sort()) if (!index.has(file)) visit(file)
  return circles.sort((a, b) => a[0]!.localeCompare(b[0]!))
}

test('no folder of src/ has a circle of imports', () => {
  const circles = importCircles(sourceImports()).map((files) => files.join(', '))
  assert.deepEqual(circles, [], `circles of imports (each file reaches the others):\n${circles.join('\n')}`)
})

test('the circle check finds each circle inside a folder with its files, and nothing else', () => {
  const imports = (file: string, line: string) =>
    relativeImports(join(src, file), line).map((target) => [file, target] as const)
  assert.deepEqual(
    importCircles([
      // A circle of three, with a file outside it that only imports into it.
      ...imports('plugins/rate-limit/policy.ts', "import type { Decision } from './outcome.ts'"),
      ...imports('plugins/rate-limit/outcome.ts', "import { x } from './engine.ts'"),
      ...imports('plugins/rate-limit/engine.ts', "import { normalizePolicy } from './policy.ts'"),
      ...imports('plugins/rate-limit/index.ts', "import { RateLimitEngine } from './engine.ts'"),
      // A circle of two in another folder, and one file importing itself.
      ...imports('ledger/ledger.ts', "import { x } from './transfers.ts'"),
      ...imports('ledger/transfers.ts', "export type { Y } from './ledger.ts'"),
      ...imports('scheduler/store.ts', "import { x } from './store.ts'"),
    ]),
    [
      ['ledger/ledger.ts', 'ledger/transfers.ts'],
      ['plugins/rate-limit/engine.ts', 'plugins/rate-limit/outcome.ts', 'plugins/rate-limit/policy.ts'],
      ['scheduler/store.ts'],
    ],
  )
  // Imports that go one way, and a circle only through another folder (the layer rules' concern).
  assert.deepEqual(
    importCircles([
      ...imports('plugins/rate-limit/index.ts', "import { x } from './engine.ts'"),
      ...imports('plugins/rate-limit/engine.ts', "import type { Policy } from './types.ts'"),
      ...imports('plugins/rate-limit/index.ts', "import type { Policy } from './types.ts'"),
      ...imports('compat/fastify-rate-limit.ts', "import { check } from './fastify-rate-limit/params.ts'"),
      ...imports('compat/fastify-rate-limit/params.ts', "import { x } from '../fastify-rate-limit.ts'"),
    ]),
    [],
  )
})

/** Past this a file holds more than one responsibility: split it by what each part does. */
const MAX_SOURCE_LINES = 450

test(`no source file is over ${MAX_SOURCE_LINES} lines`, () => {
  const long = sourceFiles(src)
    .map((path) => ({ file: relative(src, path), lines: readFileSync(path, 'utf8').split('\n').length }))
    .filter(({ lines }) => lines > MAX_SOURCE_LINES)
  assert.deepEqual(long, [])
})
