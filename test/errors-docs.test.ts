import assert from 'node:assert/strict'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'
import { PROBLEM_CODES } from '../src/plugins/common/errors.ts'

const root = new URL('..', import.meta.url).pathname

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return sources(path)
    return path.endsWith('.ts') ? [path] : []
  })
}

test('docs/errors.md lists every code the library throws or sends, and no other', () => {
  const inCode = new Set<string>()
  for (const dir of ['src/redis', 'src/plugins', 'src/primitives'])
    for (const file of sources(join(root, dir))) {
      for (const match of readFileSync(file, 'utf8').matchAll(/'(FRG_[A-Z0-9_]+)'/g)) inCode.add(match[1]!)
    }
  for (const code of Object.values(PROBLEM_CODES)) inCode.add(code)
  const docs = readFileSync(join(root, 'docs/errors.md'), 'utf8')
  const inDocs = new Set([...docs.matchAll(/^\| `(FRG_[A-Z0-9_]+)` \|/gm)].map((m) => m[1]!))
  assert.deepEqual([...inCode].sort(), [...inDocs].sort())
})
