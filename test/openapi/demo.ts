import { fileURLToPath } from 'node:url'
import { seedDemo } from '../../src/ledger/seed.ts'
import { buildTestApp, type TestApp } from '../helpers/gateway.ts'
import { listen } from '../helpers/index.ts'

export const ROOT = fileURLToPath(new URL('../../', import.meta.url))

export interface RunningDemo extends TestApp {
  /** The base URL it listens on. */
  url: string
  /** The OpenAPI document as served at /docs/json. */
  document: OpenApiDocument
}

/** The slice of OpenAPI 3.0 the checks read. */
export interface OpenApiDocument {
  openapi: string
  servers: Array<{ url: string }>
  components: { securitySchemes: Record<string, { type: string; in: string; name: string }> }
  paths: Record<string, Record<string, Operation>>
}
export interface Operation {
  operationId: string
  summary: string
  description: string
  security: Array<Record<string, string[]>>
  parameters?: Array<{ in: string; name: string; required: boolean; schema: Record<string, unknown> }>
  requestBody?: { content: Record<string, { schema: Record<string, unknown> }> }
  responses: Record<string, Response>
}
export interface Response {
  description: string
  headers?: Record<string, { schema: Record<string, unknown>; description?: string }>
  content?: Record<string, { schema: Record<string, unknown> }>
}

/**
 * The demo gateway as `npm start` runs it (rate limits on, alice and bob seeded, real HTTP), on its own
 * database and Redis key prefix.
 */
export async function startDemo(env: Record<string, string> = {}): Promise<RunningDemo> {
  const demo = await buildTestApp(env, { rateLimits: 'on' })
  try {
    await seedDemo(demo.db)
    const url = await listen(demo.app)
    const response = await fetch(`${url}/docs/json`)
    if (response.status !== 200) throw new Error(`/docs/json answered ${response.status}`)
    return { ...demo, url, document: (await response.json()) as OpenApiDocument }
  } catch (err) {
    await demo.close()
    throw err
  }
}

/** Every operation of the document with its method and path. */
export function operations(
  document: OpenApiDocument,
): Array<{ method: string; path: string; op: Operation }> {
  return Object.entries(document.paths).flatMap(([path, item]) =>
    Object.entries(item).map(([method, op]) => ({ method: method.toUpperCase(), path, op })),
  )
}
