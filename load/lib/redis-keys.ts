import { readFileSync } from 'node:fs'

// The key patterns of docs/demo/redis-keys.md and their bounds, read from its table once for the
// soak (which accepts keys without a TTL only where the bound says so) and for
// test/demo/redis-keys-bounded.test.ts.

const DOCS = new URL('../../docs/demo/redis-keys.md', import.meta.url)

export interface DocumentedKey {
  pattern: string
  regex: RegExp
  bound: string
  /** True when the key has no TTL of its own: capped, or a fixed number per deployment or instance. */
  withoutTtl: boolean
}

/** The rows of docs/demo/redis-keys.md's table: the patterns of the first column and the bound column. */
export function documentedKeys(): DocumentedKey[] {
  const lines = readFileSync(DOCS, 'utf8').split('\n')
  const cells = (line: string) =>
    line
      .replace(/^\s*\|/, '')
      .replace(/\|\s*$/, '')
      .split(/(?<!\\)\|/)
      .map((cell) => cell.trim())
  const header = lines.findIndex((line) => line.startsWith('|') && /\|\s*bound\s*\|/.test(line))
  if (header < 0) throw new Error('docs/demo/redis-keys.md has no table with a `bound` column')
  const boundAt = cells(lines[header]!).indexOf('bound')
  const keys: DocumentedKey[] = []
  for (const line of lines.slice(header + 2)) {
    if (!line.startsWith('|')) break
    const row = cells(line)
    const bound = row[boundAt] ?? ''
    const withoutTtl = /^(cap|one per deployment|one per instance)\b/i.test(bound)
    for (const [, pattern] of row[0]!.matchAll(/`([^`]+)`/g)) {
      const source = pattern!
        .split('*')
        .map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))
        .join('.+')
      keys.push({ pattern: pattern!, regex: new RegExp(`^${source}$`), bound, withoutTtl })
    }
  }
  if (!keys.length) throw new Error('docs/demo/redis-keys.md lists no key pattern')
  return keys
}

/** Regexes of the documented patterns whose keys may have no TTL (`*` stands for any part). */
export function keysBoundWithoutTtl(): RegExp[] {
  return documentedKeys()
    .filter((key) => key.withoutTtl)
    .map((key) => key.regex)
}
