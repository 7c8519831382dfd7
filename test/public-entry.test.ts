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

test('each primitive subpath of package.json is a module of src/primitives whose named exports the root re-exports', async () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
    exports: Record<string, { default?: string }>
  }
  const primitives = Object.entries(pkg.exports).flatMap(([subpath, target]) => {
    const file = /^\.\/dist\/primitives\/(.+)\.js$/.exec(target.default ?? '')?.[1]
    return file ? [[subpath, file] as const] : []
  })
  assert.deepEqual(primitives.map(([subpath]) => subpath).sort(), [
    './bloom',
    './delayed-queue',
    './feed',
    './leaderboard',
    './lock',
    './sharded-counter',
    './stream-consumer',
  ])
  for (const [subpath, file] of primitives) {
    const module = (await import(`../src/primitives/${file}.ts`)) as Record<string, unknown>
    const missing = Object.keys(module).filter(
      (name) => (root as Record<string, unknown>)[name] !== module[name],
    )
    assert.deepEqual(missing, [], `${subpath}: not re-exported by the root`)
  }
  assert.equal(typeof root.createBloomFilter, 'function')
})
