// The Bloom filter's benchmark: `npm run bench:bloom [-- --items N] [-- --quick]` (docs/bloom.md).
// On a private redis-server (pinned apart from this process, as load/run.ts places things), per
// configuration: N ids added in batches of 1000 (4 batches in flight), the N ids checked again
// (each must answer "maybe": a false negative fails the run), N absent ids checked (the measured
// false-positive rate), MEMORY USAGE of every key, and a rebuild of the N ids from an async
// generator. Then single-item checks from 64 concurrent callers, and what one negative-cache key
// per absent id would cost instead. Default N = 1,000,000 (--quick: 100,000). Writes
// load/results/bloom.{json,md}; any other N is a smoke run, written to load/results/quick/.
import { parseArgs } from 'node:util'
import { Redis } from 'ioredis'
import { startRedisServer } from '../src/embedded/redis-server.ts'
import { type BloomFilter, createBloomFilter } from '../src/index.ts'
import { redisCpuSeconds } from './lib/cpu-time.ts'
import { pinLoadGenerator, pinUnderTest, placement } from './lib/cpus.ts'
import { writeResults } from './lib/runner.ts'

const { values } = parseArgs({
  options: { items: { type: 'string' }, quick: { type: 'boolean', default: false } },
})
const FULL_ITEMS = 1_000_000
const N = Number(values.items ?? (values.quick ? 100_000 : FULL_ITEMS))
if (!Number.isSafeInteger(N) || N < 10_000) throw new Error('--items must be an integer of 10,000 or more')
const BATCH = 1000
const IN_FLIGHT = 4

const CONFIGS = [
  { label: 'p = 10 %', falsePositiveRate: 0.1 },
  { label: 'p = 1 %', falsePositiveRate: 0.01 },
  { label: 'p = 0.1 %', falsePositiveRate: 0.001 },
  { label: 'p = 1 %, 4 Mibit per key', falsePositiveRate: 0.01, maxBitsPerShard: 2 ** 22 },
]

pinLoadGenerator()
const server = await startRedisServer()
const redis = new Redis(server.url)

/** Microseconds Redis spent per EVALSHA since the last reset (the time one batch holds Redis). */
async function perScriptCall(): Promise<{ calls: number; usecPerCall: number }> {
  const stats = await redis.info('commandstats')
  const match = /cmdstat_evalsha:calls=(\d+),usec=(\d+),usec_per_call=([0-9.]+)/.exec(stats)
  return { calls: Number(match?.[1] ?? 0), usecPerCall: Number(match?.[3] ?? 0) }
}

const ids = (label: string, from: number, count: number) =>
  Array.from({ length: count }, (_, i) => `${label}:${from + i}`)

interface Phase {
  perSecond: number
  redisCpuMicrosPerItem: number
  /** Redis time per script call (one batch on one shard), µs. */
  scriptMicros: number
}

/** `call` over `total` items of `label` in batches of BATCH, IN_FLIGHT batches at a time. */
async function phase<T>(
  label: string,
  total: number,
  call: (batch: string[]) => Promise<T[]>,
  each: (answer: T) => void,
): Promise<Phase> {
  await redis.config('RESETSTAT')
  const cpuBefore = await redisCpuSeconds(redis)
  const started = performance.now()
  for (let at = 0; at < total; at += BATCH * IN_FLIGHT) {
    const batches = []
    for (let b = at; b < Math.min(total, at + BATCH * IN_FLIGHT); b += BATCH)
      batches.push(call(ids(label, b, Math.min(BATCH, total - b))))
    for (const answers of await Promise.all(batches)) for (const answer of answers) each(answer)
  }
  const seconds = (performance.now() - started) / 1000
  const cpu = (await redisCpuSeconds(redis)) - cpuBefore
  return {
    perSecond: total / seconds,
    redisCpuMicrosPerItem: (cpu * 1e6) / total,
    scriptMicros: (await perScriptCall()).usecPerCall,
  }
}

