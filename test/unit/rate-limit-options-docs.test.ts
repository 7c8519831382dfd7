import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import type { OptionDocsRow } from '../../src/plugins/common/options.ts'
import { RATE_LIMIT_OPTIONS } from '../../src/plugins/rate-limit/options.ts'

// The options table of docs/rate-limit.md is the declaration's: a row per option, in its order,
// with its type, default and description. An option added, renamed or given another default fails
// here until the page says so.

const escape = (text: string) => text.replaceAll('|', '\\|')

/** The markdown table of a declaration's rows. */
export function optionsTable(rows: readonly OptionDocsRow[]): string {
  return [
    '| option | type | default | meaning |',
    '|---|---|---|---|',
    ...rows.map((row) => `| \`${row.name}\` | ${escape(row.type)} | ${escape(row.default)} | ${escape(row.description)} |`),
  ].join('\n')
}

/** The table that follows `heading` in a page. */
function tableAfter(page: string, heading: string): string {
  const start = page.indexOf(heading)
  assert.ok(start >= 0, `the page has no "${heading}"`)
  const lines = page.slice(start + heading.length).trimStart().split('\n')
  const end = lines.findIndex((line) => !line.startsWith('|'))
  return lines.slice(0, end < 0 ? lines.length : end).join('\n')
}

test("docs/rate-limit.md's plugin options table is RATE_LIMIT_OPTIONS's", () => {
  const page = readFileSync(new URL('../../docs/rate-limit.md', import.meta.url), 'utf8')
  assert.equal(
    tableAfter(page, 'Plugin options (`RateLimitPluginOptions`):'),
    optionsTable(RATE_LIMIT_OPTIONS.docsRows()),
  )
})
