// The seeds' last two systems in the bench suite: the feed's push/pull simulation and read times
// (load/feed-simulation.ts, `npm run bench:feed`) and the Bloom filter's false-positive rate,
// memory and throughput (load/bloom.ts, `npm run bench:bloom`). Each runs as its own process, as its
// npm script runs it, and writes its own load/results/<name>.{md,json} (quick/ for quick runs);
// this scenario collects both reports into the suite's summary.
import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { promisify } from 'node:util'
import { RUN_TYPESCRIPT } from '../../test/helpers/tsx.ts'
import { resultsDir } from '../lib/runner.ts'
import type { Scenario } from '../lib/scenario.ts'

const run = promisify(execFile)

async function report(script: string, name: string, quick: boolean): Promise<string> {
  await run(process.execPath, [...RUN_TYPESCRIPT, script, ...(quick ? ['--quick'] : [])], {
    cwd: new URL('../..', import.meta.url).pathname,
    maxBuffer: 64 * 1024 * 1024,
  })
  return readFileSync(new URL(`${name}.md`, resultsDir(quick)), 'utf8')
}

const feedAndBloom: Scenario = async ({ quick }) => {
  const feed = await report('load/feed-simulation.ts', 'feed', quick)
  const bloom = await report('load/bloom.ts', 'bloom', quick)
  return {
    title: 'Feed (hybrid fan-out) and Bloom filter',
    markdown: `${feed}\n\n${bloom}`,
    data: {
      feed: `load/results/${quick ? 'quick/' : ''}feed.json`,
      bloom: `load/results/${quick ? 'quick/' : ''}bloom.json`,
    },
  }
}

export default feedAndBloom
