import { readdirSync, readFileSync } from 'node:fs'
import type { Cluster, Redis } from 'ioredis'

export type RedisClient = Redis | Cluster

const dir = new URL('.', import.meta.url)

/** `fixed-window.lua` is registered as the command `fixedWindow`. */
function commandName(file: string): string {
  return file.replace(/\.lua$/, '').replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())
}

export const scriptSources: Record<string, string> = Object.fromEntries(
  readdirSync(dir)
    .filter((file) => file.endsWith('.lua'))
    .map((file) => [commandName(file), readFileSync(new URL(file, dir), 'utf8')]),
)

/** Registers every src/lua/*.lua once; ioredis then runs them by EVALSHA and falls back to EVAL. */
export function defineScripts(client: RedisClient): void {
  for (const [name, lua] of Object.entries(scriptSources)) client.defineCommand(name, { lua })
}

type ScriptFn = (numberOfKeys: number, ...keysAndArgs: Array<string | number>) => Promise<unknown>

/** Runs a script registered by defineScripts; the reply type is the caller's promise, checked by its tests. */
export function runScript<T>(
  client: RedisClient,
  name: string,
  keys: readonly string[],
  args: ReadonlyArray<string | number> = [],
): Promise<T> {
  const fn = (client as unknown as Record<string, ScriptFn | undefined>)[name]
  if (!fn) throw new Error(`Unknown Lua script '${name}'; expected src/lua/ to hold it`)
  return fn.call(client, keys.length, ...keys, ...args) as Promise<T>
}
