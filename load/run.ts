import { placement } from './lib/cpus.ts'
import { stopAllServers, writeResults } from './lib/runner.ts'
import { type Scenario, scenarioNames } from './lib/scenario.ts'
import { placeBenchProcess } from './lib/services.ts'
import { type ScenarioOutcome, writeSummary } from './lib/summary.ts'

const args = process.argv.slice(2)
const smoke = args.includes('--smoke')
const quick = smoke || args.includes('--quick')
const available = scenarioNames()
const names = args.filter((a) => !a.startsWith('--'))
const unknown = names.filter((n) => !available.includes(n))
if (unknown.length) {
  console.error(`Unknown scenario(s): ${unknown.join(', ')}. Available: ${available.join(', ')}`)
  process.exit(2)
}

await placeBenchProcess()

/** Non-2xx answers, errors and timeouts of every load run a scenario's data holds (its samples). */
function failedRequests(data: unknown): number {
  if (Array.isArray(data)) return data.reduce((n: number, d) => n + failedRequests(d), 0)
  if (!data || typeof data !== 'object') return 0
  let n = 0
  for (const [key, value] of Object.entries(data)) {
    if (['non2xx', 'errors', 'timeouts'].includes(key) && typeof value === 'number') n += value
    else n += failedRequests(value)
  }
  return n
}

const outcomes: ScenarioOutcome[] = []
for (const name of names.length ? names : available) {
  const started = performance.now()
  console.error(`\n== ${name}${smoke ? ' (smoke)' : quick ? ' (quick)' : ''}`)
  try {
    const { default: scenario } = (await import(`./scenarios/${name}.ts`)) as { default: Scenario }
    const result = await scenario({ quick })
    const bad = smoke ? failedRequests(result.data) : 0
    if (bad) throw new Error(`${bad} non-2xx answers, errors or timeouts in its load runs`)
    const paths = writeResults(
      name,
      { scenario: name, quick, placement: placement(), ...result },
      `## ${result.title}\n\n${result.markdown}\n\nCPU placement: ${placement()}.`,
      { quick },
    )
    const seconds = (performance.now() - started) / 1000
    outcomes.push({ name, result, seconds })
    console.log(`\n## ${result.title}\n\n${result.markdown}\n\n(${paths.md}, ${seconds.toFixed(0)} s)`)
  } catch (err) {
    const error = (err as Error)?.stack ?? String(err)
    outcomes.push({ name, error, seconds: (performance.now() - started) / 1000 })
    console.error(`\n!! scenario ${name} failed:\n${error}`)
  }
}

const summary = writeSummary(available, { quick, failed: outcomes.filter((o) => o.error) })
const total = outcomes.reduce((sum, o) => sum + o.seconds, 0)
console.log(`\nSummary: ${summary.md}\nChart:   ${summary.svg}`)
console.log(`${outcomes.length} scenario(s) in ${total.toFixed(0)} s`)
const failed = outcomes.filter((o) => o.error).map((o) => o.name)
if (failed.length) console.log(`failed scenario(s): ${failed.join(' ')}`)
// Servers left by a failed scenario must not outlive the run; failures set the exit code.
await stopAllServers()
process.exit(outcomes.some((o) => o.error) ? 1 : 0)
