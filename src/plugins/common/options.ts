import { InvalidOptionError, UnknownOptionError } from './errors.ts'

// One option checker for every plugin and primitive: a wrong value and an unknown key both fail at
// registration (or at the call that took them), naming the owner, the option and what is expected.
// An unknown key is never ignored: a misspelt `algoritm:` or another library's `max:` would
// otherwise switch a guarantee off in silence.

/**
 * Every key of an options type, listed once: `optionKeys<MyOptions>({ a: true, b: true })`. Typed
 * so that an option added to the interface and not listed here fails to compile.
 */
export function optionKeys<T>(keys: { [K in keyof Required<T>]: true }): readonly string[] {
  return Object.keys(keys)
}

/** Names other libraries use for an option, mapped to what to write here instead. */
export type OptionHints = Readonly<Record<string, string>>

export interface OptionChecker {
  /** Throws an InvalidOptionError `<owner>: <message>`. */
  fail(message: string): never
  /**
   * Throws an UnknownOptionError for the first key of `value` not in `known`, listing the valid
   * keys, with a "did you mean" for a close spelling and the hint for another library's name.
   * `where` names the object inside the owner's options (`policy 'ip'`, `route GET /x: config.cache`).
   */
  known(value: object, known: readonly string[], where?: string): void
}

export function optionChecker(owner: string, hints: OptionHints = {}): OptionChecker {
  const fail = (message: string): never => {
    throw new InvalidOptionError(`${owner}: ${message}`)
  }
  return {
    fail,
    known(value, known, where) {
      for (const key of Object.keys(value)) {
        if (known.includes(key)) continue
        const at = where ? `${where}: ` : ''
        const hint = Object.hasOwn(hints, key) ? hints[key] : undefined
        const suggestion = hint ? undefined : closest(key, known)
        const advice = hint ? ` ${hint}.` : suggestion ? ` Did you mean \`${suggestion}\`?` : ''
        throw new UnknownOptionError(
          `${owner}: ${at}unknown option \`${key}\`.${advice} Valid options: ${known.join(', ')}.`,
          key,
          known,
        )
      }
    },
  }
}

/** The known name closest to `key` (case ignored) within a third of its length, if any. */
export function closest(key: string, known: readonly string[]): string | undefined {
  const wanted = key.toLowerCase()
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
