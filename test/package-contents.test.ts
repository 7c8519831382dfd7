import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

// The package ships the library alone: its build, README, LICENSE and the library's pages (the
// Markdown files directly in docs/). The demo's pages live in docs/demo/ and its sources beside the
// library's in src/; neither may reach the tarball.
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')

/** The library's sources under src/, as test/boundaries.test.ts draws them; the rest is the demo. */
const isLibrarySource = (path: string) =>
  path === 'index.ts' || /^(plugins|primitives|redis|compat|lua)\//.test(path)

/** What `npm pack` would put in the tarball (no build: dist/ is listed only if it was built). */
function packedFiles(): string[] {
  const output = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: root,
    encoding: 'utf8',
    env: { ...process.env, npm_config_update_notifier: 'false' },
  })
  const [pack] = JSON.parse(output) as Array<{ files: Array<{ path: string }> }>
  return pack!.files.map((file) => file.path)
}

test('the tarball holds every library page and no page, request file or source of the demo', () => {
  const files = packedFiles()
  const libraryPages = readdirSync(join(root, 'docs'), { withFileTypes: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith('.md'))
    .map((entry) => `docs/${entry.name}`)
  assert.ok(libraryPages.includes('docs/rate-limit.md'), 'the library pages are found')
  assert.deepEqual(
    files.filter((file) => file.startsWith('docs/')).sort(),
    libraryPages.sort(),
    'docs/ in the tarball: exactly the library pages',
  )
  assert.deepEqual(
    files.filter((file) => file.startsWith('src/')),
    [],
    'no source file: the tarball holds the build',
  )
  // A build compiled from the demo would show as dist/app.js, dist/routes/..., dist/ledger/...
  const demoBuilds = files
    .filter((file) => file.startsWith('dist/'))
    .filter((file) => !isLibrarySource(file.slice('dist/'.length).replace(/\.(js|d\.ts)(\.map)?$/, '.ts')))
  assert.deepEqual(demoBuilds, [], 'no build of a demo source')
})

test('the build compiles the library alone', () => {
  const listed = execFileSync(
    process.execPath,
    [join(root, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json', '--listFilesOnly'],
    { cwd: root, encoding: 'utf8' },
  )
  const sources = listed
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line.startsWith(join(root, 'src/')))
    .map((line) => relative(join(root, 'src'), line))
  assert.ok(sources.includes('index.ts') && sources.includes('plugins/rate-limit/index.ts'))
  assert.deepEqual(
    sources.filter((file) => !isLibrarySource(file)),
    [],
    'tsconfig.build.json reaches no demo source',
  )
})
