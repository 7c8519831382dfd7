// The "did you mean" of an unknown option: the known name closest to what was written.

/**
 * The known name closest to `key` (case ignored) within a third of its length, if any. A name that
 * is `key` with its unit (`l1Ttl` for `l1TtlMs`) is the answer however short `key` is.
 */
export function closest(key: string, known: readonly string[]): string | undefined {
  const wanted = key.toLowerCase()
  const withUnit = known.find((name) => name.toLowerCase() === `${wanted}ms`)
  if (withUnit) return withUnit
  let best: string | undefined
  let bestDistance = Math.max(1, Math.floor(key.length / 3)) + 1
  for (const name of known) {
    const distance = editDistance(wanted, name.toLowerCase())
    if (distance < bestDistance) {
      best = name
      bestDistance = distance
    }
  }
  return best
}

/** Levenshtein distance, with a swap of two neighbours counted as one edit. */
function editDistance(a: string, b: string): number {
  const rows: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i])
  for (let j = 1; j <= b.length; j++) rows[0]![j] = j
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      let d = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        d = Math.min(d, rows[i - 2]![j - 2]! + 1)
      rows[i]![j] = d
    }
  }
  return rows[a.length]![b.length]!
}
