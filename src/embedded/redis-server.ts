import { spawn } from 'node:child_process'
import { createConnection, createServer } from 'node:net'

/** True when something speaking RESP answers PING at host:port. */
export function redisAnswers(host: string, port: number, timeoutMs = 500): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createConnection({ host, port })
    const done = (ok: boolean) => {
      socket.destroy()
      resolve(ok)
    }
    socket.setTimeout(timeoutMs, () => done(false))
    socket.on('error', () => done(false))
    socket.on('connect', () => socket.write('PING\r\n'))
    socket.on('data', (data) => done(data.toString().startsWith('+PONG')))
  })
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0))
    })
  })
}

export interface RedisServerProcess {
  url: string
  port: number
  /** SIGTERM, then waits for the exit. */
  stop(): Promise<void>
  /** SIGKILL: a crash, for fault-injection tests. */
  kill(): Promise<void>
}

export const HOW_TO_GET_REDIS = [
  'No Redis answers on 127.0.0.1:6379 and redis-server is not on PATH.',
  'Set REDIS_URL, or install Redis 7+:',
  '  Debian/Ubuntu: sudo apt-get install redis-server',
  '  macOS:         brew install redis',
  '  Docker:        docker compose up -d redis',
].join('\n')

/** Starts a throwaway redis-server (no persistence) on a free port; used by the dev default and tests. */
export async function startRedisServer(
  port?: number,
  command = 'redis-server',
  extraArgs: string[] = [],
): Promise<RedisServerProcess> {
  const chosen = port ?? (await freePort())
  const child = spawn(
    command,
    [
      '--port',
      String(chosen),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--protected-mode',
      'no',
      ...extraArgs,
    ],
    { stdio: 'ignore' },
  )
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  await new Promise<void>((resolve, reject) => {
    child.once('error', (err: NodeJS.ErrnoException) =>
      reject(err.code === 'ENOENT' ? new Error(HOW_TO_GET_REDIS) : err),
    )
    const deadline = Date.now() + 5000
    const poll = async () => {
      if (await redisAnswers('127.0.0.1', chosen)) return resolve()
      if (Date.now() > deadline || child.exitCode !== null)
        return reject(new Error('redis-server did not start'))
      setTimeout(poll, 50)
    }
    child.once('spawn', poll)
  })
  return {
    url: `redis://127.0.0.1:${chosen}`,
    port: chosen,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM')
      await exited
    },
    async kill() {
      if (child.exitCode === null) child.kill('SIGKILL')
      await exited
    },
  }
}

/**
 * The development default of DESIGN.md: an explicit URL wins; else Redis on the standard port;
 * else a private redis-server child (returned so the caller stops it on exit).
 */
export async function resolveDevRedis(
  url: string | undefined,
  probe = { host: '127.0.0.1', port: 6379 },
  command = 'redis-server',
): Promise<{ url: string; spawned?: RedisServerProcess }> {
  if (url) return { url }
  if (await redisAnswers(probe.host, probe.port)) return { url: `redis://${probe.host}:${probe.port}` }
  const spawned = await startRedisServer(undefined, command)
  return { url: spawned.url, spawned }
}
