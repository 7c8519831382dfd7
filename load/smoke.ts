// `npm run bench:smoke`: every benchmark scenario with short runs (`load/run.ts --smoke`: the quick
// runs of about a second, and a scenario fails on any non-2xx answer or error in its load runs),
// the session revocation benchmark's quick run, the buffered rate limiting accuracy's quick run,
// the tracing channels' quick run, then a short soak with its invariants. Exits 1
// naming what failed. Results go to load/results/quick/ (git-ignored); it checks that the suite
// runs, it measures nothing to quote.
import { spawn } from 'node:child_process'
import { RUN_TYPESCRIPT } from '../test/helpers/tsx.ts'

const SOAK_MINUTES = '0.2'

/** Runs one tsx script, its output passed through; resolves its exit code and its stdout. */
function run(args: string[]): Promise<{ code: number; stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...RUN_TYPESCRIPT, ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    let stdout = ''
    child.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk
      process.stdout.write(chunk)
    })
    child.on('error', reject)
    child.on('exit', (code, signal) => resolve({ code: code ?? (signal ? 1 : 0), stdout }))
  })
}

const started = performance.now()
const failures: string[] = []

const scenarios = await run(['load/run.ts', '--smoke'])
if (scenarios.code !== 0) {
  const named = /^failed scenario\(s\): (.+)$/m.exec(scenarios.stdout)?.[1]
  failures.push(named ? `scenario(s) ${named}` : `load/run.ts --smoke (exit ${scenarios.code})`)
}
const revocation = await run(['load/session-revocation.ts', '--quick'])
if (revocation.code !== 0)
  failures.push(
    `session revocation (exit ${revocation.code}: a revoked session still served after 10 s, or an error)`,
  )
const accuracy = await run(['load/accuracy.ts', '--quick'])
if (accuracy.code !== 0)
  failures.push(
    `rate-limit accuracy (exit ${accuracy.code}: an answer other than 200/429, or a window admitted over its limit)`,
  )
const diagnostics = await run(['load/diagnostics.ts', '--quick'])
if (diagnostics.code !== 0)
  failures.push(
    `tracing channels (exit ${diagnostics.code}: a non-2xx answer, a subscriber missing or where none should be, or an error)`,
  )
const soak = await run(['load/soak.ts', '--quick', '--minutes', SOAK_MINUTES])
if (soak.code !== 0) failures.push(`soak (exit ${soak.code}: an invariant failed or a Redis key has no TTL)`)

const seconds = ((performance.now() - started) / 1000).toFixed(0)
if (failures.length) {
  console.error(`\nbench:smoke FAILED in ${seconds} s: ${failures.join('; ')}`)
  process.exit(1)
}
console.log(
  `\nbench:smoke passed in ${seconds} s: every scenario, the session revocation, the rate-limit accuracy, the tracing channels and the soak`,
)
