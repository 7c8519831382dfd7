import assert from 'node:assert/strict'
import { test } from 'node:test'
import { Registry } from 'prom-client'
import { adoptMetric } from '../../src/plugins/common/metrics.ts'
import { TalliedHistogram } from '../../src/plugins/common/tallied-histogram.ts'

// The hot-path histogram: observed through a series looked up once, scraped as prom-client's own.

test('observations land in the first bucket they fit; the scrape is cumulative, with +Inf, sum and count', async () => {
  const registry = new Registry()
  const histogram = adoptMetric(registry, new TalliedHistogram('demo_seconds', 'A demo histogram', [0.1, 1]))
  const get = histogram.series({ route: '/a' })
  for (const value of [0.05, 0.1, 0.5, 7]) get.observe(value)
  assert.equal(histogram.series({ route: '/a' }), get)
  const text = await registry.metrics()
  assert.equal(
    text,
    [
      '# HELP demo_seconds A demo histogram',
      '# TYPE demo_seconds histogram',
      'demo_seconds_bucket{route="/a",le="0.1"} 2',
      'demo_seconds_bucket{route="/a",le="1"} 3',
      'demo_seconds_bucket{route="/a",le="+Inf"} 4',
      'demo_seconds_sum{route="/a"} 7.65',
      'demo_seconds_count{route="/a"} 4',
      '',
    ].join('\n'),
  )
})

test('each label set is its own series; reset zeroes them in place', async () => {
  const histogram = new TalliedHistogram('demo_bytes', 'Sizes', [10])
  const small = histogram.series({ kind: 'small' })
  const large = histogram.series({ kind: 'large' })
  small.observe(1)
  large.observe(100)
  large.observe(200)
  assert.deepEqual([small.count, small.sum, small.counts], [1, 1, [1]])
  assert.deepEqual([large.count, large.sum, large.counts], [2, 300, [0]])
  const { values } = await histogram.get()
  assert.equal(values.length, 2 * 4)
  histogram.reset()
  large.observe(5)
  assert.deepEqual([small.count, small.sum, small.counts], [0, 0, [0]])
  assert.deepEqual([large.count, large.sum, large.counts], [1, 5, [1]])
  const after = await histogram.get()
  const count = after.values.find((v) => v.metricName === 'demo_bytes_count' && v.labels.kind === 'large')
  assert.equal(count?.value, 1)
})
