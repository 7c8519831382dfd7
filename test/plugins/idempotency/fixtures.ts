// What several idempotency suites build alike.

/** A promise the test opens, so "still running" or "in flight" needs no timing. */
export function gate() {
  let open!: () => void
  const opened = new Promise<void>((resolve) => {
    open = resolve
  })
  return { open, opened }
}
