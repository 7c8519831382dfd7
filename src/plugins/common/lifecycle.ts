import type { FastifyInstance } from 'fastify'
import { withTimeout } from '../../redis/timeout.ts'

// One lifecycle for every long-running part (a stream consumer, a delayed queue, a fan-out worker,
// an application's own workers): start, stop within a deadline, and a small status to read.

/** Where a part is: `stopped` also before its first start. */
export type LifecycleState = 'running' | 'stopping' | 'stopped'

export interface LifecycleHealth {
  state: LifecycleState
  /** The latest error of its background work (its `onError` saw it too), null when there was none. */
  lastError: { message: string; at: number } | null
  /** Work known to wait for it, where the part can tell without asking anyone. */
  backlog?: number
  /** How far behind it is in ms (the age of what it last took on), where the part can tell. */
  lagMs?: number
}

export interface StopOptions {
  /**
   * How long the stop may take. Past it the stop resolves with `stopped: false` and goes on in the
   * background (what it did not finish or hand back is taken over after its timeouts). Default: no limit.
   */
  deadlineMs?: number
}

export interface StopResult {
  /** True: the part has stopped. False: the deadline passed first. */
  stopped: boolean
}

/** A long-running part: started once the application is ready, stopped when it closes. */
export interface Lifecycle {
  /** Starts the background work; a second call while running does nothing. */
  start(): Promise<void>
  /** Stops the background work: what is in hand finishes, the rest is handed back. Never rejects. */
  stop(options?: StopOptions): Promise<StopResult>
  health(): LifecycleHealth
}

const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err))

/** A part's state and latest error, kept by the part; `health()` reads them. */
export class LifecycleStatus {
  state: LifecycleState = 'stopped'
  lastError: LifecycleHealth['lastError'] = null

  /** Records `err` as the latest error. */
  failed(err: unknown): void {
    this.lastError = { message: messageOf(err), at: Date.now() }
  }

  /** Its health; with `parts` (the parts it runs), the latest error of itself or any of them. */
  health(
    figures: Pick<LifecycleHealth, 'backlog' | 'lagMs'> = {},
    parts: readonly Lifecycle[] = [],
  ): LifecycleHealth {
    let lastError = this.lastError
    for (const part of parts) {
      const error = part.health().lastError
      if (error && (!lastError || error.at > lastError.at)) lastError = error
    }
    return { state: this.state, lastError, ...figures }
  }

  /**
   * Runs `stopping` (started by the caller) to its end or to the deadline: the state is `stopping`
   * until it ends, then `stopped` (unless the part was started again meanwhile). A failure of it is
   * recorded and counts as stopped: the part's work is over, what it could not hand back comes back
   * after its timeouts.
   */
  async stopWithin(stopping: Promise<unknown>, options: StopOptions = {}): Promise<StopResult> {
    this.state = 'stopping'
    const done = stopping.then(
      () => {},
      (err) => this.failed(err),
    )
    void done.then(() => {
      if (this.state === 'stopping') this.state = 'stopped'
    })
    const { deadlineMs } = options
    if (deadlineMs === undefined) {
      await done
      return { stopped: true }
    }
    return withTimeout(
      done.then(() => ({ stopped: true })),
      deadlineMs,
      () => ({ stopped: false }),
    )
  }
}

export interface CloseWithOptions extends StopOptions {
  /** Named in the warning when the deadline passes. */
  name: string
  /** Also start the part once the application is ready (default false: the caller starts it). */
  start?: boolean
  /**
   * The hook that stops it: `onClose` (default, after the server stopped taking requests) or
   * `preClose` (before, for parts that hold responses open, such as event streams).
   */
  hook?: 'onClose' | 'preClose'
}

/**
 * Ties a part to the application: stopped when it closes (within `deadlineMs`; a part not stopped
 * by then is logged and left to finish in the background), and with `start`, started once it is
 * ready (a start that fails is logged; the part retries on its own where it can).
 */
export function closeWith(app: FastifyInstance, part: Lifecycle, options: CloseWithOptions): void {
  const { name, deadlineMs, start = false, hook = 'onClose' } = options
  if (start)
    app.addHook('onReady', async () => {
      await part.start().catch((err) => app.log.warn({ err, part: name }, 'could not start'))
    })
  app.addHook(hook, async () => {
    const { stopped } = await part.stop({ deadlineMs })
    if (!stopped) app.log.warn({ part: name, deadlineMs }, 'not stopped within its deadline: left to finish')
  })
}
