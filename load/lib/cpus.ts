// CPU placement for benchmarks. autocannon runs in the suite's own process and costs about as much
// CPU per request as the server it measures; on a two-core machine, left to the scheduler, it takes
// CPU from the server under test, so a leaner server buys its rival more load-generator time and the
// ratios shrink towards 1. Pinned, the load generator has CPU 0 and everything under test (server
// processes, their redis-server) the other CPUs, and a contender's throughput is what its own work
// per request allows. Postgres, the machine's service, is pinned with the servers for the run and
// given its CPUs back at the end. BENCH_PIN=off turns all of this off.
import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
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

let postgresPinned = false

/** One line for the results: where things ran. */
export const placement = () =>
  pinned
    ? `load generator (autocannon, and wrk where a scenario runs it) pinned to CPU ${LOAD_GENERATOR_CPUS}; servers under test, their redis-server${postgresPinned ? ' and Postgres' : ''} to CPU ${UNDER_TEST_CPUS}${postgresPinned ? '' : ' (Postgres unpinned: not on this machine, or not allowed)'}`
    : 'unpinned: load generator and servers share every CPU'

/**
 * A load generator run as its own program (wrk) on the load generator's CPU: `[command, args]` to
 * spawn, prefixed with taskset when pinned.
 */
export function onLoadGeneratorCpu(command: string, args: string[]): [string, string[]] {
  return pinned ? ['taskset', ['-c', LOAD_GENERATOR_CPUS, command, ...args]] : [command, args]
}

/** Pins this process, all of its threads, to the load generator's CPU. */
export function pinLoadGenerator(): void {
  if (pinned)
    execFileSync('taskset', ['-a', '-p', '-c', LOAD_GENERATOR_CPUS, String(process.pid)], { stdio: 'ignore' })
}

/** Pins a running process under test, all of its threads, to the CPUs under test. */
export function pinUnderTest(pid: number): void {
  if (pinned) execFileSync('taskset', ['-a', '-p', '-c', UNDER_TEST_CPUS, String(pid)], { stdio: 'ignore' })
}

/**
 * Pins a running process to the load generator's CPU: work the measured layout runs on machines
 * of its own (the transfer-event consumers of the events scenario), kept off the CPUs under test.
 */
export function pinBesideLoadGenerator(pid: number): void {
  if (pinned)
    execFileSync('taskset', ['-a', '-p', '-c', LOAD_GENERATOR_CPUS, String(pid)], { stdio: 'ignore' })
}

/** The parent pid of a process: field 4 of /proc/<pid>/stat (the name, field 2, may hold spaces). */
function parentOf(pid: number | string): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
}

/** Child pids of `pid` (Linux /proc). */
function childrenOf(pid: number): number[] {
  return readdirSync('/proc')
    .filter((entry) => /^\d+$/.test(entry))
    .filter((entry) => {
      try {
        return parentOf(entry) === pid
      } catch {
        return false
      }
    })
    .map(Number)
}

/**
 * Pins the machine's Postgres (the postmaster, found as the parent of this connection's backend,
 * and every process it has started; new backends inherit) to the CPUs under test, and returns how
 * to give it back its former CPUs (synchronous, so that it can run on 'exit'). Postgres must be on
 * this machine; when it is not, or the pinning is refused, it stays where it is and `placement`
 * says so.
 */
export async function pinPostgres(db: { query(sql: string): Promise<{ rows: Array<{ pid: number }> }> }) {
  if (!pinned) return () => {}
  try {
    const { rows } = await db.query('SELECT pg_backend_pid() AS pid')
    const postmaster = parentOf(rows[0]!.pid)
    const before = execFileSync('taskset', ['-p', '-c', String(postmaster)])
      .toString()
      .split(': ')[1]!
      .trim()
    const pin = (cpus: string) => {
      for (const pid of [postmaster, ...childrenOf(postmaster)]) {
        try {
          execFileSync('taskset', ['-p', '-c', cpus, String(pid)], { stdio: 'ignore' })
        } catch {
          // A backend that exited meanwhile.
        }
      }
    }
    pin(UNDER_TEST_CPUS)
    postgresPinned = true
    return () => {
      if (!postgresPinned) return
      pin(before)
      postgresPinned = false
    }
  } catch {
    return () => {}
  }
}
