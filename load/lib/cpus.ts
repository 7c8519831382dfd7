// CPU placement for benchmarks. autocannon runs in the suite's own process and costs about as much
// CPU per request as the server it measures; on a two-core machine, left to the scheduler, it takes
// CPU from the server under test, so a leaner server buys its rival more load-generator time and the
// ratios shrink towards 1. Pinned, the load generator has CPU 0 and everything under test (server
// processes, their redis-server) the other CPUs, and a contender's throughput is what its own work
// per request allows. Postgres is the machine's service and stays unpinned. BENCH_PIN=off turns this off.
import { execFileSync } from 'node:child_process'
import { availableParallelism } from 'node:os'

function tasksetWorks(): boolean {
  try {
    execFileSync('taskset', ['-p', String(process.pid)], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

const cpus = availableParallelism()
/** Whether this run pins: Linux with taskset, at least two CPUs, and BENCH_PIN not 'off'. */
export const pinned = process.env.BENCH_PIN !== 'off' && cpus >= 2 && tasksetWorks()
const LOAD_GENERATOR_CPUS = '0'
const UNDER_TEST_CPUS = cpus === 2 ? '1' : `1-${cpus - 1}`

/** One line for the results: where things ran. */
export const placement = pinned
  ? `load generator (autocannon) pinned to CPU ${LOAD_GENERATOR_CPUS}, servers under test and their redis-server to CPU ${UNDER_TEST_CPUS}, Postgres unpinned`
  : 'unpinned: load generator and servers share every CPU'

/** Pins this process, all of its threads, to the load generator's CPU. */
export function pinLoadGenerator(): void {
  if (pinned)
    execFileSync('taskset', ['-a', '-p', '-c', LOAD_GENERATOR_CPUS, String(process.pid)], { stdio: 'ignore' })
}

/** Pins a running process under test, all of its threads, to the CPUs under test. */
export function pinUnderTest(pid: number): void {
  if (pinned) execFileSync('taskset', ['-a', '-p', '-c', UNDER_TEST_CPUS, String(pid)], { stdio: 'ignore' })
}
