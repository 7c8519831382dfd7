import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import { COMPAT_OPTIONS } from '../../src/compat/fastify-rate-limit/params.ts'
import { CACHE_OPTIONS } from '../../src/plugins/cache/options.ts'
import type { Declarations, DeclaredOptions, OptionDocsRow } from '../../src/plugins/common/options.ts'
import { MAKE_IDEMPOTENT_OPTIONS } from '../../src/plugins/idempotency/make-idempotent.ts'
import { IDEMPOTENCY_OPTIONS, ROUTE_OPTIONS } from '../../src/plugins/idempotency/options.ts'
import { METRICS_OPTIONS } from '../../src/plugins/metrics/options.ts'
import { RATE_LIMIT_OPTIONS } from '../../src/plugins/rate-limit/options.ts'
import { REDIS_OPTIONS } from '../../src/plugins/redis/options.ts'
import { SESSION_OPTIONS, SESSION_STORE_OPTIONS } from '../../src/plugins/session/options.ts'

// Each plugin's options table in its docs page is its declaration as written: the same names in
// the same order, the same defaults and the same descriptions. On a mismatch the message shows the
// table to paste. One line per plugin: [its declaration, its docs page, the heading over the table].

const PAGES: Array<[DeclaredOptions<Declarations>, string, string?]> = [
  [CACHE_OPTIONS, 'docs/cache.md'],
  [IDEMPOTENCY_OPTIONS, 'docs/idempotency.md'],
  [ROUTE_OPTIONS, 'docs/idempotency.md', '### Route options'],
  [MAKE_IDEMPOTENT_OPTIONS, 'docs/idempotency.md', '## Beyond routes: `makeIdempotent`'],
  [METRICS_OPTIONS, 'docs/metrics.md', '## Options and API'],
  [REDIS_OPTIONS, 'docs/redis.md', '## Options'],
  [SESSION_OPTIONS, 'docs/session.md', '## Options'],
  [SESSION_STORE_OPTIONS, 'docs/session.md', '### A store of its own'],
  [RATE_LIMIT_OPTIONS, 'docs/rate-limit.md', 'Plugin options (`RateLimitPluginOptions`):'],
  [
    COMPAT_OPTIONS,
    'docs/migrating-from-fastify-rate-limit.md',
    'Every option of the compat entry, as it reads it:',
  ],
]

const root = new URL('../../', import.meta.url)

/** The rows of the first `| option | default | meaning |` table under `heading`. */
function docsTable(page: string, heading: string): OptionDocsRow[] {
  const text = readFileSync(new URL(page, root), 'utf8')
  const from = text.indexOf(`\n${heading}\n`)
  assert.ok(from >= 0, `${page} has no heading '${heading}'`)
  const lines = text.slice(from).split('\n')
  const start = lines.findIndex((line) => line.startsWith('| option | default | meaning |'))
  assert.ok(start >= 0, `${page} has no options table under '${heading}'`)
  const rows: OptionDocsRow[] = []
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break
    const [name = '', defaultText = '', ...meaning] = line.slice(2, -2).split(' | ')
    rows.push({
      name: name.replace(/^`|`$/g, ''),
      type: '',
      default: defaultText,
      description: meaning.join(' | '),
    })
  }
  return rows
}

/** The table the declaration gives, as it goes in the page. */
function table(declared: DeclaredOptions<Declarations>): string {
  const rows = declared.docsRows().map((row) => `| \`${row.name}\` | ${row.default} | ${row.description} |`)
  return ['| option | default | meaning |', '|---|---|---|', ...rows].join('\n')
}

for (const [declared, page, heading = '## Options'] of PAGES) {
  test(`${page}: the options table is the ${declared.owner}'s declaration`, () => {
    const documented = docsTable(page, heading).map(({ type: _, ...row }) => row)
    const declaredRows = declared.docsRows().map(({ type: _, ...row }) => row)
    assert.deepEqual(documented, declaredRows, `expected this table in ${page}:\n${table(declared)}`)
  })
}