async function measure(config: (typeof CONFIGS)[number], n: number) {
  const { label: _, ...options } = config
  const bloom: BloomFilter = createBloomFilter(redis, {
    key: `bench:bloom:${config.falsePositiveRate}:${config.maxBitsPerShard ?? 'default'}`,
    expectedItems: n,
    ...options,
  })
  await bloom.destroy()
  await bloom.rebuild([])
  let newOnes = 0
  const add = await phase(
    'user',
    n,
    (batch) => bloom.add(batch),
    (isNew) => void (isNew && newOnes++),
  )
  let falseNegatives = 0
  const present = await phase(
    'user',
    n,
    (batch) => bloom.mightContain(batch),
    (maybe) => void (maybe || falseNegatives++),
  )
  if (falseNegatives > 0) throw new Error(`${config.label}: ${falseNegatives} false negatives`)
  let falsePositives = 0
  const absent = await phase(
    'nobody',
    n,
    (batch) => bloom.mightContain(batch),
    (maybe) => void (maybe && falsePositives++),
  )
  let memory = 0
  let strings = 0
  for (let shard = 0; shard < bloom.shards; shard++) {
    const { bits, rebuild } = bloom.keys(shard)
    memory += Number(await redis.call('MEMORY', 'USAGE', bits, 'SAMPLES', '0'))
    memory += Number(await redis.call('MEMORY', 'USAGE', rebuild, 'SAMPLES', '0'))
    strings += await redis.strlen(bits)
  }
  // A rebuild of the same ids from an async generator (a database cursor's shape).
  async function* source() {
    for (let i = 0; i < n; i++) yield `user:${i}`
  }
  const rebuildStarted = performance.now()
  await bloom.rebuild(source())
  const rebuildPerSecond = n / ((performance.now() - rebuildStarted) / 1000)
  let afterRebuild = 0
  await phase(
    'user',
    n,
    (batch) => bloom.mightContain(batch),
    (maybe) => void (maybe || afterRebuild++),
  )
  if (afterRebuild > 0) throw new Error(`${config.label}: ${afterRebuild} false negatives after the rebuild`)
  const result = {
    config: config.label,
    expectedItems: n,
    falsePositiveRate: config.falsePositiveRate,
    hashes: bloom.hashes,
    shards: bloom.shards,
    bits: bloom.bits,
    bitsPerItem: bloom.bits / n,
    bytes: bloom.bytes,
    stringBytes: strings,
    memoryUsageBytes: memory,
    measuredFalsePositiveRate: falsePositives / n,
    addsReportedNew: newOnes,
    add,
    checkPresent: present,
    checkAbsent: absent,
    rebuildPerSecond,
  }
  console.error(
    `  ${config.label}: k=${result.hashes}, ${result.shards} shard(s), ${fmt(memory)} bytes, ` +
      `false positives ${(100 * result.measuredFalsePositiveRate).toFixed(3)} %, ` +
      `adds ${fmt(add.perSecond)}/s, checks ${fmt(present.perSecond)}/s present, ${fmt(absent.perSecond)}/s absent, ` +
      `rebuild ${fmt(rebuildPerSecond)}/s`,
  )
  await bloom.destroy()
  return result
}

/** Single-item `mightContain` from 64 concurrent callers (a gateway's requests, one id each). */
async function singles(n: number) {
  const bloom = createBloomFilter(redis, {
    key: 'bench:bloom:singles',
    expectedItems: n,
    falsePositiveRate: 0.01,
  })
  await bloom.rebuild(
    (async function* () {
      for (let i = 0; i < n; i++) yield `user:${i}`
    })(),
  )
  const total = Math.min(n, 200_000)
  const drive = async (one: (i: number) => Promise<unknown>) => {
    let next = 0
    const cpuBefore = await redisCpuSeconds(redis)
    const started = performance.now()
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (next < total) await one(next++)
      }),
    )
    const seconds = (performance.now() - started) / 1000
    return {
      perSecond: total / seconds,
      redisCpuMicros: (((await redisCpuSeconds(redis)) - cpuBefore) * 1e6) / total,
    }
  }
  // Half present, half absent; then, for scale, a GET of one small key the same way.
  const checks = await drive((i) => bloom.mightContain(i % 2 === 0 ? `user:${i}` : `nobody:${i}`))
  await redis.set('bench:one', 'x')
  const gets = await drive(() => redis.get('bench:one'))
  await bloom.destroy()
  return { checks: total, ...checks, get: gets }
}

