/**
 * `work`'s outcome if it settles within `ms`, else `onTimeout`'s: its value, or what it throws. A
 * promise cannot be cancelled, so `work` goes on; a failure of it after the timeout is handed to
 * `onLateFailure` (by default dropped: it was already answered for). The one timeout race of the
 * library: a Redis call bounded by a plugin, a boot wait, a cache load past its deadline.
 *
 * The verdict waits for the pending reads: Node runs due timers before it reads sockets, so after
 * the process was starved or blocked past `ms`, a reply already in its socket would lose to the
 * timer. The timer only schedules the verdict (`setImmediate`, after the reads); `work` settled by
 * then wins.
 */
export function withTimeout<T, F = never>(
  work: PromiseLike<T>,
  ms: number,
  onTimeout: () => F,
  onLateFailure: (err: unknown) => void = () => {},
): Promise<T | F> {
  return new Promise<T | F>((resolve, reject) => {
    let settled = false
    let timedOut = false
    const verdict = () => {
      if (settled) return
      timedOut = true
      try {
        resolve(onTimeout())
      } catch (err) {
        reject(err)
      }
    }
    const timer = setTimeout(() => setImmediate(verdict), ms)
    work.then(
      (value) => {
        settled = true
        clearTimeout(timer)
        resolve(value)
      },
      (err: unknown) => {
        settled = true
        clearTimeout(timer)
        if (timedOut) onLateFailure(err)
        else reject(err)
      },
    )
  })
}
