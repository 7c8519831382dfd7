import { type ChildProcess, spawn } from 'node:child_process'
import { RUN_TYPESCRIPT } from './tsx.ts'

/** A demo gateway process and what it printed. */
export interface DemoProcess {
  child: ChildProcess
  /** Its URL once it prints that it listens; rejects if it exits first. */
  listening: Promise<string>
  /** Its exit code. */
  exited: Promise<number | null>
  output(): string
}

/**
 * Runs `src/server.ts` like `npm start` does, with only `env` (and PATH, HOME) in its environment
 * and `nodeArgs` before the entry (a `--import` probe, say). The caller kills it.
 */
export function startDemoProcess(env: Record<string, string>, nodeArgs: string[] = []): DemoProcess {
  const child = spawn(process.execPath, [...RUN_TYPESCRIPT, ...nodeArgs, 'src/server.ts'], {
    env: { PATH: process.env.PATH, HOME: process.env.HOME, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  const listening = new Promise<string>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(output)
      if (match) resolve(match[1]!)
    }
    child.stdout.on('data', onData)
    child.stderr.on('data', onData)
    exited.then((code) => reject(new Error(`exited ${code}: ${output}`)))
  })
  // A boot that is meant to fail never listens: that rejection is expected, not unhandled.
  listening.catch(() => {})
  return { child, listening, exited, output: () => output }
}
