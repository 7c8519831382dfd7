// The accuracy benchmark's load and its reading (load/accuracy.ts): an open-loop schedule of GET
// /hit requests spread round-robin over the instances (keep-alive node:http agents), every answer
// recorded with the window it was counted in (load/servers/rate-limit-accuracy.ts's headers), then
// admissions grouped per fixed window and compared with the limit.
import { Agent, request as httpRequest } from 'node:http'

/** One instance under load. */
export interface Target {
  url: URL
  agent: Agent
  /** Set when the instance was killed: errors of its requests after this are lost, not failures. */
  killedAt?: number
}

export const target = (url: string): Target => ({
  url: new URL(url),
  agent: new Agent({ keepAlive: true, maxSockets: 128 }),
})

/** One request of the schedule and its answer. */
export interface Shot {
  /** Date.now() when sent (the driver's clock; the instances share the machine's). */
  sentAt: number
  instance: number
  /** 200 admitted, 429 refused, 0 no answer (`error`). */
  status: number
  /** The instance's Date.now() + resetMs: when the window the decision counted in ends. */
  windowEnd: number
  decidedAt: number
  resetMs: number
  degraded: boolean
  error?: string
}

function hit(t: Target, instance: number, key: string): Promise<Shot> {
  const sentAt = Date.now()
  return new Promise((resolve) => {
    const req = httpRequest(
      { host: t.url.hostname, port: t.url.port, path: `/hit?k=${encodeURIComponent(key)}`, agent: t.agent },
      (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (chunk: string) => {
          body += chunk
        })
        res.on('end', () =>
          resolve({
            sentAt,
            instance,
            status: res.statusCode ?? 0,
            windowEnd: Number(res.headers['x-window-end']),
            decidedAt: Number(res.headers['x-decided-at']),
            resetMs: Number(res.headers['x-reset-ms']),
            degraded: body === 'degraded',
          }),
        )
        res.on('error', (err) => resolve(failed(sentAt, instance, err)))
      },
    )
    req.on('error', (err) => resolve(failed(sentAt, instance, err)))
    req.end()
  })
}

const failed = (sentAt: number, instance: number, err: Error): Shot => ({
  sentAt,
  instance,
  status: 0,
  windowEnd: Number.NaN,
  decidedAt: Number.NaN,
  resetMs: Number.NaN,
  degraded: false,
  error: err.message,
})

export type Traffic = 'steady' | 'bursty'

export interface Schedule {
  traffic: Traffic
  /** Requests per second, on average. */
  rate: number
  durationMs: number
  /** Bursty: every this many ms, all of the period's requests at once. */
  burstEveryMs: number
}

/** Something done at an offset of the run (a fault): awaited only at the end. */
export interface RunEvent {
  atMs: number
  run: () => Promise<unknown>
}

/**
 * Sends the schedule's requests at their times (open loop: a late tick sends every request due,
 * whatever the answers), request i to `targets()[i % length]` (the list may change: a fault).
 */
export async function drive(
  targets: () => Target[],
  key: string,
  schedule: Schedule,
  events: RunEvent[] = [],
): Promise<{ shots: Shot[]; startedAt: number; endedAt: number }> {
  const times: number[] = []
  if (schedule.traffic === 'steady') {
    const every = 1000 / schedule.rate
    for (let t = 0; t < schedule.durationMs; t += every) times.push(t)
  } else {
    const size = Math.round((schedule.rate * schedule.burstEveryMs) / 1000)
    for (let t = 0; t < schedule.durationMs; t += schedule.burstEveryMs)
      for (let i = 0; i < size; i++) times.push(t)
  }
  const pending: Array<Promise<Shot>> = []
  const fired: Array<Promise<unknown>> = []
  const todo = [...events].sort((a, b) => a.atMs - b.atMs)
  const startedAt = Date.now()
  let next = 0
  while (next < times.length) {
    const elapsed = Date.now() - startedAt
    while (todo.length && todo[0]!.atMs <= elapsed) fired.push(todo.shift()!.run())
    const list = targets()
    while (next < times.length && times[next]! <= elapsed) {
      const index = next % list.length
      pending.push(hit(list[index]!, index, key))
      next++
    }
    await new Promise((resolve) => setTimeout(resolve, 1))
  }
  const endedAt = Date.now()
  const shots = await Promise.all(pending)
  await Promise.all(fired)
  return { shots, startedAt, endedAt }
}

/** One fixed window as the admissions name it (their x-window-end), with the demand sent in it. */
export interface WindowRow {
  start: number
  end: number
  admitted: number
  /** Requests sent in [start, end). */
  demand: number
  /** max(0, admitted - limit) / limit, %. */
  overPct: number
  /** max(0, limit - admitted) / limit, % (0 when the demand did not exceed the limit). */
  underPct: number
  /** Admissions whose decision time falls in [start, end) (an independent grouping, ±1 ms at the edges). */
  admittedByDecision: number
}

/**
 * Admissions grouped by the window they were counted in: their window ends sorted, a new window
 * where two ends are more than half a window apart. Only whole windows inside the run are kept
 * (the first starts with the run's first request; the last one cut by the run's end is dropped).
 */
export function fixedWindows(
  shots: Shot[],
  limit: number,
  windowMs: number,
  run: { startedAt: number; endedAt: number },
): WindowRow[] {
  const admitted = shots.filter((s) => s.status === 200).sort((a, b) => a.windowEnd - b.windowEnd)
  const clusters: Shot[][] = []
  for (const shot of admitted) {
    const last = clusters.at(-1)
    if (last && shot.windowEnd - last.at(-1)!.windowEnd <= windowMs / 2) last.push(shot)
    else clusters.push([shot])
  }
  const rows: WindowRow[] = []
  for (const cluster of clusters) {
    const ends = cluster.map((s) => s.windowEnd)
    const end = ends[Math.floor(ends.length / 2)]!
    const start = end - windowMs
    if (start < run.startedAt - 20 || end > run.endedAt) continue
    const demand = shots.filter((s) => s.sentAt >= start && s.sentAt < end).length
    const over = Math.max(0, cluster.length - limit)
    const under = demand > limit ? Math.max(0, limit - cluster.length) : 0
    rows.push({
      start,
      end,
      admitted: cluster.length,
      demand,
      overPct: (over / limit) * 100,
      underPct: (under / limit) * 100,
      admittedByDecision: admitted.filter((s) => s.decidedAt >= start && s.decidedAt < end).length,
    })
  }
  return rows
}
