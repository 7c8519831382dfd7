import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import type { Writable } from 'node:stream'
import type { Cluster, Redis } from 'ioredis'

/** Any ioredis client a user created: a single node or a Cluster. */
export type RedisClient = Redis | Cluster

/**
 * A client of a package with the ioredis API under its own types: iovalkey's `Redis` and `Cluster`
 * (its classes are not assignable to ioredis's, which have members of their own). What `isRedisClient`
 * checks at run time, plus the methods every caller of the library relies on.
 */
export interface IoredisCompatibleClient {
  readonly status: string
  sendCommand(...args: never[]): unknown
  call(...args: never[]): unknown
  duplicate(...args: never[]): unknown
}

/** What a plugin's `redis` option and a primitive accept: an ioredis client or an iovalkey one. */
export type AnyRedisClient = RedisClient | IoredisCompatibleClient

export const isCluster = (redis: RedisClient): redis is Cluster =>
  'nodes' in redis && typeof redis.nodes === 'function'

const dir = new URL('.', import.meta.url)

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

const scripts = new Map<string, Script>(
  readdirSync(dir)
    .filter((file) => file.endsWith('.lua'))
    .map((file) => {
      const lua = withIncludes(readFileSync(new URL(file, dir), 'utf8'))
      return [scriptName(file), { lua, sha: createHash('sha1').update(lua).digest('hex') }]
    }),
)

/** Every script by name, with its SHA1 (the metrics plugin names EVALSHA calls by it). */
export const scriptSources: ReadonlyMap<string, Script> = scripts

type Arg = string | number | Buffer

let corked: Writable[] = []
const uncorkAll = () => {
  for (const stream of corked) stream.uncork()
  corked = []
}

/**
 * The script calls of one event-loop turn (the requests that arrived together) leave in one write
 * on a user's own client too: the first call of a turn corks the connection's socket and
 * setImmediate, after the turn's I/O callbacks, uncorks it. Redis then reads them in one read and
 * answers in one write, instead of a syscall per call on each side. Order and replies are
 * unchanged and nothing waits beyond the turn; the user's other commands of the turn ride along.
 * A Cluster routes each command to its node's socket: left as it is.
 */
export function corkForTurn(client: RedisClient): void {
  const stream = (client as { stream?: Writable }).stream
  if (!stream || isCluster(client) || corked.includes(stream)) return
  stream.cork()
  if (corked.length === 0) setImmediate(uncorkAll)
  corked.push(stream)
}

/**
 * Runs a script of src/lua on any client, nothing defined on it beforehand: EVALSHA, and when the
 * server does not know the script (first use, a restart, SCRIPT FLUSH, a failover to a node that
 * never saw it) EVAL, which also caches it there. `buffers` returns bulk strings as Buffers, byte-exact.
 * The reply type is the caller's, checked by its tests.
 */
export function runScript<T>(
  client: RedisClient,
  name: string,
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
