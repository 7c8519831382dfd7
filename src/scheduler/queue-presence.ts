import type { DelayedQueue, RedisClient } from 'fastify-redis-gateway'

/**
 * Which of `ids` the queue holds anywhere: in any registered instance's delayed set or processing
 * list, or in the ready list. One MULTI over the queue's keys (one hash tag, one slot), so the
 * answer is a snapshot: an id the mover moves meanwhile is not missed. An id the check reports
 * missing although it was just scheduled is re-added by the caller: at worst one extra delivery,
 * which the schedule's row lock makes harmless.
 */
export async function queuedIds(
  redis: RedisClient,
  queue: DelayedQueue,
  ids: string[],
): Promise<Set<string>> {
  const found = new Set<string>()
  if (ids.length === 0) return found
  const registered = await redis.smembers(queue.keys.instances)
  const instances = [...new Set([...registered, queue.instanceId])]
  const multi = redis.multi()
  for (const instance of instances) multi.zmscore(queue.keys.delayed(instance), ...ids)
  multi.lrange(queue.keys.ready, 0, -1)
  for (const instance of instances) multi.lrange(queue.keys.processing(instance), 0, -1)
  const replies = (await multi.exec()) ?? []
  const wanted = new Set(ids)
  replies.forEach(([error, reply], index) => {
    if (error) throw error
    if (index < instances.length) {
      ;(reply as Array<string | null>).forEach((score, i) => {
        if (score !== null) found.add(ids[i]!)
      })
    } else {
      for (const id of reply as string[]) if (wanted.has(id)) found.add(id)
    }
  })
  return found
}
