import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import { after, before, test } from 'node:test'
import { FASTIFY_PROBLEMS } from '../../src/errors.ts'
import { PROBLEM_TYPES, problemTableMarkdown } from '../../src/routes/problem-types.ts'
import { operations, ROOT, type RunningDemo, startDemo } from '../openapi/demo.ts'

// Each problem type the API returns is documented (docs/demo/problems.md), the code answers no
// type that is not, and every `type` URI resolves to its documentation on the running gateway.

let demo: RunningDemo
before(async () => {
  demo = await startDemo()
})
after(() => demo?.close())

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return sourceFiles(path)
    return entry.name.endsWith('.ts') ? [path] : []
  })
}

/** Every problem type the code can answer: `new HttpProblem(status, 'slug', 'title', ...)`, `'/problems/slug'` literals, Fastify's errors. */
function typesInCode(): Map<string, { status: number | '4xx'; title?: string; file: string }> {
  const found = new Map<string, { status: number | '4xx'; title?: string; file: string }>()
  // The table itself, and the document's listings of it, are not answers.
  const skip = new Set(['src/routes/problem-types.ts', 'src/routes/openapi.ts'])
  for (const path of sourceFiles(join(ROOT, 'src'))) {
    const file = relative(ROOT, path)
    if (skip.has(file)) continue
    const text = readFileSync(path, 'utf8')
    for (const m of text.matchAll(
      /new HttpProblem\(\s*(\d{3}|[\w.]+),\s*'([a-z0-9-]+)',\s*(['"`])(.*?)\3/gs,
    )) {
      const status = /^\d{3}$/.test(m[1]!) ? Number(m[1]) : '4xx'
      found.set(m[2]!, { status, title: m[4], file })
    }
    for (const m of text.matchAll(
      /type: '\/problems\/([a-z0-9-]+)',\s*title: '([^']+)',\s*status: (\d{3})/g,
    )) {
      found.set(m[1]!, { status: Number(m[3]), title: m[2], file })
    }
    for (const m of text.matchAll(/['"`]\/problems\/([a-z0-9-]+)['"`]/g)) {
      if (!found.has(m[1]!)) found.set(m[1]!, { status: '4xx', file })
    }
  }
  // src/errors.ts turns Fastify's own client errors into problems by this table, and any other into client-error.
  for (const [status, [slug, title]] of Object.entries(FASTIFY_PROBLEMS)) {
    if (!found.has(slug)) found.set(slug, { status: Number(status), title, file: 'src/errors.ts' })
  }
  assert.match(readFileSync(join(ROOT, 'src/errors.ts'), 'utf8'), /\['client-error', 'Client error'\]/)
  found.set('client-error', { status: '4xx', title: 'Client error', file: 'src/errors.ts' })
  return found
}

test('every problem type the code answers is documented, and every documented type is answered', () => {
  const inCode = typesInCode()
  const documented = new Map<string, (typeof PROBLEM_TYPES)[number]>(PROBLEM_TYPES.map((p) => [p.slug, p]))
  const undocumented = [...inCode.keys()].filter((slug) => !documented.has(slug))
  const unanswered = [...documented.keys()].filter((slug) => !inCode.has(slug))
  assert.deepEqual({ undocumented, unanswered }, { undocumented: [], unanswered: [] })
  for (const [slug, { status, title, file }] of inCode) {
    const doc = documented.get(slug)!
    if (status !== '4xx') assert.equal(doc.status, status, `${slug} (${file}): status`)
    if (title) assert.equal(doc.title, title, `${slug} (${file}): title`)
  }
  assert.equal(documented.size, PROBLEM_TYPES.length, 'each type once')
})

test('docs/demo/problems.md shows the table unchanged', () => {
  const text = readFileSync(join(ROOT, 'docs/demo/problems.md'), 'utf8')
  const table = /<!-- problem-types:start[^>]*-->\n([\s\S]*?)\n<!-- problem-types:end -->/.exec(text)?.[1]
  assert.equal(table, problemTableMarkdown(), 'paste the expected table between the markers')
})

test('every type URI resolves to its page on the gateway, and /problems lists them all', async () => {
  for (const p of PROBLEM_TYPES) {
    const response = await fetch(new URL(`/problems/${p.slug}`, demo.url))
    assert.equal(response.status, 200, p.slug)
    assert.equal(response.headers.get('content-type'), 'text/html; charset=utf-8')
    const html = await response.text()
    assert.ok(html.includes(`<code>/problems/${p.slug}</code>`), p.slug)
    assert.ok(html.includes(p.title.replaceAll("'", '&#39;')), p.slug)
    assert.ok(html.includes(`<strong>${p.status}</strong>`), p.slug)
  }
  const index = await (await fetch(new URL('/problems', demo.url))).text()
  for (const p of PROBLEM_TYPES) assert.ok(index.includes(`href="/problems/${p.slug}"`), p.slug)

  const unknown = await fetch(new URL('/problems/no-such-type', demo.url))
  assert.equal(unknown.status, 404)
  assert.equal(unknown.headers.get('content-type'), 'application/problem+json; charset=utf-8')
  assert.equal(((await unknown.json()) as { type: string }).type, '/problems/not-found')
})

test('a problem answered by the API resolves, relative to the request, to its documentation', async () => {
  const request = new URL('/accounts', demo.url)
  const problem = (await (await fetch(request)).json()) as { type: string; title: string }
  assert.equal(problem.type, '/problems/unauthenticated')
  const page = await fetch(new URL(problem.type, request))
  assert.equal(page.status, 200)
  assert.ok((await page.text()).includes(problem.title))
})

test('every type the document lists for a response is documented', () => {
  const documented = new Set(PROBLEM_TYPES.map((p) => `/problems/${p.slug}`))
  let listed = 0
  for (const { op } of operations(demo.document)) {
    for (const response of Object.values(op.responses)) {
      const schema = response.content?.['application/problem+json']?.schema as
        | { properties: { type: { enum?: string[] } } }
        | undefined
      for (const type of schema?.properties.type.enum ?? []) {
        assert.ok(documented.has(type), type)
        listed++
      }
    }
  }
  assert.ok(listed > 30)
})
