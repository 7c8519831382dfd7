import assert from 'node:assert/strict'
import { test } from 'node:test'
import * as root from '../src/index.ts'
import { cache, idempotency, keyBy, metrics, rateLimit, redis, session } from '../src/index.ts'

test('the public entry exports every plugin as a named Fastify plugin', () => {
  const plugins: Array<[unknown, string]> = [
    [cache, 'cache'],
    [idempotency, 'idempotency'],
    [metrics, 'metrics'],
    [rateLimit, 'rate-limit'],
    [redis, 'redis'],
    [session, 'session'],
  ]
  for (const [plugin, name] of plugins) {
    assert.equal(typeof plugin, 'function', name)
    assert.equal(
      (plugin as Record<symbol, { name?: string }>)[Symbol.for('plugin-meta')]?.name,
      `fastify-redis-gateway/${name}`,
    )
  }
  assert.equal(typeof keyBy.customer, 'function')
  // The demo's Postgres plugin is not part of the library.
  assert.equal('postgresPlugin' in root, false)
})
