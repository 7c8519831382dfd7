import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

// The library (src/index.ts, src/plugins, src/primitives, src/lua, src/compat) stands without the
// demo, each plugin on its own folder plus the common one, the primitives on their own folder, lua
// and the shared plugin helpers, each compat module (another package's API on one of our plugins)
// on that plugin, the common one and lua, and the demo reaches the library only through its public
// entry.
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
  path.startsWith('lua/') ||
  path.startsWith('compat/')

/** Each compat module and the one plugin it is built on. */
const COMPAT_PLUGINS: Record<string, string> = {
  'compat/fastify-rate-limit.ts': 'rate-limit',
}

/** What `file` (relative to src/) may import, or null when it may import anything. */
function allowed(file: string): ((target: string) => boolean) | null {
  const plugin = /^plugins\/([^/]+)\//.exec(file)?.[1]
  if (plugin === 'common') return (t) => t.startsWith('plugins/common/') || t.startsWith('lua/')
  if (plugin)
    return (t) =>
      t.startsWith(`plugins/${plugin}/`) || t.startsWith('plugins/common/') || t.startsWith('lua/')
  if (file.startsWith('primitives/'))
    return (t) => t.startsWith('primitives/') || t.startsWith('lua/') || t.startsWith('plugins/common/')
  if (file.startsWith('lua/')) return (t) => t.startsWith('lua/')
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
      t.startsWith('lua/')
  }
  if (file === 'index.ts') return (t) => isLibrary(t)
  // The demo: anything of its own, and of the library only the public entry.
  return (t) => !isLibrary(t) || t === 'index.ts'
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

test('the check catches a plugin importing the demo or another plugin, and the demo reaching inside a plugin', () => {
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
  assert.deepEqual(probe('lua/index.ts', "export { y } from '../db/database.ts'"), ['db/database.ts'])
  assert.deepEqual(
    probe('ledger/ledger.ts', "import { keyMismatch } from '../plugins/idempotency/problems.ts'"),
    ['plugins/idempotency/problems.ts'],
  )
  assert.deepEqual(probe('ledger/ledger.ts', "import { idempotencyKeyMismatch } from '../index.ts'"), [])
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
  assert.deepEqual(probe('primitives/delayed-queue.ts', "import { runScript } from '../lua/index.ts'"), [])
  assert.deepEqual(
    probe('primitives/lock.ts', "import type { RedisClient } from '../plugins/common/redis.ts'"),
    [],
  )
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
  assert.deepEqual(probe(compat, "import { bootPluginRedis } from '../plugins/common/redis.ts'"), [])
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
