import assert from 'node:assert/strict'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

// The library's suites need Redis alone: they build plain Fastify apps with the plugins under test.
// Only the demo's suites (test/demo, test/model, test/openapi) and their helpers (test/helpers)
// may load the demo gateway, which needs Postgres. A library suite reaching the demo through any
// chain of imports (a helper, a fixture, a load script) fails here, with the chain that does.
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const test_ = join(root, 'test')

/** Folders of test/ whose files may load the demo. */
const DEMO_SUITES = ['demo', 'model', 'openapi', 'helpers']

/** Parts of src/ that are not the demo: the library and the redis-server launcher the suites use. */
const NOT_DEMO = [
  'src/index.ts',
  'src/plugins/',
  'src/primitives/',
  'src/redis/',
  'src/compat/',
  'src/lua/',
  'src/embedded/',
]

/** Packages that only the demo's database needs. */
const DEMO_PACKAGES = ['pg', '@electric-sql/pglite']

function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return entry.name === 'node_modules' ? [] : tsFiles(path)
    return entry.name.endsWith('.ts') ? [path] : []
  })
}

/** What a file imports, statically or dynamically: relative modules resolved to paths under the root, packages by name. */
export function importsOf(file: string, text = readFileSync(join(root, file), 'utf8')): string[] {
  const specifiers = [
    ...text.matchAll(/(?:^|\s)(?:import|export)\s[^'"]*?from\s+'([^']+)'|import\s*\(?\s*'([^']+)'/g),
  ].map((m) => (m[1] ?? m[2])!)
  return specifiers.map((s) => (s.startsWith('.') ? relative(root, resolve(root, dirname(file), s)) : s))
}

const isDemo = (target: string) =>
  DEMO_PACKAGES.some((p) => target === p || target.startsWith(`${p}/`)) ||
  (target.startsWith('src/') && !NOT_DEMO.some((part) => target.startsWith(part)))

/**
 * For each library suite file that reaches the demo, the chain of imports that does, as
 * "a -> b -> demo". `importsOf` gives a file's imports (paths relative to the root, or packages).
 */
export function demoReached(files: string[], imports: (file: string) => string[]): string[] {
  const found: string[] = []
  for (const start of files) {
    const via = new Map<string, string>([[start, '']])
    const queue = [start]
    let reached: string | undefined
    while (queue.length > 0 && reached === undefined) {
      const file = queue.shift()!
      for (const target of imports(file)) {
        if (via.has(target)) continue
        via.set(target, file)
        if (isDemo(target)) {
          reached = target
          break
        }
        if (target.endsWith('.ts') && !target.startsWith('..')) queue.push(target)
      }
    }
    if (reached === undefined) continue
    const chain = [reached]
    for (let at = via.get(reached)!; at !== ''; at = via.get(at)!) chain.unshift(at)
    found.push(chain.join(' -> '))
  }
  return found
}

const librarySuites = () =>
  tsFiles(test_)
    .map((path) => relative(root, path))
    .filter((file) => !DEMO_SUITES.includes(file.split('/')[1]!))

const imports = (file: string) => (existsSync(join(root, file)) ? importsOf(file) : [])

test('no library suite loads the demo gateway or its database, through any chain of imports', () => {
  assert.deepEqual(demoReached(librarySuites(), imports), [])
})

test('the check follows helpers and fixtures to the demo, and lets the library and Redis helpers through', () => {
  const graph: Record<string, string> = {
    'test/plugins/cache/a.test.ts': "import { buildTestApp } from '../../helpers/gateway.ts'",
    'test/helpers/gateway.ts': "import { buildApp } from '../../src/app.ts'",
    'test/plugins/session/b.test.ts': "import x from '../../../load/servers/c.ts'",
    'load/servers/c.ts': "import pg from 'pg'",
    'test/plugins/idempotency/c.test.ts': "const { x } = await import('../../../src/ledger/ledger.ts')",
    'test/plugins/rate-limit/d.test.ts': [
      "import rateLimit from '../../../src/plugins/rate-limit/index.ts'",
      "import { uniquePrefix } from '../../helpers/index.ts'",
      "import { startRedisServer } from '../../../src/embedded/redis-server.ts'",
      "import Fastify from 'fastify'",
    ].join('\n'),
    'test/helpers/index.ts': "import { connectRedis } from '../../src/redis/server.ts'",
  }
  const probe = (file: string) => (graph[file] ? importsOf(file, graph[file]) : [])
  assert.deepEqual(
    demoReached(
      [
        'test/plugins/cache/a.test.ts',
        'test/plugins/session/b.test.ts',
        'test/plugins/idempotency/c.test.ts',
        'test/plugins/rate-limit/d.test.ts',
      ],
      probe,
    ),
    [
      'test/plugins/cache/a.test.ts -> test/helpers/gateway.ts -> src/app.ts',
      'test/plugins/session/b.test.ts -> load/servers/c.ts -> pg',
      'test/plugins/idempotency/c.test.ts -> src/ledger/ledger.ts',
    ],
  )
})

test('every test file a package.json script names exists', () => {
  const { scripts } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
    scripts: Record<string, string>
  }
  const missing = Object.entries(scripts).flatMap(([name, command]) =>
    (command.match(/test\/[^\s"'*]+\.test\.ts/g) ?? [])
      .filter((file) => !existsSync(join(root, file)))
      .map((file) => `${name}: ${file}`),
  )
  assert.deepEqual(missing, [])
})
