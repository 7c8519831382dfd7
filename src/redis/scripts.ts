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
  'rateLimitConcurrency',
  'rateLimitFixedWindow',
  'rateLimitGcra',
  'rateLimitInstances',
  'rateLimitOverride',
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

/** Every script by name, with its SHA1. */
export const scriptSources: ReadonlyMap<string, Script> = scripts

const scriptBySha = new Map([...scripts].map(([name, { sha }]) => [sha, name]))
const scriptByLua = new Map([...scripts].map(([name, { lua }]) => [lua, name]))

/**
 * The name of the script an `EVALSHA` or `EVAL` runs (its first argument: the digest, or the
 * source), if it is one of ours; undefined for any other command. EVALSHA carries only a digest:
 * metrics and spans name the script by it.
 */
export function scriptNameOf(command: string, args: readonly unknown[]): string | undefined {
  const name = command.toLowerCase()
  if (name === 'evalsha') return scriptBySha.get(String(args[0]))
  if (name === 'eval') return scriptByLua.get(String(args[0]))
  return undefined
}

export type Arg = string | number | Buffer

/** What the runner needs of a client: ioredis's `call` and `callBuffer` (a Redis or a Cluster, ioredis or iovalkey). */
export interface ScriptClient {
  call(...args: never[]): Promise<unknown>
  callBuffer(...args: never[]): Promise<unknown>
}

/**
 * Runs a script of src/lua on any client, nothing defined on it beforehand: EVALSHA, and when the
 * server does not know the script (first use, a restart, SCRIPT FLUSH, a failover to a node that
 * never saw it) EVAL, which also caches it there. `buffers` returns bulk strings as Buffers, byte-exact.
 */
let reloads = 0

/**
 * How many times this process sent a script's text because Redis no longer had it (NOSCRIPT,
 * after a restart or SCRIPT FLUSH): such a call runs after the commands sent behind it.
 */
export const scriptReloads = () => reloads

function runScript(
  client: ScriptClient,
  name: ScriptName,
  keys: readonly string[],
  args: readonly Arg[],
  buffers: boolean,
): Promise<unknown> {
  const script = scripts.get(name)
  if (!script) throw new Error(`Unknown Lua script '${name}'`)
  const tail = [...keys, ...args]
  corkForTurn(client)
  const send = (buffers ? client.callBuffer : client.call) as (...args: Arg[]) => Promise<unknown>
  return send.call(client, 'evalsha', script.sha, keys.length, ...tail).catch((err: Error) => {
    if (!err?.message?.startsWith('NOSCRIPT')) throw err
    reloads++
    return send.call(client, 'eval', script.lua, keys.length, ...tail)
  })
}

// A script's definition names its KEYS and ARGV in order: 'name' is one entry, '...name' the rest
// as a list (last only). A call passes them by name and gets the reply decoded, so no caller
// indexes a flat array or compares a bare reply number.

type Slots = readonly string[]

/** The values a call passes for `slots`: one per name, a list for the '...name' one. */
export type Named<S extends Slots, V> = {
  readonly [P in S[number] as P extends `...${infer Rest}` ? Rest : P]: P extends `...${string}`
    ? readonly V[]
    : V
}

/** Turns a script's raw reply (as ioredis hands it) into what the caller works with. */
export type Decoder<R> = (raw: unknown) => R

export interface ScriptDefinition<K extends Slots = Slots, A extends Slots = Slots, R = unknown> {
  readonly name: ScriptName
  readonly keys: K
  readonly args: A
  /** A script doing several things takes which one as ARGV[1], before the named arguments. */
  readonly mode?: string
  readonly reply: Decoder<R>
  /** Bulk strings come back as Buffers, byte-exact. */
  readonly buffers?: boolean
}

/** A script's KEYS and ARGV names, per mode for one doing several things (checked against its Lua header). */
export interface ScriptShape {
  keys: Slots
  /** By mode; '' for a script of one mode. */
  args: Readonly<Record<string, Slots>>
}

const definitions = new Map<ScriptName, ScriptShape>()

/** Every script's definition by name, each given once. */
export const scriptDefinitions: ReadonlyMap<ScriptName, ScriptShape> = definitions

function register(name: ScriptName, shape: ScriptShape): void {
  if (definitions.has(name)) throw new Error(`Lua script '${name}' is defined twice`)
  for (const slots of [shape.keys, ...Object.values(shape.args)])
    if (slots.slice(0, -1).some((slot) => slot.startsWith('...')))
      throw new Error(`Lua script '${name}': only the last name may take the rest ('...name')`)
  definitions.set(name, shape)
}

export function defineScript<const K extends Slots, const A extends Slots, R>(definition: {
  name: ScriptName
  keys: K
  args: A
  reply: Decoder<R>
  buffers?: boolean
}): ScriptDefinition<K, A, R> {
  register(definition.name, { keys: definition.keys, args: { '': definition.args } })
  return definition
}

type ModeDefinitions = Record<string, { args: Slots; reply: Decoder<unknown> }>

/** A script that does several things, ARGV[1] saying which: one definition per mode, each called alone. */
export function defineModes<const K extends Slots, const M extends ModeDefinitions>(definition: {
  name: ScriptName
  keys: K
  modes: M
}): { [Mode in keyof M & string]: ScriptDefinition<K, M[Mode]['args'], ReturnType<M[Mode]['reply']>> } {
  const { name, keys, modes } = definition
  register(name, {
    keys,
    args: Object.fromEntries(Object.entries(modes).map(([mode, { args }]) => [mode, args])),
  })
  return Object.fromEntries(
    Object.entries(modes).map(([mode, { args, reply }]) => [mode, { name, keys, args, mode, reply }]),
  ) as never
}

// A plain loop: a script's arguments are flattened on every call, and flatMap's callback and
// one-element arrays showed in the profile of the rate limiter's lease syncs.
function flatten<V>(slots: Slots, values: Record<string, V | readonly V[]>): V[] {
  const flat: V[] = []
  for (const slot of slots) {
    if (slot.startsWith('...')) for (const value of values[slot.slice(3)] as readonly V[]) flat.push(value)
    else flat.push(values[slot] as V)
  }
  return flat
}

/** Runs the script of `definition` with its keys and arguments by name, and decodes its reply. */
export async function callScript<K extends Slots, A extends Slots, R>(
  client: ScriptClient,
  definition: ScriptDefinition<K, A, R>,
  keys: Named<K, string>,
  args: Named<A, Arg>,
): Promise<R> {
  const argv = flatten<Arg>(definition.args, args)
  if (definition.mode !== undefined) argv.unshift(definition.mode)
  const raw = await runScript(
    client,
    definition.name,
    flatten<string>(definition.keys, keys),
    argv,
    definition.buffers ?? false,
  )
  return definition.reply(raw)
}

// Decoders of the replies scripts give.

/**
 * A reply that is one of a few codes, by name: `codes({ released: 1, notHolder: 0 })` decodes 1 as
 * 'released'. Any other reply is a script and its definition disagreeing, and throws.
 */
export function codes<const C extends Record<string, number | string>>(table: C): Decoder<keyof C & string> {
  const names = new Map(Object.entries(table).map(([name, code]) => [String(code), name]))
  return (raw) => {
    const name = names.get(String(raw))
    if (name === undefined)
      throw new Error(`unexpected script reply ${String(raw)}, not one of ${[...names.keys()]}`)
    return name as keyof C & string
  }
}

/** A count or another integer. */
export const integer: Decoder<number> = (raw) => Number(raw)

/** A reply the caller does not use. */
export const ignored: Decoder<void> = () => {}
