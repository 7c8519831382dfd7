import assert from 'node:assert/strict'
import { test } from 'node:test'
import type { RedisClient } from '../../src/redis/client.ts'
import { buildTestApp, createCustomer, login } from '../helpers/gateway.ts'
import { readIdempotencyRecord } from '../helpers/idempotency-record.ts'
import { scanKeys } from '../helpers/index.ts'

// The size of the idempotency record the demo keeps for a transfer (the record's layout itself is
// tested on a plain app in test/plugins/idempotency/record.test.ts).

/** What a completed record may cost in Redis: the bound asserted below. */
const RECORD_BYTES_BOUND = 300
const DAY_MS = 86_400_000
const JSON_TYPE = 'application/json; charset=utf-8'

test(`a completed demo transfer's record takes at most ${RECORD_BYTES_BOUND} bytes (MEMORY USAGE)`, async (t) => {
  const gateway = await buildTestApp({ RATE_LIMITS: 'off' })
  t.after(() => gateway.close())
  const alice = await createCustomer(gateway.db, 'alice', [1_000_000])
  const bob = await createCustomer(gateway.db, 'bob', [1_000_000])
  const cookie = await login(gateway.app, alice)
  const send = (amount: number) =>
    gateway.app.inject({
      method: 'POST',
      url: '/transfers',
      headers: { cookie, 'idempotency-key': 'memory-1' },
      payload: {
        fromAccountId: alice.accountIds[0],
        toAccountId: bob.accountIds[0],
        amount,
        currency: 'VND',
      },
    })
  const first = await send(700)
  assert.equal(first.statusCode, 201, first.body)
  const [recordKey, ...others] = await scanKeys(gateway.redis, `${gateway.prefix}idem:`)
  assert.deepEqual(others, [])
  const record = await readIdempotencyRecord(gateway.redis, recordKey!)
  assert.equal(record?.state, 'done')
  assert.equal(record!.status, 201)
  assert.deepEqual(record!.body, first.rawPayload)
  const bytes = Number(await gateway.redis.call('MEMORY', 'USAGE', recordKey!, 'SAMPLES', '0'))
  t.diagnostic(
    `MEMORY USAGE of a completed transfer's record: ${bytes} bytes (body ${first.rawPayload.length} bytes, key ${recordKey!.length} characters, Redis ${await redisVersion(gateway.redis)}); ` +
      `a day of retention at 100 transfers/s: ${((bytes * 8_640_000) / 2 ** 30).toFixed(2)} GiB`,
  )
  assert.ok(bytes <= RECORD_BYTES_BOUND, `${bytes} bytes`)
  const ttl = await gateway.redis.pttl(recordKey!)
  assert.ok(ttl > DAY_MS - 60_000 && ttl <= DAY_MS, String(ttl))
  // The compact record answers as before: the same bytes, and 422 for another body.
  const replay = await send(700)
  assert.equal(replay.statusCode, 201)
  assert.equal(replay.headers['idempotent-replayed'], 'true')
  assert.equal(replay.headers['content-type'], JSON_TYPE)
  assert.deepEqual(replay.rawPayload, first.rawPayload)
  assert.equal((await send(701)).statusCode, 422)
})

async function redisVersion(redis: RedisClient): Promise<string> {
  const node = 'nodes' in redis ? redis.nodes('master')[0]! : redis
  return /redis_version:(\S+)/.exec(await node.info('server'))?.[1] ?? 'unknown'
}
