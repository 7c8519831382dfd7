// Runs benchmark scenarios: `tsx load/run.ts [--quick] [name ...]`; no names runs every file in
// load/scenarios/. Each scenario writes load/results/<date>-<name>.{json,md}; the tables are printed.
import { readdirSync } from 'node:fs'
import { writeResults } from './lib/runner.ts'
import type { Scenario } from './lib/scenario.ts'

const args = process.argv.slice(2)
const quick = args.includes('--quick')
const available = readdirSync(new URL('./scenarios/', import.meta.url))
  .filter((f) => f.endsWith('.ts'))
  .map((f) => f.replace(/\.ts$/, ''))
  .sort()
const names = args.filter((a) => !a.startsWith('--'))
const unknown = names.filter((n) => !available.includes(n))
if (unknown.length) {
  console.error(`Unknown scenario(s): ${unknown.join(', ')}. Available: ${available.join(', ')}`)
  process.exit(2)
}

for (const name of names.length ? names : available) {
  const { default: scenario } = (await import(`./scenarios/${name}.ts`)) as { default: Scenario }
  console.error(`\n== ${name}${quick ? ' (quick)' : ''}`)
  const result = await scenario({ quick })
  const paths = writeResults(
    name,
    { scenario: name, quick, at: new Date().toISOString(), ...result },
    `## ${result.title}\n\n${result.markdown}`,
  )
  console.log(`\n## ${result.title}\n\n${result.markdown}\n\n(${paths.md})`)
}
