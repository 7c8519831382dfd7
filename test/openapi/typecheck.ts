import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT } from './demo.ts'

/** The module name walkthrough.ts imports the generated types under (see generated-client.d.ts). */
const MODULE = 'gateway-openapi-client'

// Proof that the check runs against the generated types and that they are strict: if `paths` were
// the stand-in (any) or the document lost its routes or its required header, an expected error would
// be missing and tsc would fail on the unused @ts-expect-error.
const PROBE = `import createClient from 'openapi-fetch'
import type { paths } from '${MODULE}'

const client = createClient<paths>({ baseUrl: 'http://127.0.0.1:3000' })
// @ts-expect-error: no such route in the document
void client.GET('/no-such-route')
// @ts-expect-error: Idempotency-Key is a required header of POST /transfers
void client.POST('/transfers', { body: { fromAccountId: 1, toAccountId: 2, amount: 1, currency: 'VND' } })
void client.POST('/transfers', {
  params: { header: { 'Idempotency-Key': 'k' } },
  // @ts-expect-error: amount is an integer in the document, not a string
  body: { fromAccountId: 1, toAccountId: 2, amount: '1', currency: 'VND' },
})
`

export interface TypecheckResult {
  ok: boolean
  output: string
}

/**
 * Writes the generated types to a temporary folder and runs tsc (the repository's TypeScript and
 * compiler options) on walkthrough.ts and a probe, with the generated module name mapped to them.
 */
export function typecheckAgainst(generatedTypes: string): TypecheckResult {
  const dir = mkdtempSync(join(tmpdir(), 'gateway-openapi-client-'))
  try {
    writeFileSync(join(dir, 'api.d.ts'), generatedTypes)
    writeFileSync(join(dir, 'probe.ts'), PROBE)
    writeFileSync(join(dir, 'package.json'), '{ "type": "module" }')
    // The probe imports openapi-fetch and @types/node from the repository's packages.
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir')
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({
        extends: join(ROOT, 'tsconfig.json'),
        compilerOptions: { paths: { [MODULE]: [join(dir, 'api.d.ts')] } },
        files: [join(ROOT, 'test/openapi/walkthrough.ts'), join(dir, 'probe.ts')],
        include: [],
      }),
    )
    const tsc = spawnSync(join(ROOT, 'node_modules/.bin/tsc'), ['-p', join(dir, 'tsconfig.json')], {
      cwd: ROOT,
      encoding: 'utf8',
    })
    return { ok: tsc.status === 0, output: `${tsc.stdout}${tsc.stderr}${tsc.error ?? ''}` }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
