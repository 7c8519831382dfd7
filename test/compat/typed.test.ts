import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { test } from 'node:test'

// The compat entry's types in a program without @fastify/rate-limit's (test/compat/typed/app.ts,
// checked alone): the repository's own typecheck always has both, as load/peer uses upstream.

test('an app importing only the compat entry type-checks config.rateLimit (tsc on test/compat/typed)', () => {
  const typescript = createRequire(import.meta.url).resolve('typescript/package.json')
  const tsc = join(dirname(typescript), 'bin', 'tsc')
  const project = new URL('./typed/tsconfig.json', import.meta.url).pathname
  const run = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8' })
  assert.equal(run.status, 0, `${run.stdout}${run.stderr}`)
})
