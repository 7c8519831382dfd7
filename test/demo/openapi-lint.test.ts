import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { type RunningDemo, startDemo } from '../openapi/demo.ts'
import { lintDocument } from '../openapi/lint.ts'

// The document a running gateway serves at /docs/json passes Redocly's recommended ruleset
// with no error and no warning (a rule switched off is switched off in redocly.yaml, with its reason).

let demo: RunningDemo
before(async () => {
  demo = await startDemo()
})
after(() => demo?.close())

test('the served OpenAPI document lints clean with Redocly recommended: 0 errors, 0 warnings', async () => {
  const result = await lintDocument(demo.document)
  console.log(result.output)
  assert.deepEqual(
    { errors: result.errors, warnings: result.warnings },
    { errors: 0, warnings: 0 },
    result.output,
  )
})

test('so does the production document (the __Host- cookie, a public URL)', async (t) => {
  const production = await startDemo({
    NODE_ENV: 'production',
    LOG_LEVEL: 'silent',
    PUBLIC_URL: 'https://bank.example.org/api/',
  })
  t.after(() => production.close())
  const result = await lintDocument(production.document)
  assert.deepEqual(
    { errors: result.errors, warnings: result.warnings },
    { errors: 0, warnings: 0 },
    result.output,
  )
})