/** used_memory per key of one negative-cache key per absent id (`SET miss:<id> 1 EX 3600`). */
async function negativeCache() {
  const keys = 100_000
  const used = async () => Number(/used_memory:(\d+)/.exec(await redis.info('memory'))?.[1])
  const before = await used()
  for (let at = 0; at < keys; at += 10_000) {
    const pipeline = redis.pipeline()
    for (let i = at; i < at + 10_000; i++) pipeline.set(`miss:user:${1_000_000_000 + i}`, '1', 'EX', 3600)
    await pipeline.exec()
  }
  const perKey = ((await used()) - before) / keys
  await redis.flushall()
  return { keys, bytesPerKey: perKey }
}

const fmt = (n: number, digits = 0) =>
  n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })

try {
  pinUnderTest(Number(/process_id:(\d+)/.exec(await redis.info('server'))?.[1]))
  console.error(`Bloom filter, ${fmt(N)} ids per configuration; ${placement()}`)
  const results = []
  for (const config of CONFIGS) results.push(await measure(config, N))
  const single = await singles(N)
  const negative = await negativeCache()

  const rows = results.map(
    (r) =>
      `| ${r.config} | ${r.hashes} | ${r.shards} | ${fmt(r.bitsPerItem, 2)} | ${fmt(r.memoryUsageBytes)} | ` +
      `${fmt(100 * r.measuredFalsePositiveRate, 3)} % | ${fmt(r.add.perSecond)} | ${fmt(r.checkPresent.perSecond)} | ` +
      `${fmt(r.checkAbsent.perSecond)} | ${fmt(r.add.redisCpuMicrosPerItem, 2)} / ${fmt(r.checkPresent.redisCpuMicrosPerItem, 2)} / ${fmt(r.checkAbsent.redisCpuMicrosPerItem, 2)} | ` +
      `${fmt(r.add.scriptMicros)} / ${fmt(r.checkPresent.scriptMicros)} / ${fmt(r.checkAbsent.scriptMicros)} | ${fmt(r.rebuildPerSecond)} |`,
  )
  const markdown = [
    `${fmt(N)} ids added, then checked again, then ${fmt(N)} absent ids checked, per configuration; batches of ${BATCH}, ${IN_FLIGHT} in flight.`,
    '',
    '| configuration | k | shards | bits per id | MEMORY USAGE (bytes) | measured false positives | adds/s | checks/s (present) | checks/s (absent) | Redis CPU µs per id: add / present / absent | Redis µs per script call: add / present / absent | rebuild ids/s |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...rows,
    '',
    `Single-item \`mightContain\`, 64 concurrent callers, half present: ${fmt(single.perSecond)} checks/s, ` +
      `${fmt(single.redisCpuMicros, 1)} µs Redis CPU per check (a GET of one small key the same way: ` +
      `${fmt(single.get.perSecond)}/s, ${fmt(single.get.redisCpuMicros, 1)} µs).`,
    '',
    `One negative-cache key per absent id instead (\`SET miss:user:<id> 1 EX 3600\`): ${fmt(negative.bytesPerKey, 1)} bytes of used_memory per key.`,
    '',
    `Placement: ${placement()}.`,
  ].join('\n')
  const paths = writeResults(
    'bloom',
    { items: N, batch: BATCH, inFlight: IN_FLIGHT, results, single, negative },
    `## Bloom filter\n\n${markdown}`,
    { quick: N !== FULL_ITEMS },
  )
  console.log(`${markdown}\n\n(${paths.md})`)
} finally {
  redis.disconnect()
  await server.stop()
}
