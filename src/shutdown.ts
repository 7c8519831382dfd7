import type { IncomingMessage, ServerResponse } from 'node:http'
import type { FastifyInstance } from 'fastify'

/** A second SIGTERM/SIGINT during a shutdown exits at once with this code. */
export const SECOND_SIGNAL_EXIT_CODE = 130
/**
 * A signal this soon after the first is the same stop delivered twice, not a second request: a signal
 * sent to the whole process group (Ctrl-C, systemd's KillMode=control-group, `kill -TERM -PGID`)
 * reaches the gateway directly and again through npm, which relays it to its script.
 */
export const SAME_SIGNAL_WINDOW_MS = 1000
/** After the grace period, what background work and closing connections may still take before exit 1. */
export const CLOSE_MARGIN_MS = 5000

export interface ShutdownOptions {
  /** How long the instance keeps serving with GET /ready at 503 (SHUTDOWN_DRAIN). */
  drainMs: number
  /** How long requests already received get to finish once it stops accepting (SHUTDOWN_GRACE). */
  graceMs: number
  /** Closes the app (`app.close()`) and whatever the process started besides it. */
  stop: () => Promise<void>
}

/**
 * The gateway's shutdown on SIGTERM and SIGINT (docs/demo/operations.md):
 * 1. drain: GET /ready answers 503 at once; everything else is served as usual for `drainMs`;
 * 2. close: no new connections; requests already received are answered, each with `Connection: close`
 *    so its keep-alive connection ends after it; SSE streams end (preClose); requests still running
 *    after `graceMs` are cut (their sockets destroyed; the idempotency plugin releases their claims);
 * 3. stop: the app's onClose hooks stop the workers (each tied to the app with `closeWith`: current
 *    item finished or handed back; no deadline of their own, so nothing is left for a timeout), then close Redis and
 *    Postgres; exit 0. A second signal exits at once (130), unless it comes within
 *    SAME_SIGNAL_WINDOW_MS of the first (ignored); hanging past the grace period and CLOSE_MARGIN_MS
 *    exits 1.
 */
export function handleShutdownSignals(app: FastifyInstance, options: ShutdownOptions): void {
  // Responses in progress: once closing, each gets `Connection: close` so its keep-alive connection
  // ends after it (Fastify does the same for requests arriving from then on).
  const responses = new Set<ServerResponse>()
  let closing = false
  app.server.on('request', (_request: IncomingMessage, response: ServerResponse) => {
    if (closing && !response.headersSent) response.setHeader('connection', 'close')
    responses.add(response)
    response.once('close', () => {
      responses.delete(response)
      // A connection left idle by a response that ended while closing (an SSE stream) closes now.
      if (closing) app.server.closeIdleConnections()
    })
  })

  let firstSignalAt: number | null = null
  const drainAndStop = async (signal: NodeJS.Signals) => {
    const { drainMs, graceMs } = options
    app.lifecycle.draining = true
    app.log.info({ signal, drainMs, graceMs }, 'shutting down: draining, GET /ready answers 503')
    await new Promise((resolve) => setTimeout(resolve, drainMs))
    app.log.info('shutting down: closing, no new connections')
    closing = true
    for (const response of responses) if (!response.headersSent) response.setHeader('connection', 'close')
    const cut = setTimeout(() => {
      app.log.warn({ requests: responses.size }, 'shutting down: grace period over, cutting requests')
      app.server.closeAllConnections()
    }, graceMs)
    setTimeout(() => {
      app.log.error('shutting down: not closed in time, exiting')
      process.exit(1)
    }, graceMs + CLOSE_MARGIN_MS).unref()
    await options.stop()
    clearTimeout(cut)
    app.log.info('shut down')
    process.exit(0)
  }
  const onSignal = (signal: NodeJS.Signals) => {
    const now = performance.now()
    if (firstSignalAt !== null) {
      if (now - firstSignalAt < SAME_SIGNAL_WINDOW_MS) {
        app.log.info({ signal }, 'signal repeated within a second: the same shutdown, ignored')
        return
      }
      app.log.warn({ signal }, 'second signal: exiting at once')
      process.exit(SECOND_SIGNAL_EXIT_CODE)
    }
    firstSignalAt = now
    void drainAndStop(signal)
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)
}
