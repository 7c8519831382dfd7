import { spawnSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { RUN_TYPESCRIPT } from '../helpers/tsx.ts'

// npm run test:model [-- --model NAME] [--runs N] [--time-limit MS] [--seed=S --path P [--replay-path R]]
// Runs test/model/*.model.ts under node:test, each model with its CI budget unless told otherwise.

const USAGE =
  'usage: npm run test:model -- [--model NAME] [--runs N] [--time-limit MS] [--seed=S --path P [--replay-path R]]'

// `--seed -5` would read -5 as a flag: join a seed given apart into `--seed=-5`.
const args = process.argv.slice(2)
const seedAt = args.indexOf('--seed')
if (seedAt >= 0 && seedAt + 1 < args.length) args.splice(seedAt, 2, `--seed=${args[seedAt + 1]}`)

const { values } = parseArgs({
  args,
  options: {
    model: { type: 'string' },
    runs: { type: 'string' },
    'time-limit': { type: 'string' },
    seed: { type: 'string' },
    path: { type: 'string' },
    'replay-path': { type: 'string' },
    help: { type: 'boolean' },
  },
})
if (values.help) {
  console.log(USAGE)
  process.exit(0)
}
if (values.seed !== undefined && values.model === undefined) {
  console.error(`--seed replays one model's failure: name it with --model\n${USAGE}`)
  process.exit(2)
}

const folder = import.meta.dirname
const files = readdirSync(folder)
  .filter((file) => file.endsWith('.model.ts'))
  .sort()
const chosen = values.model ? files.filter((file) => file === `${values.model}.model.ts`) : files
if (files.length === 0 && values.model === undefined) {
  console.log('no models in test/model yet')
  process.exit(0)
}
if (chosen.length === 0) {
  const names = files.map((file) => file.replace(/\.model\.ts$/, '')).join(', ')
  console.error(`no model named ${values.model}; the models: ${names}`)
  process.exit(2)
}

const env: NodeJS.ProcessEnv = { ...process.env }
const set = (name: string, value: string | undefined) => {
  if (value !== undefined) env[name] = value
}
set('MODEL_ONLY', values.model)
set('MODEL_RUNS', values.runs)
set('MODEL_TIME_LIMIT_MS', values['time-limit'] ?? (values.runs ? '86400000' : undefined))
set('MODEL_SEED', values.seed)
set('MODEL_PATH', values.path)
set('MODEL_REPLAY_PATH', values['replay-path'])

const result = spawnSync(
  process.execPath,
  [
    ...RUN_TYPESCRIPT,
    '--test',
    '--test-force-exit',
    '--test-concurrency=2',
    ...chosen.map((file) => join(folder, file)),
  ],
  { stdio: 'inherit', env },
)
process.exit(result.status ?? 1)
