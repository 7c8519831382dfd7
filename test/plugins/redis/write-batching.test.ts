import assert from 'node:assert/strict'
import type { Writable } from 'node:stream'
import { after, before, test } from 'node:test'
import type { Redis } from 'ioredis'
import { connectRedis, createRedisClient } from '../../../src/plugins/redis/index.ts'
import { testRedisConnection } from '../../helpers/index.ts'

const batched = createRedisClient(testRedisConnection()) as Redis
const plain = createRedisClient({ ...testRedisConnection(), batchWrites: false }) as Redis
before(() => Promise.all([connectRedis(batched), connectRedis(plain)]))
after(() => Promise.all([batched.quit(), plain.quit()]))

/** Counts the socket writes (write and writev calls) the commands of one event-loop turn cause. */
async function writesForOneTurn(
  client: Redis,
  commands: number,
): Promise<{ writes: number; replies: string[] }> {
  type Write = (...args: unknown[]) => unknown
  const stream = client.stream as Writable & { _write: Write; _writev: Write }
  let writes = 0
  const write = stream._write
  const writev = stream._writev
  stream._write = function (...args: unknown[]) {
    writes++
    return write.apply(this, args)
  }
  stream._writev = function (...args: unknown[]) {
    writes++
    return writev.apply(this, args)
  }
  try {
    const replies = await Promise.all(Array.from({ length: commands }, (_, i) => client.echo(`m${i}`)))
    return { writes, replies }
  } finally {
    stream._write = write
    stream._writev = writev
  }
}

test('commands sent in one event-loop turn leave in one write, each with its own reply in order', async () => {
  const { writes, replies } = await writesForOneTurn(batched, 100)
  assert.equal(writes, 1)
  assert.deepEqual(
    replies,
    Array.from({ length: 100 }, (_, i) => `m${i}`),
  )
  assert.equal(batched.stream.writableCorked, 0, 'uncorked once the turn is over')
})

test('with batchWrites: false every command is its own write', async () => {
  const { writes, replies } = await writesForOneTurn(plain, 100)
  assert.equal(writes, 100)
  assert.equal(replies.length, 100)
})
