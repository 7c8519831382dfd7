// What several rate-limit suites build alike: an app whose JSON log lines the test reads, a route
// that answers the status its query asks for, a suite's Redis client and key prefixes, a wait.
import assert from 'node:assert/strict'
import { Writable } from 'node:stream'
import { after, before } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import { keysWithoutTtl, testRedisConnection, uniquePrefix } from '../../helpers/index.ts'

/** A Fastify app whose JSON log lines (at `level` and above) are collected in `logs`. */
export function loggedApp(level = 'warn') {
  const logs: Array<Record<string, unknown>> = []
  const stream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split('\n')) if (line) logs.push(JSON.parse(line))
      done()
    },
  })
  return { app: Fastify({ logger: { level, stream } }), logs }
}

/** A handler answering `?status=` (default 200), so a test picks what a limited route returns. */
export async function answerStatus(request: FastifyRequest, reply: FastifyReply) {
  const status = Number((request.query as { status?: string }).status ?? 200)
  return reply.code(status).send({ ok: status < 400 })
}

/**
 * A suite on the test Redis (a Cluster under `npm run test:cluster`): its client, connected before
 * the suite; the apps it registers, closed after it; and its key prefixes, checked after it (every
 * key carries a TTL) and emptied.
 */
export function redisSuite() {
  const suite = {
    redis: null as unknown as RedisClient,
    apps: [] as FastifyInstance[],
    prefixes: [] as string[],
    /** A fresh key prefix, checked after the suite. */
    prefix(tag: string): string {
      const prefix = uniquePrefix(tag)
      suite.prefixes.push(prefix)
      return prefix
    },
  }
  before(async () => {
    suite.redis = createRedisClient(testRedisConnection())
    await connectRedis(suite.redis)
  })
  after(async () => {
    for (const app of suite.apps) await app.close()
    for (const prefix of suite.prefixes)
      assert.deepEqual(
        await keysWithoutTtl(suite.redis, prefix, { remove: true }),
        [],
        'every key carries a TTL',
      )
    suite.redis.disconnect()
  })
  return suite
}

/** Waits until `check` holds (a change another instance, a timer or a closed response makes), at most `ms`. */
export async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}
