import assert from 'node:assert/strict'
import { tracingChannel } from 'node:diagnostics_channel'
import { createRequire } from 'node:module'
import { after, type TestContext, test } from 'node:test'
import { context, type Span, SpanKind, trace } from '@opentelemetry/api'
import { IORedisInstrumentation } from '@opentelemetry/instrumentation-ioredis'
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base'
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node'
import { Redis } from 'ioredis'
import { ioredisRequestHook } from '../../../src/index.ts'
import { bridgeOpenTelemetry } from '../../../src/plugins/common/otel.ts'
import { createLock } from '../../../src/primitives/lock.ts'
import { uniquePrefix } from '../../helpers/index.ts'

// Redis spans made by a Redis instrumentation carry the name of the script they run
// (`db.stored_procedure.name`, the OpenTelemetry Redis conventions): with
// @opentelemetry/instrumentation-ioredis and `ioredisRequestHook`, and with a tracer built on
// ioredis's own `ioredis:command` tracing channel. The request's span never gets one.

const exporter = new InMemorySpanExporter()
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] })
provider.register()
const tracer = trace.getTracer('test')
const prefix = uniquePrefix('redis-spans')
after(() => provider.shutdown())

/** The spans exported for the commands `run` sends inside a parent span, the parent's included. */
async function spansOf(run: () => Promise<unknown>) {
  exporter.reset()
  await tracer.startActiveSpan('parent', async (parent) => {
    await run()
    parent.end()
  })
  return exporter.getFinishedSpans()
}

/**
 * A GET and a script call (one EVALSHA: the script is loaded first) inside a parent span: the
 * script's span is named `lockHolder`; the GET's and the parent's carry no script name.
 */
async function assertScriptSpanNamed(t: TestContext): Promise<void> {
  const client = new Redis()
  t.after(() => client.quit())
  const lock = createLock(client, { keyPrefix: prefix })
  await lock.holder('warm')
  const spans = await spansOf(async () => {
    await client.get(`${prefix}k`)
    await lock.holder('a')
  })
  const evalsha = spans.filter((s) => s.name === 'evalsha')
  assert.equal(evalsha.length, 1, spans.map((s) => s.name).join(', '))
  assert.equal(evalsha[0]!.attributes['db.stored_procedure.name'], 'lockHolder')
  const get = spans.find((s) => s.name === 'get')
  assert.ok(get, 'the GET has its span')
  assert.equal(get.attributes['db.stored_procedure.name'], undefined)
  assert.equal(spans.find((s) => s.name === 'parent')!.attributes['db.stored_procedure.name'], undefined)
}

test('a tracer on the ioredis:command channel: the bridge names the script on the span it made active', async (t) => {
  // What an APM agent built on the channel does: a client span per command, active while the
  // command's `start` is published (bindStore on OpenTelemetry's own AsyncLocalStorage).
  const manager = (
    context as unknown as { _getContextManager(): { _asyncLocalStorage: never } }
  )._getContextManager()
  const commands = tracingChannel<object, { command: string; span?: Span }>('ioredis:command')
  commands.start.bindStore(manager._asyncLocalStorage, (message) => {
    const span = tracer.startSpan(message.command, {
      kind: SpanKind.CLIENT,
      attributes: { 'db.system.name': 'redis' },
    })
    message.span = span
    return trace.setSpan(context.active(), span) as never
  })
  const end = (message: unknown) => (message as { span?: Span }).span?.end()
  commands.asyncEnd.subscribe(end)
  commands.error.subscribe(end)
  t.after(() => {
    commands.asyncEnd.unsubscribe(end)
    commands.error.unsubscribe(end)
    commands.start.unbindStore(manager._asyncLocalStorage)
  })
  // The tracer was there first, as it is when the SDK starts before the app (the bridge looks
  // once per process: this test runs first).
  assert.equal(await bridgeOpenTelemetry(), true)
  await assertScriptSpanNamed(t)
})

test('@opentelemetry/instrumentation-ioredis with ioredisRequestHook: the script span is named, GET is not', async (t) => {
  const instrumentation = new IORedisInstrumentation({ requestHook: ioredisRequestHook })
  instrumentation.setTracerProvider(provider)
  // ioredis is loaded already (an ESM import): patch the module the instrumentation would have hooked.
  const ioredis = createRequire(import.meta.url)('ioredis')
  for (const definition of instrumentation.getModuleDefinitions()) definition.patch?.(ioredis, '6.0.0')
  t.after(() => {
    for (const definition of instrumentation.getModuleDefinitions()) definition.unpatch?.(ioredis, '6.0.0')
  })
  await assertScriptSpanNamed(t)
})
