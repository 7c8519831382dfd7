import type { Redis } from 'ioredis'
import { isCluster, type RedisClient } from '../../redis/client.ts'

// The consumer's own connection for its blocking reads (XREADGROUP BLOCK), apart from the caller's
// client.

/**
 * A connection of its own for the blocking reads, so they never hold up the caller's client. A read
 * is sent only while it is connected (no offline queue) and never sent again after a reconnect:
 * a read that timed out during an outage and went out once Redis was back would take entries for
 * a reply nobody awaits, and they would wait a visibility timeout. The loop waits for `ready`.
 */
export function blockingConnection(redis: RedisClient, blockMs: number): RedisClient {
  const commandTimeout = blockMs + 5000
  if (isCluster(redis)) {
    return redis.duplicate(undefined, {
      // Connects now even when the caller's client connects lazily: the loop waits for `ready`.
      lazyConnect: false,
      enableOfflineQueue: false,
      redisOptions: { ...redis.options.redisOptions, commandTimeout, autoResendUnfulfilledCommands: false },
    })
  }
  return (redis as Redis).duplicate({
    commandTimeout,
    maxRetriesPerRequest: null,
    lazyConnect: false,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
  })
}

/** Resolves once the connection is ready, or at once when it is (or `stopped` says to give up). */
export function whenReady(connection: RedisClient, stopped: () => boolean): Promise<void> {
  if (connection.status === 'ready' || stopped()) return Promise.resolve()
  return new Promise((resolve) => {
    const done = () => {
      clearInterval(poll)
      connection.off('ready', done)
      resolve()
    }
    connection.once('ready', done)
    // A stop disconnects the connection for good: no 'ready' comes, the loop must still end.
    const poll = setInterval(() => stopped() && done(), 50)
  })
}
