import type { Writable } from 'node:stream'
import { type RedisClient, runScript } from '../../lua/index.ts'

/**
 * Script calls of requests that arrive in the same event-loop turn leave in one write: the
 * connection's socket is corked at the first call of a turn and uncorked in setImmediate, so
 * Node sends the buffered commands with one writev. Each call is still its own EVALSHA with its
 * own reply, in the order sent. Cluster clients route per slot, so with them (or `enabled` false)
 * every call is written on its own.
 */
export class ScriptBatcher {
  private readonly redis: RedisClient
  private readonly enabled: boolean
  private corked: Writable | null = null
  private readonly uncork = () => {
    this.corked?.uncork()
    this.corked = null
  }

  constructor(redis: RedisClient, enabled: boolean) {
    this.redis = redis
    this.enabled = enabled
  }

  call(script: string, keys: string[], argv: Array<string | number>): Promise<number[]> {
    if (this.enabled && this.corked === null) {
      const stream = (this.redis as { stream?: Writable }).stream
      if (stream) {
        stream.cork()
        this.corked = stream
        setImmediate(this.uncork)
      }
    }
    return runScript<number[]>(this.redis, script, keys, argv)
  }
}
