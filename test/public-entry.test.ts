import assert from 'node:assert/strict'
import { test } from 'node:test'
import {
  cachePlugin,
  idempotencyPlugin,
  keyBy,
  metricsPlugin,
  postgresPlugin,
  rateLimitPlugin,
  redisPlugin,
  sessionPlugin,
} from '../src/index.ts'

test('the public entry exports every plugin as a named Fastify plugin', () => {
  const plugins: Array<[unknown, string]> = [
    [cachePlugin, 'cache'],
    [idempotencyPlugin, 'idempotency'],
    [metricsPlugin, 'metrics'],
    [postgresPlugin, 'postgres'],
    [rateLimitPlugin, 'rate-limit'],
    [redisPlugin, 'redis'],
    [sessionPlugin, 'session'],
  ]
  for (const [plugin, name] of plugins) {
    assert.equal(typeof plugin, 'function', name)
    assert.equal((plugin as Record<symbol, { name?: string }>)[Symbol.for('plugin-meta')]?.name, name)
  }
  assert.equal(typeof keyBy.customer, 'function')
})
