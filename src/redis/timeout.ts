/**
 * `work`'s outcome if it settles within `ms`, else `onTimeout`'s: its value, or what it throws. A
 * promise cannot be cancelled, so `work` goes on; a failure of it after the timeout is handed to
 * `onLateFailure` (by default dropped: it was already answered for). The one timeout race of the
 * library: a Redis call bounded by a plugin, a boot wait, a cache load past its deadline.
 */
export function withTimeout<T, F = never>(
  work: PromiseLike<T>,
  ms: number,
  onTimeout: () => F,
  onLateFailure: (err: unknown) => void = () => {},
): Promise<T | F> {
  return new Promise<T | F>((resolve, reject) => {
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      try {
        resolve(onTimeout())
      } catch (err) {
        reject(err)
      }
    }, ms)
    work.then(
      (value) => {
        clearTimeout(timer)
        resolve(value)
      },
      (err: unknown) => {
        clearTimeout(timer)
        if (timedOut) onLateFailure(err)
        else reject(err)
      },
    )
  })
}
