import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import * as Schema from 'typebox/schema'
import { type Operation, operations, ROOT, type RunningDemo, startDemo } from '../openapi/demo.ts'

// docs/demo/demo.http stays in step with the OpenAPI document: the same routes (every operation
// has a request, every request is an operation), only declared headers (the required ones present),
// bodies and query strings the document accepts, and each request answers the status its title names
// when the file is run top to bottom against a fresh gateway.

interface HttpRequest {
  title: string
  method: string
  url: string
  headers: Record<string, string>
  body?: string
}

/** The requests of a .http file (VS Code REST Client / JetBrains syntax), variables substituted. */
function parseHttpFile(text: string): HttpRequest[] {
  const variables = new Map<string, string>()
  for (const m of text.matchAll(/^@(\w+)\s*=\s*(.*)$/gm)) variables.set(m[1]!, m[2]!.trim())
  const substitute = (s: string) =>
    s.replace(/\{\{(\w+)\}\}/g, (_, name: string) => {
      assert.ok(variables.has(name), `variable ${name} is defined`)
      return variables.get(name)!
    })
  return text
    .split(/^###/m)
    .slice(1)
    .map((block) => {
      const [titleLine, ...rest] = block.split('\n')
      const lines = rest.filter((line) => !/^\s*(#|\/\/)/.test(line))
      while (lines.length && lines[0]!.trim() === '') lines.shift()
      const [method, url] = lines.shift()!.trim().split(/\s+/) as [string, string]
      const headers: Record<string, string> = {}
      while (lines.length && lines[0]!.trim() !== '') {
        const line = lines.shift()!
        const colon = line.indexOf(':')
        headers[line.slice(0, colon).trim().toLowerCase()] = substitute(line.slice(colon + 1).trim())
      }
      const body = lines.join('\n').trim()
      return {
        title: titleLine!.trim(),
        method,
        url: substitute(url),
        headers,
        ...(body ? { body: substitute(body) } : {}),
      }
    })
}

const requests = parseHttpFile(readFileSync(join(ROOT, 'docs/demo/demo.http'), 'utf8'))

let demo: RunningDemo
before(async () => {
  demo = await startDemo()
})
after(() => demo?.close())

function operationOf(request: HttpRequest): { path: string; op: Operation; params: Record<string, string> } {
  const { pathname } = new URL(request.url)
  for (const { method, path, op } of operations(demo.document)) {
    if (method !== request.method) continue
    const names: string[] = []
    const pattern = path.replace(/\{(\w+)\}/g, (_, name: string) => {
      names.push(name)
      return '([^/]+)'
    })
    const match = new RegExp(`^${pattern}$`).exec(pathname)
    if (match) return { path, op, params: Object.fromEntries(names.map((n, i) => [n, match[i + 1]!])) }
  }
  assert.fail(`${request.method} ${pathname} is not an operation of the document`)
}

test('demo.http has a request for every operation of the document, and nothing else', () => {
  assert.ok(requests.length >= 10)
  const covered = new Set(requests.map((r) => operationOf(r).op.operationId))
  assert.deepEqual(
    [...covered].sort(),
    operations(demo.document)
      .map(({ op }) => op.operationId)
      .sort(),
  )
})

test('each request is what the document declares: server, parameters, headers, body', () => {
  const server = demo.document.servers[0]!.url
  for (const request of requests) {
    const where = request.title
    assert.ok(request.url.startsWith(server), `${where}: on the document's server ${server}`)
    const { op, params } = operationOf(request)
    assert.ok(where.startsWith(op.operationId), `${where}: names its operationId ${op.operationId}`)
    const declared = op.parameters ?? []
    for (const [name, value] of Object.entries(params)) {
      const parameter = declared.find((p) => p.in === 'path' && p.name === name)
      // An integer parameter is written as its digits (no sign, no leading zero), as the gateway reads it.
      const typed =
        parameter?.schema.type === 'integer' && /^[1-9][0-9]*$/.test(value) ? Number(value) : value
      assert.ok(parameter && Schema.Check(parameter.schema, typed), `${where}: path ${name}=${value}`)
    }
    for (const [name, value] of new URL(request.url).searchParams) {
      const parameter = declared.find((p) => p.in === 'query' && p.name === name)
      assert.ok(parameter && Schema.Check(parameter.schema, value), `${where}: query ${name}=${value}`)
    }
    for (const [name, value] of Object.entries(request.headers)) {
      if (name === 'content-type') {
        assert.ok(op.requestBody?.content[value], `${where}: ${value} is a declared body`)
        continue
      }
      const parameter = declared.find((p) => p.in === 'header' && p.name.toLowerCase() === name)
      assert.ok(parameter, `${where}: header ${name} is declared`)
      assert.ok(Schema.Check(parameter.schema, value), `${where}: ${name}: ${value} fits its schema`)
    }
    for (const parameter of declared.filter((p) => p.in === 'header' && p.required)) {
      assert.ok(request.headers[parameter.name.toLowerCase()], `${where}: sends ${parameter.name}`)
    }
    if (op.requestBody) {
      assert.ok(request.body, `${where}: has a body`)
      const media = request.headers['content-type']!
      const body = JSON.parse(request.body)
      const schema = op.requestBody.content[media]!.schema
      assert.ok(Schema.Check(schema, body), `${where}: ${JSON.stringify(Schema.Errors(schema, body))}`)
    } else {
      assert.equal(request.body, undefined, `${where}: no body`)
    }
  }
})

test('run top to bottom against a fresh gateway, each request answers the status its title names', async () => {
  const base = demo.document.servers[0]!.url
  let cookie = ''
  for (const request of requests) {
    const expected = Number(/:\s*([1-5][0-9]{2})\b/.exec(request.title)?.[1])
    assert.ok(expected, `${request.title}: names a status`)
    const response = await fetch(request.url.replace(base, demo.url), {
      method: request.method,
      headers: { ...request.headers, ...(cookie ? { cookie } : {}) },
      ...(request.body ? { body: request.body } : {}),
    })
    // Like the REST clients: keep the cookie the gateway sets, drop it when it is cleared.
    for (const line of response.headers.getSetCookie()) {
      const pair = line.split(';', 1)[0]!
      cookie = pair.endsWith('=') ? '' : pair
    }
    const body = await response.text()
    assert.equal(response.status, expected, `${request.title}: ${body}`)
    const { op } = operationOf(request)
    const declared = op.responses[String(response.status)]
    assert.ok(declared, `${request.title}: ${response.status} is declared`)
    const media = (response.headers.get('content-type') ?? '').split(';')[0]!
    if (response.status !== 204)
      assert.ok(declared.content?.[media], `${request.title}: ${media} is declared`)
    if (/Idempotent-Replayed: true/.test(request.title)) {
      assert.equal(response.headers.get('idempotent-replayed'), 'true')
    }
  }
})
