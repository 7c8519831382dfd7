// What a run cost the CPUs under test (where Postgres, Redis and the servers under test run), per
// unit of work (a committed transfer): steadier than req/s on a shared machine, and it shows where
// the time went.
import { readFileSync } from 'node:fs'
import type { Redis } from 'ioredis'
import { processCpuSeconds, redisCpuSeconds } from './cpu-time.ts'
import { pinned } from './cpus.ts'
import { median } from './runner.ts'

/** A /proc file, or '' off Linux (the CPU figures are then 0). */
const readProc = (path: string) => {
  try {
    return readFileSync(path, 'utf8')
  } catch {
    return ''
  }
}

/** Clock ticks per second of /proc (USER_HZ: 100 on Linux). */
const TICK_MICROS = 10_000

/**
 * Busy and total ticks of the CPUs under test (every CPU but the load generator's 0 when pinned,
 * all of them otherwise) and of the load generator's CPU (when pinned), from /proc/stat.
 */
function cpuTicks() {
  const underTest = { busy: 0, total: 0 }
  const loadGenerator = { busy: 0, total: 0 }
  for (const line of readProc('/proc/stat').split('\n')) {
    const match = /^cpu(\d+) (.*)$/.exec(line)
    if (!match) continue
    // user nice system idle iowait irq softirq steal ...
    const [user, nice, system, idle, iowait, irq, softirq, steal] = match[2]!
      .split(' ')
      .map(Number) as number[]
    const working = user! + nice! + system! + irq! + softirq! + steal!
    const cpu = pinned && match[1] === '0' ? loadGenerator : underTest
    cpu.busy += working
    cpu.total += working + idle! + iowait!
  }
  return { underTest, loadGenerator }
}

/** Share of `after - before` ticks that were busy. */
const busyShare = (before: { busy: number; total: number }, after: { busy: number; total: number }) =>
  (after.busy - before.busy) / Math.max(1, after.total - before.total)

/** What one run cost the CPUs under test, per unit of work done. */
export interface CpuCost {
  units: number
  /** Share of the CPUs under test busy during the run (1 = saturated). */
  busy: number
  /** Share of the load generator's CPU busy during the run (0 when not pinned). */
  loadGeneratorBusy: number
  /** µs of the CPUs under test per unit: Postgres, Redis, the servers and the kernel together. */
  underTestMicros: number
  /** µs of the server process per unit (0 where it sat idle). */
  serverMicros: number
  /** µs of redis-server per unit (INFO cpu). */
  redisMicros: number
}

/**
 * Runs `run` and measures it: `units` counts the work done so far (e.g. transfers in Postgres),
 * read before and after.
 */
export async function costOf<T>(
  probes: { redis: Redis; serverPid: number; units: () => Promise<number> },
  run: () => Promise<T>,
): Promise<{ result: T; cost: CpuCost }> {
  const unitsBefore = await probes.units()
  const redisBefore = await redisCpuSeconds(probes.redis)
  const cpuBefore = cpuTicks()
  const serverBefore = processCpuSeconds(probes.serverPid) ?? 0
  const result = await run()
  const cpuAfter = cpuTicks()
  const serverAfter = processCpuSeconds(probes.serverPid) ?? 0
  const redisAfter = await redisCpuSeconds(probes.redis)
  const units = (await probes.units()) - unitsBefore
  const perTicks = (ticks: number) => (units ? (ticks * TICK_MICROS) / units : 0)
  const perSecond = (seconds: number) => (units ? (seconds * 1e6) / units : 0)
  return {
    result,
    cost: {
      units,
      busy: busyShare(cpuBefore.underTest, cpuAfter.underTest),
      loadGeneratorBusy: busyShare(cpuBefore.loadGenerator, cpuAfter.loadGenerator),
      underTestMicros: perTicks(cpuAfter.underTest.busy - cpuBefore.underTest.busy),
      serverMicros: perSecond(serverAfter - serverBefore),
      redisMicros: perSecond(redisAfter - redisBefore),
    },
  }
}

/** Medians of the CPU figures over rounds. */
export const costSpread = (costs: CpuCost[]) => ({
  busy: median(costs.map((c) => c.busy)),
  loadGeneratorBusy: median(costs.map((c) => c.loadGeneratorBusy)),
  underTestMicros: median(costs.map((c) => c.underTestMicros)),
  serverMicros: median(costs.map((c) => c.serverMicros)),
  redisMicros: median(costs.map((c) => c.redisMicros)),
})
