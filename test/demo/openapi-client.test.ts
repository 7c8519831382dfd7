import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { type RunningDemo, startDemo } from '../openapi/demo.ts'
import { generateClientTypes } from '../openapi/generate.ts'
import { typecheckAgainst } from '../openapi/typecheck.ts'

// A client generated from the served document (openapi-typescript + openapi-fetch) walks
// through the API against a real server, using only what the generated client offers: the walk-through
// is type-checked against the generated types before it runs.

let demo: RunningDemo
let types: string
before(async () => {
  demo = await startDemo()
  types = await generateClientTypes(demo.document)
})
after(() => demo?.close())

test('openapi-typescript generates an operation for every operationId of the document', () => {
  for (const id of ['login', 'getSession', 'logout', 'listAccounts', 'getBalance', 'createTransfer']) {
    assert.match(types, new RegExp(`\\b${id}: \\{`), id)
  }
  assert.match(types, /"Idempotency-Key": string;/)
})

test('the walk-through type-checks against the generated client (tsc, strict)', () => {
  const result = typecheckAgainst(types)
  assert.ok(result.ok, result.output)
})

test('the walk-through runs against the server: login, accounts, balance, transfer, replay, 422, logout', async () => {
  const { walkThrough } = await import('../openapi/walkthrough.ts')
  const calls: string[] = []
  const result = await walkThrough({
    baseUrl: demo.url,
    username: 'alice',
    password: 'demo-password',
    toAccountId: 2,
    log: (line) => calls.push(line),
  })
  console.log(calls.join('\n'))
  assert.equal(result.balanceAfter, 100_000_000 - 50_000)
  assert.deepEqual(
    calls.map((line) => line.slice(line.lastIndexOf(' ') + 1)),
    ['200', '200', '200', '201', '201', '422', '200', '204', '401'],
  )
})
