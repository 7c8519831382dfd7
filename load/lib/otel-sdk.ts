// The OpenTelemetry SDK as a production service would run it, for the chain benchmark's
// "OpenTelemetry SDK on" contender: a tracer provider, @fastify/otel on every Fastify instance, a
// batch span processor, and an exporter that drops the spans (what it costs to make and hand them
// over, without a collector on the same two CPUs). Imported before the app is built.
import { FastifyOtelInstrumentation } from '@fastify/otel'
import { BatchSpanProcessor, type SpanExporter } from '@opentelemetry/sdk-trace-base'
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node'

const dropping: SpanExporter = {
  export: (_spans, done) => done({ code: 0 }),
  shutdown: async () => {},
}
const provider = new NodeTracerProvider({ spanProcessors: [new BatchSpanProcessor(dropping)] })
provider.register()
new FastifyOtelInstrumentation({ registerOnInitialization: true }).setTracerProvider(provider)
