// The seeds' last two systems in the bench suite: the feed's push/pull simulation and read times
// (load/feed-simulation.ts, `npm run bench:feed`) and the Bloom filter's false-positive rate,
// memory and throughput (load/bloom.ts, `npm run bench:bloom`). Each runs as its own process, as its
// npm script runs it, and writes its own load/results/<date>-<name>.{md,json}; this scenario
// collects both reports into the suite's summary.
import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { promisify } from 'node:util'
import type { Scenario } from '../lib/scenario.ts'

const run = promisify(execFile)

async function report(script: string, name: string, quick: boolean): Promise<string> {
  await run(process.execPath, ['--import', 'tsx', script, ...(quick ? ['--quick'] : [])], {
    cwd: new URL('../..', import.meta.url).pathname,
    maxBuffer: 64 * 1024 * 1024,
  })
  const date = new Date().toISOString().slice(0, 10)
  return readFileSync(new URL(`../results/${date}-${name}.md`, import.meta.url), 'utf8')
}

const feedAndBloom: Scenario = async ({ quick }) => {
  const feed = await report('load/feed-simulation.ts', 'feed', quick)
  const bloom = await report('load/bloom.ts', 'bloom', quick)
  return {
    title: 'Feed (hybrid fan-out) and Bloom filter',
    markdown: `${feed}\n\n${bloom}`,
    data: { feed: 'load/results/<date>-feed.json', bloom: 'load/results/<date>-bloom.json' },
  }
}

export default feedAndBloom
