import { readFileSync } from 'node:fs'

// The key patterns of docs/demo/redis-keys.md whose bound is not a TTL (a cap, or a fixed number per
// deployment or instance), so that the soak accepts those keys without a TTL and no others.
// test/demo/redis-keys-bounded.test.ts reads the same table.

const DOCS = new URL('../../docs/demo/redis-keys.md', import.meta.url)

/** Regexes of the documented patterns whose keys may have no TTL (`*` stands for any part). */
export function keysBoundWithoutTtl(): RegExp[] {
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
  const patterns: RegExp[] = []
  for (const line of lines.slice(header + 2)) {
    if (!line.startsWith('|')) break
    const row = cells(line)
    if (!/^(cap|one per deployment|one per instance)\b/i.test(row[boundAt] ?? '')) continue
    for (const [, pattern] of row[0]!.matchAll(/`([^`]+)`/g)) {
      const source = pattern!
        .split('*')
        .map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))
        .join('.+')
      patterns.push(new RegExp(`^${source}$`))
    }
  }
  if (!patterns.length) throw new Error('docs/demo/redis-keys.md lists no key bound otherwise than by a TTL')
  return patterns
}
