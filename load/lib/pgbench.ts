// pgbench (PostgreSQL's own load generator, Debian package `postgresql-client`) as a reference: the
// transfer statement of src/ledger/ledger.ts run by pgbench alone, with the same parameters as the
// gateway sends, shows what Postgres gives when nothing else (HTTP, sessions, Redis, Node) is in
// the way. The script is generated at run time from TRANSFER_SQL, so the two cannot drift.
import { execFileSync, spawn } from 'node:child_process'
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { TRANSFER_PARAMETERS, TRANSFER_SQL } from '../../src/ledger/ledger.ts'

/** Whether `pgbench` is on PATH; scenarios skip their pgbench part without it. */
export const pgbenchAvailable: boolean = (() => {
  try {
    execFileSync('pgbench', ['--version'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
})()

export const PGBENCH_MISSING =
  'pgbench is not installed (`sudo apt-get install -y postgresql-client`): no pgbench reference was measured.'

/**
 * TRANSFER_SQL with `$n` replaced by pgbench's `:name` (the names of TRANSFER_PARAMETERS), ended
 * by a semicolon. pgbench replaces every `:name` it finds, inside string literals too, so anything
 * else that reads as one is refused here rather than sent as a wrong parameter.
 */
export function transferStatementForPgbench(): string {
  const sql = TRANSFER_SQL.replace(/\$(\d+)/g, (_, n: string) => {
    const name = TRANSFER_PARAMETERS[Number(n) - 1]
    if (!name) throw new Error(`TRANSFER_SQL has a parameter $${n} without a name`)
    return `:${name}`
  })
  const names = new Set<string>(TRANSFER_PARAMETERS)
  for (const [, name] of sql.replace(/::+/g, ' ').matchAll(/:([A-Za-z0-9_]+)/g)) {
    if (!names.has(name!))
      throw new Error(`TRANSFER_SQL holds ':${name}', which pgbench would read as a variable`)
  }
  return `${sql};\n`
}

export interface PgbenchRun {
  /** Transactions per second, as pgbench reports it (without the initial connection time). */
  tps: number
  /** Transactions completed; every one is one transfer statement. */
  transactions: number
  failed: number
  /** Latency per transaction in ms, from pgbench's per-transaction log. */
  p50: number
  p99: number
}

/** Parses pgbench's summary (PostgreSQL 15 and later print the failed count; older ones do not). */
export function parsePgbench(output: string): Omit<PgbenchRun, 'p50' | 'p99'> {
  const tps = /^tps = ([0-9.]+) \(without initial connection time\)/m.exec(output)?.[1]
  const transactions = /^number of transactions actually processed: (\d+)/m.exec(output)?.[1]
  if (tps === undefined || transactions === undefined)
    throw new Error(`pgbench: unreadable output:\n${output}`)
  const failed = /^number of failed transactions: (\d+)/m.exec(output)?.[1] ?? '0'
  return { tps: Number(tps), transactions: Number(transactions), failed: Number(failed) }
}

const quantile = (sorted: number[], q: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!

/**
 * One pgbench run: `script` (meta-commands choosing the parameters, then the statement) for
 * `durationSec` with `clients` connections on one thread, prepared protocol (the statement parsed
 * and planned once per connection, then Bind and Execute per transaction: what the gateway does
 * with its named statement), no vacuum. pgbench is started by this process and inherits its CPU
 * affinity: the load generator's CPU when pinned.
 */
export async function runPgbench(options: {
  databaseUrl: string
  script: string
  clients: number
  durationSec: number
  /** `-D name=value`: variables every client starts with. */
  define?: Record<string, string>
}): Promise<PgbenchRun & { cpus: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'pgbench-'))
  try {
    const scriptPath = join(dir, 'transfer.sql')
    writeFileSync(scriptPath, options.script)
    const args = [
      '-n',
      '-M',
      'prepared',
      '-c',
      String(options.clients),
      '-j',
      '1',
      '-T',
      String(Math.max(1, Math.round(options.durationSec))),
      '-f',
      scriptPath,
      '-l',
      `--log-prefix=${join(dir, 'log')}`,
      ...Object.entries(options.define ?? {}).flatMap(([name, value]) => ['-D', `${name}=${value}`]),
      options.databaseUrl,
    ]
    const { output, cpus } = await new Promise<{ output: string; cpus: string }>((resolve, reject) => {
      const child = spawn('pgbench', args, { stdio: ['ignore', 'pipe', 'pipe'] })
      let output = ''
      let cpus = 'unknown'
      try {
        const status = readFileSync(`/proc/${child.pid}/status`, 'utf8')
        cpus = /^Cpus_allowed_list:\s*(\S+)/m.exec(status)?.[1] ?? cpus
      } catch {
        // Not Linux, or already gone.
      }
      child.stdout.on('data', (chunk: Buffer) => {
        output += chunk.toString()
      })
      child.stderr.on('data', (chunk: Buffer) => {
        output += chunk.toString()
      })
      child.once('error', reject)
      child.once('exit', (code) =>
        code === 0 ? resolve({ output, cpus }) : reject(new Error(`pgbench exited with ${code}:\n${output}`)),
      )
    })
    // Log lines: client transaction latency_us script epoch epoch_us (PostgreSQL 15).
    const latencies = readdirSync(dir)
      .filter((f) => f.startsWith('log.'))
      .flatMap((f) => readFileSync(join(dir, f), 'utf8').split('\n'))
      .filter(Boolean)
      .map((line) => Number(line.split(' ')[2]) / 1000)
      .sort((a, b) => a - b)
    return { ...parsePgbench(output), p50: quantile(latencies, 0.5), p99: quantile(latencies, 0.99), cpus }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
