import { type RedisClient, runScript } from '../../lua/index.ts'

interface Pending {
  script: string
  keys: string[]
  argv: Array<string | number>
  resolve(reply: number[]): void
  reject(err: unknown): void
}

type ScriptPipeline = Record<string, (...args: unknown[]) => void> & {
  exec(): Promise<Array<[Error | null, unknown]> | null>
}

/**
 * Script calls of requests that arrive in the same event-loop turn leave as one pipeline: one
 * write here and one read in Redis instead of one each, which is most of the CPU a call costs on
 * both sides. Each call is still its own script with its own reply. Cluster clients route per
 * slot, so with them (or `enabled` false) every call goes out on its own.
 */
export class ScriptBatcher {
  private readonly redis: RedisClient
  private readonly enabled: boolean
  private queue: Pending[] = []

  constructor(redis: RedisClient, enabled: boolean) {
    this.redis = redis
    this.enabled = enabled
  }

  call(script: string, keys: string[], argv: Array<string | number>): Promise<number[]> {
    if (!this.enabled) return runScript<number[]>(this.redis, script, keys, argv)
    return new Promise((resolve, reject) => {
      if (this.queue.length === 0) setImmediate(() => this.flush())
      this.queue.push({ script, keys, argv, resolve, reject })
    })
  }

  private flush(): void {
    const batch = this.queue
    this.queue = []
    if (batch.length === 1) {
      const only = batch[0]!
      runScript<number[]>(this.redis, only.script, only.keys, only.argv).then(only.resolve, only.reject)
      return
    }
    const pipeline = this.redis.pipeline() as unknown as ScriptPipeline
    for (const c of batch) pipeline[c.script]!(c.keys.length, ...c.keys, ...c.argv)
    pipeline.exec().then(
      (results) =>
        batch.forEach((c, i) => {
          const [err, reply] = results?.[i] ?? [new Error('Redis pipeline returned no reply'), null]
          if (err) c.reject(err)
          else c.resolve(reply as number[])
        }),
      (err) => {
        for (const c of batch) c.reject(err)
      },
    )
  }
}
