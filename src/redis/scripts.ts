import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { corkForTurn } from './batching.ts'

// The scripts themselves live in src/lua (copied beside this folder by the build).
const dir = new URL('../lua/', import.meta.url)

/**
 * Every script of src/lua by name (`rate-limit-gcra.lua` is `rateLimitGcra`), so a misspelled
 * name fails the type check; loading refuses a folder that does not hold exactly these scripts.
 */
const SCRIPT_NAMES = [
  'bloomAdd',
  'bloomBegin',
  'bloomCheck',
  'bloomFinish',
  'cacheFill',
  'cacheGet',
  'cacheInvalidate',
  'cacheRelease',
  'cacheSet',
  'cacheTags',
  'delayedQueueAck',
  'delayedQueueAdopt',
  'delayedQueueHandBack',
  'delayedQueueHeartbeat',
  'delayedQueueMove',
  'delayedQueueNack',
  'delayedQueueRemove',
  'delayedQueueReturnStuck',
  'delayedQueueSchedule',
  'delayedQueueTake',
  'feedBuild',
  'feedFanout',
  'feedFanoutStart',
  'feedFollow',
  'feedMarked',
  'feedProducers',
  'feedPublish',
  'feedRead',
  'feedRemove',
  'feedRemoved',
  'feedTimeline',
  'idempotencyClaim',
  'idempotencyComplete',
  'idempotencyRelease',
  'idempotencyRenew',
  'leaderboardAdd',
  'lockAcquire',
  'lockExtend',
  'lockHolder',
  'lockRelease',
  'rateLimitFixedWindow',
  'rateLimitGcra',
  'rateLimitSlidingCounter',
  'rateLimitSlidingLog',
  'rateLimitTokenBucket',
  'sessionCreate',
  'sessionDescribe',
  'sessionIndexAdd',
  'sessionSet',
  'shardedCounterAdd',
  'streamAppendJson',
  'streamAppendOnce',
] as const

export type ScriptName = (typeof SCRIPT_NAMES)[number]

interface Script {
  lua: string
  sha: string
}

/** `rate-limit-gcra.lua` is the script `rateLimitGcra`. */
function scriptName(file: string): string {
  return file.replace(/\.lua$/, '').replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())
}

/**
 * Redis runs each script as one text, so code several scripts share lives in include/<name>.lua and
 * a line `-- #include <name>` is replaced by it when the script is read.
 */
function withIncludes(lua: string): string {
  return lua.replace(/^-- #include ([a-z0-9-]+)\n/gm, (_, name: string) =>
    readFileSync(new URL(`include/${name}.lua`, dir), 'utf8'),
  )
}

function loadScripts(): Map<ScriptName, Script> {
  const found = new Map<string, Script>(
    readdirSync(dir)
      .filter((file) => file.endsWith('.lua'))
      .map((file) => {
        const lua = withIncludes(readFileSync(new URL(file, dir), 'utf8'))
        return [scriptName(file), { lua, sha: createHash('sha1').update(lua).digest('hex') }]
      }),
  )
  const listed = new Set<string>(SCRIPT_NAMES)
  const unlisted = [...found.keys()].filter((name) => !listed.has(name))
  const missing = SCRIPT_NAMES.filter((name) => !found.has(name))
  if (unlisted.length || missing.length)
    throw new Error(
      `src/lua and SCRIPT_NAMES disagree: ${[...unlisted.map((name) => `${name} is not listed`), ...missing.map((name) => `${name} has no file`)].join('; ')}`,
    )
  return found as Map<ScriptName, Script>
}

const scripts = loadScripts()

/** Every script by name, with its SHA1 (the metrics plugin names EVALSHA calls by it). */
export const scriptSources: ReadonlyMap<string, Script> = scripts

type Arg = string | number | Buffer

/** What the runner needs of a client: ioredis's `call` and `callBuffer` (a Redis or a Cluster, ioredis or iovalkey). */
export interface ScriptClient {
  call(...args: never[]): Promise<unknown>
  callBuffer(...args: never[]): Promise<unknown>
}

/**
 * Runs a script of src/lua on any client, nothing defined on it beforehand: EVALSHA, and when the
 * server does not know the script (first use, a restart, SCRIPT FLUSH, a failover to a node that
 * never saw it) EVAL, which also caches it there. `buffers` returns bulk strings as Buffers, byte-exact.
 * The reply type is the caller's, checked by its tests.
 */
export function runScript<T>(
  client: ScriptClient,
  name: ScriptName,
  keys: readonly string[],
  args: readonly Arg[] = [],
  { buffers = false } = {},
): Promise<T> {
  const script = scripts.get(name)
  if (!script) throw new Error(`Unknown Lua script '${name}'`)
  const tail = [...keys, ...args]
  corkForTurn(client)
  const send = (buffers ? client.callBuffer : client.call) as (...args: Arg[]) => Promise<T>
  return send.call(client, 'evalsha', script.sha, keys.length, ...tail).catch((err: Error) => {
    if (!err?.message?.startsWith('NOSCRIPT')) throw err
    return send.call(client, 'eval', script.lua, keys.length, ...tail)
  })
}
