import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
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

test('each primitive is a subpath of the package and a named export of the root', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
  const primitives: Array<[string, unknown]> = [
    ['lock', root.createLock],
    ['delayed-queue', root.createDelayedQueue],
    ['stream-consumer', root.createStreamConsumer],
    ['sharded-counter', root.createShardedCounter],
    ['leaderboard', root.createLeaderboard],
    ['feed', root.createFeed],
  ]
  for (const [name, create] of primitives) {
    assert.equal(typeof create, 'function', name)
    assert.deepEqual(pkg.exports[`./${name}`], {
      types: `./dist/primitives/${name}.d.ts`,
      default: `./dist/primitives/${name}.js`,
    })
  }
})
