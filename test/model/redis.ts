import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import fc from 'fast-check'
import { Redis, type RedisOptions } from 'ioredis'
import { freePort, redisAnswers } from '../../src/embedded/redis-server.ts'
import { beforeEachCommand } from '../../src/redis/command-bounds.ts'
import { hashSlot } from '../../src/redis/keys.ts'
import { scriptSources } from '../../src/redis/scripts.ts'
import type { ModelCommand } from './harness.ts'

/**
 * A private redis-server for a model run: no persistence, its own port, a wall clock the model sets
 * (test/model/redis-clock.c), and the faults a model draws as commands: FLUSHALL, the loss of one
 * hash slot's keys, a restart (a crash: everything lost, same port, clients reconnect).
 */
export interface ModelRedis {
  readonly url: string
  readonly port: number
  /** The server's wall clock in epoch ms: TIME, key expiry and TTLs read it; it moves only when set. */
  readonly clock: RedisClock
  /** A connected client, closed by stop(); it fails fast while the server is down and reconnects after. */
  client(options?: RedisOptions): Promise<Redis>
  flushAll(): Promise<void>
  /** Deletes every key in the hash slot of `tag` (as one Cluster node losing that slot's data). Returns how many. */
  dropSlot(tag: string): Promise<number>
  /** SIGKILL and start again on the same port: every key is gone, clients reconnect. */
  restart(): Promise<void>
  /** Stops the server and closes every client. */
  stop(): Promise<void>
}

export interface RedisClock {
  now(): number
  set(ms: number): void
  advance(ms: number): void
}

/** 2030-01-01: a fixed start, so that a replayed run sees the same times. */
export const MODEL_EPOCH_MS = 1_893_456_000_000

const CLOCK_SOURCE = join(import.meta.dirname, 'redis-clock.c')

/** The clock library, compiled once per source version (cc is on every Debian with build tools). */
function clockLibrary(): string {
  const source = readFileSync(CLOCK_SOURCE)
  const hash = createHash('sha256').update(source).digest('hex').slice(0, 12)
  const library = join(tmpdir(), `redis-clock-${hash}.so`)
  if (existsSync(library)) return library
  const building = `${library}.${process.pid}.tmp`
  try {
    execFileSync('cc', ['-shared', '-fPIC', '-O2', '-o', building, CLOCK_SOURCE], { stdio: 'pipe' })
  } catch (err) {
    throw new Error(
      `The model runs need a C compiler for their Redis clock (${CLOCK_SOURCE}): apt-get install gcc. ${String(err)}`,
    )
  }
  execFileSync('mv', ['-f', building, library])
  return library
}

function clockFile(dir: string, startMs: number): { clock: RedisClock; close(): void } {
  const path = join(dir, 'clock')
  const fd = openSync(path, 'w+')
  let current = startMs
  const write = (ms: number) => {
    const bytes = Buffer.alloc(8)
    bytes.writeBigInt64LE(BigInt(ms))
    writeSync(fd, bytes, 0, 8, 0)
    current = ms
  }
  write(startMs)
  const clock: RedisClock = {
    now: () => current,
    set(ms) {
      if (!Number.isSafeInteger(ms) || ms <= 0) throw new Error(`clock: ${ms} is not an epoch ms`)
      write(ms)
    },
    advance(ms) {
      write(current + ms)
    },
  }
  return { clock, close: () => closeSync(fd) }
}

/** Resolves once the client's PING is answered (a fresh or reconnecting client). */
async function answering(client: Redis): Promise<void> {
  const deadline = Date.now() + 10_000
  for (;;) {
    try {
      await client.ping()
      return
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`model redis: the client did not reconnect: ${String(err)}`)
      await new Promise((resolve) => setTimeout(resolve, 10))
    }
  }
}

