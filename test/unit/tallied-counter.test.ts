import assert from 'node:assert/strict'
import { test } from 'node:test'
import { Registry } from 'prom-client'
import { talliedCounter } from '../../src/plugins/common/tallied-counter.ts'

const create = () => {
  const counter = talliedCounter({ name: 'things_total', help: 'things', labelNames: ['kind'] as const })
  const registry = new Registry()
  registry.registerMetric(counter)
  return { counter, registry }
}

test('tallied counts reach the registry at a scrape, each label value on its own series', async () => {
  const { counter, registry } = create()
  for (let i = 0; i < 3; i++) counter.inc({ kind: 'a' })
  counter.inc({ kind: 'b' })
  counter.inc({ kind: 'a' }, 2)
  counter.inc({ kind: 'b' })
  const text = await registry.metrics()
  assert.match(text, /^things_total\{kind="a"\} 5$/m)
  assert.match(text, /^things_total\{kind="b"\} 2$/m)
  // Counted once: a second scrape with nothing new shows the same totals.
  counter.inc({ kind: 'b' })
  const again = await registry.metrics()
  assert.match(again, /^things_total\{kind="a"\} 5$/m)
  assert.match(again, /^things_total\{kind="b"\} 3$/m)
})

test('get() collects the tallies too; reset() drops what was tallied and not yet collected', async () => {
  const { counter } = create()
  counter.inc({ kind: 'a' })
  assert.deepEqual(
    (await counter.get()).values.map((v) => [v.labels.kind, v.value]),
    [['a', 1]],
  )
  counter.inc({ kind: 'a' })
  counter.reset()
  counter.inc({ kind: 'c' })
  assert.deepEqual(
    (await counter.get()).values.map((v) => [v.labels.kind, v.value]),
    [['c', 1]],
  )
})

test('a wrong label is refused as prom-client refuses it', () => {
  const { counter } = create()
  assert.throws(() => counter.inc({ other: 'x' } as never), /label/i)
})
