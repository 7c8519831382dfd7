import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import { COMPAT_OPTIONS } from '../../src/compat/fastify-rate-limit/params.ts'
import type { OptionDocsRow } from '../../src/plugins/common/options.ts'
import { RATE_LIMIT_OPTIONS } from '../../src/plugins/rate-limit/options.ts'

// The options tables of docs/rate-limit.md and docs/migrating-from-fastify-rate-limit.md are the
// declarations': a row per option, in its order, with its type, default and description. An option
// added, renamed or given another default fails here until the page says so.

const escape = (text: string) => text.replaceAll('|', '\\|')

/** The markdown table of a declaration's rows. */
export function optionsTable(rows: readonly OptionDocsRow[]): string {
  return [
    '| option | type | default | meaning |',
    '|---|---|---|---|',
    ...rows.map(
      (row) =>
        `| \`${row.name}\` | ${escape(row.type)} | ${escape(row.default)} | ${escape(row.description)} |`,
    ),
  ].join('\n')
}

/** The table that follows `heading` in a page. */
function tableAfter(page: string, heading: string): string {
  const start = page.indexOf(heading)
  assert.ok(start >= 0, `the page has no "${heading}"`)
  const lines = page
    .slice(start + heading.length)
    .trimStart()
    .split('\n')
  const end = lines.findIndex((line) => !line.startsWith('|'))
  return lines.slice(0, end < 0 ? lines.length : end).join('\n')
}

const PAGES = [
  {
    page: 'rate-limit.md',
    heading: 'Plugin options (`RateLimitPluginOptions`):',
    options: RATE_LIMIT_OPTIONS,
  },
  {
    page: 'migrating-from-fastify-rate-limit.md',
    heading: 'Every option of the compat entry, as it reads it:',
    options: COMPAT_OPTIONS,
  },
]

for (const { page, heading, options } of PAGES)
  test(`docs/${page}'s options table is the declaration's (${options.owner})`, () => {
    const text = readFileSync(new URL(`../../docs/${page}`, import.meta.url), 'utf8')
    assert.equal(tableAfter(text, heading), optionsTable(options.docsRows()))
  })
