import type { RedisClient } from '../../redis/client.ts'

interface Batch {
  members: string[]
  /** Settles with the batch's HDEL. */
  removed: Promise<unknown>
  send: () => void
}

/**
 * Concurrency slots given back to Redis, gathered per key and sent once per event-loop turn: the
 * requests that end in the same turn give their slots back in one HDEL per key instead of one
 * each, which is most of what a slot costs Redis under load. A slot waits at most one turn, and
 * its HDEL is written before any command of a later turn on the same connection, so a client's
 * next request never finds its own previous slot still held.
 */
export class SlotReturns {
  private pending = new Map<string, Batch>()

  constructor(private readonly redis: RedisClient) {}

  giveBack(key: string, members: string[]): Promise<void> {
    let batch = this.pending.get(key)
    if (!batch) {
      if (this.pending.size === 0) setImmediate(() => this.flush())
      let send!: () => void
      const gate = new Promise<void>((resolve) => {
        send = resolve
      })
      const created: Batch = { members: [], send, removed: gate }
      created.removed = gate.then(() => this.redis.hdel(key, ...created.members))
      this.pending.set(key, created)
      batch = created
    }
    batch.members.push(...members)
    return batch.removed.then(() => undefined)
  }

  /** Sends every batch gathered; resolves when Redis has answered them (close awaits this). */
  flush(): Promise<unknown> {
    const batches = [...this.pending.values()]
    this.pending = new Map()
    for (const batch of batches) batch.send()
    return Promise.allSettled(batches.map((b) => b.removed))
  }
}
