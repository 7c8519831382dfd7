import { spawn } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT } from './demo.ts'

export interface LintResult {
  errors: number
  warnings: number
  /** Redocly's own report (stylish format, then its summary line). */
  output: string
}

/**
 * `redocly lint --extends recommended` of a document: the repository's redocly.yaml applies when there
 * is one (rules switched off there, with the reason). Telemetry and the update check are off: CI reaches
 * only the npm registry, and the report must be the same on every run.
 */
export async function lintDocument(document: object): Promise<LintResult> {
  const dir = mkdtempSync(join(tmpdir(), 'gateway-openapi-lint-'))
  try {
    const file = join(dir, 'openapi.json')
    writeFileSync(file, JSON.stringify(document, null, 2))
    const cli = join(ROOT, 'node_modules/@redocly/cli/bin/cli.js')
    const config = join(ROOT, 'redocly.yaml')
    const args = [
      cli,
      'lint',
      ...(existsSync(config) ? ['--config', config] : []),
      '--extends',
      'recommended',
      '--max-problems=1000',
      'openapi.json',
    ]
    const run = (format: string) =>
      new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
        const child = spawn(process.execPath, [...args, `--format=${format}`], {
          cwd: dir,
          env: {
            ...process.env,
            REDOCLY_TELEMETRY: 'off',
            REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true',
            NO_COLOR: '1',
          },
        })
        let stdout = ''
        let stderr = ''
        child.stdout.on('data', (chunk) => (stdout += chunk))
        child.stderr.on('data', (chunk) => (stderr += chunk))
        child.on('error', reject)
        child.on('close', (code) => resolve({ code, stdout, stderr }))
      })
    const json = await run('json')
    const report = JSON.parse(json.stdout) as {
      totals: { errors: number; warnings: number; ignored: number }
    }
    const stylish = await run('stylish')
    // Redocly prints a Node.js deprecation notice in a box on Node 20; it is not part of the report.
    const output = `${stylish.stdout}${stylish.stderr}`
      .split('\n')
      .filter((line) => !/[║╔╚]/.test(line))
      .join('\n')
      .trim()
    const totals = `redocly lint --extends recommended: totals ${JSON.stringify(report.totals)}`
    return { errors: report.totals.errors, warnings: report.totals.warnings, output: `${output}\n${totals}` }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