export async function startModelRedis({ startMs = MODEL_EPOCH_MS } = {}): Promise<ModelRedis> {
  const dir = mkdtempSync(join(tmpdir(), 'model-redis-'))
  const { clock, close: closeClock } = clockFile(dir, startMs)
  const port = await freePort()
  const env = { ...process.env, LD_PRELOAD: clockLibrary(), REDIS_CLOCK_FILE: join(dir, 'clock') }
  const clients = new Set<Redis>()
  let child: ChildProcess

  const start = async () => {
    child = spawn(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
      { stdio: 'ignore', env },
    )
    const deadline = Date.now() + 10_000
    while (!(await redisAnswers('127.0.0.1', port))) {
      if (Date.now() > deadline || child.exitCode !== null)
        throw new Error('model redis-server did not start')
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
  }
  const kill = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return
    const exited = new Promise((resolve) => child.once('exit', resolve))
    child.kill('SIGKILL')
    await exited
  }
  await start()
  const admin = new Redis(port, '127.0.0.1', { enableOfflineQueue: false, retryStrategy: () => 20 })
  admin.on('error', () => {})
  await answering(admin)

  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    clock,
    async client(options = {}) {
      const client = new Redis(port, '127.0.0.1', {
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        retryStrategy: () => 20,
        ...options,
      })
      // Connection errors are the faults the model draws; commands report their own.
      client.on('error', () => {})
      clients.add(client)
      await answering(client)
      return client
    },
    async flushAll() {
      await admin.flushall()
    },
    async dropSlot(tag) {
      const slot = hashSlot(tag)
      let dropped = 0
      let cursor = '0'
      do {
        const [next, keys] = await admin.scan(cursor, 'COUNT', 1000)
        cursor = next
        for (const key of keys) {
          const open = key.indexOf('{')
          const close = open >= 0 ? key.indexOf('}', open + 1) : -1
          const keyTag = close > open + 1 ? key.slice(open + 1, close) : key
          if (hashSlot(keyTag) === slot) dropped += await admin.del(key)
        }
      } while (cursor !== '0')
      return dropped
    },
    async restart() {
      await kill()
      await start()
      // Every client is back before the model's next command (ioredis retries every 20 ms).
      for (const client of [admin, ...clients]) if (client.status !== 'end') await answering(client)
    },
    async stop() {
      for (const client of clients) client.disconnect()
      admin.disconnect()
      await kill()
      closeClock()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/**
 * A data loss as a model command: FLUSHALL, or a restart (a crash: every key lost, clients
 * reconnect). `lose` first tells the model what went (and may read the real system as it stood).
 */
export class DataLoss<Model extends object, Real extends { server: ModelRedis }>
  implements ModelCommand<Model, Real>
{
  constructor(
    readonly kind: 'flushAll' | 'restart',
    readonly lose: (model: Model, real: Real) => unknown = () => {},
  ) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    await this.lose(model, real)
    await (this.kind === 'flushAll' ? real.server.flushAll() : real.server.restart())
  }
  toString() {
    return `${this.kind}()`
  }
}

/** Both data losses, drawn like any command. */
export const dataLosses = <Model extends object, Real extends { server: ModelRedis }>(
  lose?: (model: Model, real: Real) => unknown,
) => [
  fc.constant(new DataLoss<Model, Real>('flushAll', lose)),
  fc.constant(new DataLoss<Model, Real>('restart', lose)),
]

/** The model's clock and the server's moved together by `ms`, drawn like any command. */
export class Advance<Model extends { now: number }, Real extends { server: ModelRedis }>
  implements ModelCommand<Model, Real>
{
  constructor(readonly ms: number) {}
  check() {
    return true
  }
  async run(model: Model, real: Real) {
    model.now += this.ms
    real.server.clock.set(model.now)
  }
  toString() {
    return `advance(${this.ms})`
  }
}

/**
 * A stalled process as a fault: once armed, the event loop blocks for `ms` right after the client's
 * next command has left (a starved host, a long synchronous task), so its reply is in the socket
 * before the process can read it. A bound on that command that expires meanwhile must not fail it:
 * its reply came in time. Arming loads every library script first (a restart loses them): a call
 * answered NOSCRIPT would need a second round trip after the stall, and that one really is late.
 */
export function stallAfterNextCommand(client: Redis): { arm(ms: number): Promise<void>; disarm(): void } {
  let stallMs = 0
  beforeEachCommand(client, () => {
    if (stallMs === 0) return
    const ms = stallMs
    stallMs = 0
    // Queued after the setImmediate that sends a turn's corked commands: the command has left.
    setImmediate(() => {
      const until = performance.now() + ms
      while (performance.now() < until);
    })
  })
  return {
    async arm(ms) {
      for (const { lua } of scriptSources.values()) await client.script('LOAD', lua)
      stallMs = ms
    },
    disarm() {
      stallMs = 0
    },
  }
}
