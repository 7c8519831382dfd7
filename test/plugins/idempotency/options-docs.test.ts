import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import type { OptionDocsRow } from '../../../src/plugins/common/options.ts'
import { MAKE_IDEMPOTENT_OPTIONS } from '../../../src/plugins/idempotency/make-idempotent.ts'
import { IDEMPOTENCY_OPTIONS, ROUTE_OPTIONS } from '../../../src/plugins/idempotency/options.ts'

// docs/idempotency.md's options tables are the declarations' rows, word for word: an option added,
// renamed or given another default shows in the docs or fails here.

const docs = readFileSync(new URL('../../../docs/idempotency.md', import.meta.url), 'utf8')

/** The rows of the first table after `marker`: option, type, default, meaning (`\|` read as `|`). */
function tableAfter(marker: string): OptionDocsRow[] {
  const start = docs.indexOf(marker)
  assert.ok(start >= 0, `docs/idempotency.md has "${marker}"`)
  const lines = docs.slice(start).split('\n')
  const first = lines.findIndex((line) => line.startsWith('| option |'))
  const rows: OptionDocsRow[] = []
  for (const line of lines.slice(first + 2)) {
    if (!line.startsWith('|')) break
    const cells = line
      .slice(1, -1)
      .split(/(?<!\\)\|/)
      .map((cell) => cell.trim().replaceAll('\\|', '|'))
    const [name, type, defaultText, description] = cells as [string, string, string, string]
    rows.push({ name: name.replace(/^`|`$/g, ''), type, default: defaultText, description })
  }
  return rows
}

test("the plugin's options table is its declarations", () => {
  assert.deepEqual(tableAfter('Plugin options (`IdempotencyPluginOptions`)'), IDEMPOTENCY_OPTIONS.docsRows())
})

test("a route's config.idempotency table is its declarations", () => {
  assert.deepEqual(tableAfter('Route option: `config: { idempotency: true }`'), ROUTE_OPTIONS.docsRows())
})

test("makeIdempotent's options table is its declarations", () => {
  assert.deepEqual(tableAfter('Options (`MakeIdempotentOptions`)'), MAKE_IDEMPOTENT_OPTIONS.docsRows())
})
