// The demo's trace export (docs/observability.md#exporting-the-demos-traces), opt-in by the standard
// variables: with neither OTEL_EXPORTER_OTLP_ENDPOINT nor OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set,
// nothing of the SDK, the exporter or @fastify/otel is imported, so a plain `npm start` neither loads
// nor pays for them. Importing them here, inside main(), is early enough: @fastify/otel's
// registerOnInitialization hooks each Fastify instance through the `fastify.initialization`
// diagnostics channel when the instance is created (in buildApp), not when fastify is imported.

/** Starts exporting traces over OTLP/HTTP if the endpoint is configured; resolves to its flush-and-stop, else null. */
export async function startTracing(): Promise<(() => Promise<void>) | null> {
  const env = process.env
  if (!env.OTEL_EXPORTER_OTLP_ENDPOINT && !env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return null

  const [
    { FastifyOtelInstrumentation },
    { OTLPTraceExporter },
    resources,
    { BatchSpanProcessor },
    { NodeTracerProvider },
  ] = await Promise.all([
    import('@fastify/otel'),
    import('@opentelemetry/exporter-trace-otlp-http'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/sdk-trace-base'),
    import('@opentelemetry/sdk-trace-node'),
  ])

  // The SDK's own attributes, our default name, then OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
  // over both (the SDK's env detector): the standard variables win.
  const resource = resources
    .defaultResource()
    .merge(resources.resourceFromAttributes({ 'service.name': 'fastify-redis-gateway-demo' }))
    .merge(resources.detectResources({ detectors: [resources.envDetector] }))

  // The exporter reads the endpoint, headers, timeout and compression from the OTEL_EXPORTER_OTLP_*
  // variables, and the batch processor its delay and sizes from OTEL_BSP_*: no options of ours.
  const provider = new NodeTracerProvider({
    resource,
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
  })
  // Global tracer provider, AsyncLocalStorage context and W3C trace-context propagation.
  provider.register()
  new FastifyOtelInstrumentation({ registerOnInitialization: true }).setTracerProvider(provider)

  // Exports the spans still batched (those of the shutdown too), then stops the exporter.
  return () => provider.shutdown()
}
