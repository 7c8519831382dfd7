// The CPU time a process under test and a redis-server have used so far: read before and after a
// measured window, the difference over the requests served is their CPU per request. On a shared
// machine that figure is steadier than req/s, and it does not depend on the load generator.
import { readdirSync, readFileSync } from 'node:fs'
import type { Redis } from 'ioredis'

/**
 * Seconds on CPU of every thread of a process (GC and libuv threads too), from
 * /proc/<pid>/task/<tid>/schedstat (nanoseconds, finer than the 10 ms ticks of /proc/<pid>/stat);
 * undefined off Linux or once the process has gone.
 */
export function processCpuSeconds(pid: number): number | undefined {
  try {
    const nanos = readdirSync(`/proc/${pid}/task`).reduce(
      (sum, task) => sum + Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0]),
      0,
    )
    return nanos / 1e9
  } catch {
    return undefined
  }
}

/** Seconds on CPU of redis-server (user and system, all threads: INFO cpu). */
export async function redisCpuSeconds(redis: Redis): Promise<number> {
  const info = await redis.info('cpu')
  const read = (name: string) => Number(new RegExp(`^${name}:([0-9.]+)`, 'm').exec(info)?.[1] ?? 0)
  return read('used_cpu_user') + read('used_cpu_sys')
}
